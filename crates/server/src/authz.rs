//! Who may do what: a TOML config, swapped atomically on reload.
//!
//! ```toml
//! # May create namespaces, advance epochs, and administer every namespace.
//! admins = ["spiffe://acme/ops/"]
//!
//! [[namespace]]
//! id = "orders"
//! # May create and update the namespace's classes.
//! admins = ["spiffe://acme/team-orders/lead"]
//!
//! [[namespace.grant]]
//! # May open sessions on these classes' locks: exact IDs, or path prefixes ending in `/`.
//! ids = ["spiffe://acme/billing/"]
//! classes = ["rows"]          # "*" for every class of the namespace
//! ```
//!
//! A pattern ending in `/` matches every ID that starts with it (a path prefix); any
//! other pattern matches exactly that ID. Unknown fields are refused, and so is a
//! namespace given two `[[namespace]]` tables (one would silently widen the other).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::Deserialize;

use palisade_api::SpiffeId;

/// The authorization config, as read from TOML.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthzConfig {
    /// Service-wide admins.
    #[serde(default)]
    pub admins: Vec<String>,
    /// Per-namespace rules.
    #[serde(default)]
    pub namespace: Vec<NamespaceRules>,
}

/// One namespace's rules.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceRules {
    /// The namespace.
    pub id: String,
    /// Admins of this namespace (classes).
    #[serde(default)]
    pub admins: Vec<String>,
    /// Lock grants.
    #[serde(default)]
    pub grant: Vec<Grant>,
}

/// Which identities may lock which classes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// Exact SPIFFE IDs, or path prefixes ending in `/`.
    pub ids: Vec<String>,
    /// Class names, or `"*"`.
    pub classes: Vec<String>,
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthzError {
    /// The file could not be read.
    #[error("cannot read authorization config {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown fields.
    #[error("malformed authorization config: {}", .0.message())]
    Parse(#[from] toml::de::Error),
    /// The file is malformed TOML, or a field is unknown, missing or of the wrong type.
    #[error("malformed authorization config {}, line {line}, column {column}: {message}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Where the error is: line, from 1.
        line: usize,
        /// Where the error is: column (characters), from 1.
        column: usize,
        /// What is wrong, naming the field if one is.
        message: String,
    },
    /// A pattern is not a SPIFFE ID (or a `spiffe://` path prefix).
    #[error("authorization config: {0:?} is not a SPIFFE ID or prefix")]
    BadPattern(String),
    /// A namespace id, or a class a grant names, is not a name the service accepts
    /// ([`palisade_api::validate_name`]; a grant's class may also be `"*"`): the rule
    /// could never apply.
    #[error("authorization config: {what} {name:?} is not [a-z0-9][a-z0-9_-]{{0,62}}, so no lock could ever match it")]
    BadName {
        /// `namespace id` or `class`.
        what: &'static str,
        /// The name as written.
        name: String,
    },
    /// A namespace id, or a class a grant names, in the file is not a name the service
    /// accepts.
    #[error("authorization config {}: {what} {name:?} is not [a-z0-9][a-z0-9_-]{{0,62}}, so no lock could ever match it", path.display())]
    BadNameIn {
        /// The file.
        path: PathBuf,
        /// `namespace id` or `class`.
        what: &'static str,
        /// The name as written.
        name: String,
    },
    /// Two `[[namespace]]` tables name the same namespace.
    #[error("authorization config: namespace {0:?} has two [[namespace]] tables; give each namespace one")]
    DuplicateNamespace(String),
    /// Two `[[namespace]]` tables in the file name the same namespace.
    #[error("authorization config {}: namespace {id:?} has two [[namespace]] tables; give each namespace one", path.display())]
    DuplicateNamespaceIn {
        /// The file.
        path: PathBuf,
        /// The namespace.
        id: String,
    },
    /// A pattern in the file is not a SPIFFE ID (or a `spiffe://` path prefix).
    #[error("authorization config {}: {pattern:?} is not a SPIFFE ID or prefix", path.display())]
    BadPatternIn {
        /// The file.
        path: PathBuf,
        /// The pattern.
        pattern: String,
    },
}

fn matches(pattern: &str, id: &SpiffeId) -> bool {
    if pattern.ends_with('/') {
        id.as_str().starts_with(pattern)
    } else {
        id.as_str() == pattern
    }
}

impl AuthzConfig {
    /// Parses TOML and checks every pattern.
    ///
    /// # Errors
    ///
    /// [`AuthzError::Parse`], [`AuthzError::BadPattern`], [`AuthzError::BadName`],
    /// [`AuthzError::DuplicateNamespace`].
    pub fn from_toml(text: &str) -> Result<Self, AuthzError> {
        let config: AuthzConfig = toml::from_str(text)?;
        for n in &config.namespace {
            if !palisade_api::is_name(&n.id) {
                return Err(AuthzError::BadName {
                    what: "namespace id",
                    name: n.id.clone(),
                });
            }
            let classes = n.grant.iter().flat_map(|g| g.classes.iter());
            if let Some(c) = classes
                .filter(|c| *c != "*")
                .find(|c| !palisade_api::is_name(c))
            {
                return Err(AuthzError::BadName {
                    what: "class",
                    name: c.clone(),
                });
            }
        }
        let mut ids = std::collections::HashSet::new();
        if let Some(twice) = config.namespace.iter().find(|n| !ids.insert(&n.id)) {
            return Err(AuthzError::DuplicateNamespace(twice.id.clone()));
        }
        let patterns = config
            .admins
            .iter()
            .chain(config.namespace.iter().flat_map(|n| {
                n.admins
                    .iter()
                    .chain(n.grant.iter().flat_map(|g| g.ids.iter()))
            }));
        for p in patterns {
            if SpiffeId::new(p.trim_end_matches('/')).is_err() {
                return Err(AuthzError::BadPattern(p.clone()));
            }
        }
        Ok(config)
    }

    /// Whether `id` is a service-wide admin.
    pub fn is_admin(&self, id: &SpiffeId) -> bool {
        self.admins.iter().any(|p| matches(p, id))
    }

    /// Whether `id` administers `ns` (service-wide admins do).
    pub fn is_ns_admin(&self, ns: &str, id: &SpiffeId) -> bool {
        self.is_admin(id)
            || self
                .namespace
                .iter()
                .filter(|n| n.id == ns)
                .any(|n| n.admins.iter().any(|p| matches(p, id)))
    }

    /// Whether `id` may lock keys of `class` in `ns`.
    pub fn may_lock(&self, ns: &str, class: &str, id: &SpiffeId) -> bool {
        self.namespace
            .iter()
            .filter(|n| n.id == ns)
            .flat_map(|n| n.grant.iter())
            .any(|g| {
                g.classes.iter().any(|c| c == "*" || c == class)
                    && g.ids.iter().any(|p| matches(p, id))
            })
    }

    /// Whether `id` may lock some class of `ns`, or administers it: who may open a
    /// session that counts against `ns`'s `held_lease_quota`.
    pub fn may_use_namespace(&self, ns: &str, id: &SpiffeId) -> bool {
        self.is_ns_admin(ns, id)
            || self
                .namespace
                .iter()
                .filter(|n| n.id == ns)
                .flat_map(|n| n.grant.iter())
                .any(|g| g.ids.iter().any(|p| matches(p, id)))
    }
}

/// The live config: read by every request, replaced whole by [`Authz::reload`].
#[derive(Debug, Clone)]
pub struct Authz {
    current: Arc<ArcSwap<AuthzConfig>>,
    path: Option<PathBuf>,
}

impl Authz {
    /// A fixed config (no file to reload from).
    pub fn fixed(config: AuthzConfig) -> Self {
        Authz {
            current: Arc::new(ArcSwap::from_pointee(config)),
            path: None,
        }
    }

    /// Loads the config from a TOML file; [`Authz::reload`] reads the file again.
    ///
    /// # Errors
    ///
    /// [`AuthzError`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self, AuthzError> {
        let path = path.as_ref().to_owned();
        let config = read(&path)?;
        Ok(Authz {
            current: Arc::new(ArcSwap::from_pointee(config)),
            path: Some(path),
        })
    }

    /// Reads the file again and swaps the new config in; on error the old config stays
    /// in force. A fixed config reloads as a no-op.
    ///
    /// # Errors
    ///
    /// [`AuthzError`].
    pub fn reload(&self) -> Result<(), AuthzError> {
        if let Some(path) = &self.path {
            let config = read(path)?;
            self.current.store(Arc::new(config));
            tracing::info!(path = %path.display(), "authorization config reloaded");
        }
        Ok(())
    }

    /// The config in force now.
    pub fn current(&self) -> Arc<AuthzConfig> {
        self.current.load_full()
    }
}

fn read(path: &Path) -> Result<AuthzConfig, AuthzError> {
    let text = std::fs::read_to_string(path).map_err(|source| AuthzError::Io {
        path: path.to_owned(),
        source,
    })?;
    AuthzConfig::from_toml(&text).map_err(|e| match e {
        AuthzError::Parse(e) => {
            let (line, column) = e
                .span()
                .map(|span| line_column(&text, span.start))
                .unwrap_or((1, 1));
            AuthzError::Malformed {
                path: path.to_owned(),
                line,
                column,
                message: e.message().trim_end().to_owned(),
            }
        }
        AuthzError::BadPattern(pattern) => AuthzError::BadPatternIn {
            path: path.to_owned(),
            pattern,
        },
        AuthzError::BadName { what, name } => AuthzError::BadNameIn {
            path: path.to_owned(),
            what,
            name,
        },
        AuthzError::DuplicateNamespace(id) => AuthzError::DuplicateNamespaceIn {
            path: path.to_owned(),
            id,
        },
        other => other,
    })
}

/// The line and column (both from 1, the column in characters) of byte `offset`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
admins = ["spiffe://acme/ops/"]
[[namespace]]
id = "orders"
admins = ["spiffe://acme/lead"]
[[namespace.grant]]
ids = ["spiffe://acme/billing/", "spiffe://acme/cron"]
classes = ["rows"]
"#;

    fn id(s: &str) -> SpiffeId {
        SpiffeId::new(s).unwrap()
    }

    #[test]
    fn exact_and_prefix_patterns() {
        let c = AuthzConfig::from_toml(CONFIG).unwrap();
        assert!(c.may_lock("orders", "rows", &id("spiffe://acme/billing/a")));
        assert!(c.may_lock("orders", "rows", &id("spiffe://acme/cron")));
        // Exact means exact; a prefix ends at a `/`.
        assert!(!c.may_lock("orders", "rows", &id("spiffe://acme/cron/x")));
        assert!(!c.may_lock("orders", "rows", &id("spiffe://acme/billingx")));
        assert!(!c.may_lock("orders", "other", &id("spiffe://acme/billing/a")));
        assert!(!c.may_lock("users", "rows", &id("spiffe://acme/billing/a")));
        assert!(c.is_ns_admin("orders", &id("spiffe://acme/lead")));
        assert!(!c.is_admin(&id("spiffe://acme/lead")));
        assert!(!c.is_ns_admin("users", &id("spiffe://acme/lead")));
        assert!(c.is_ns_admin("users", &id("spiffe://acme/ops/alice")));
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(matches!(
            AuthzConfig::from_toml("admin = []"),
            Err(AuthzError::Parse(_))
        ));
        assert!(matches!(
            AuthzConfig::from_toml("admins = [\"http://x\"]"),
            Err(AuthzError::BadPattern(_))
        ));
    }

    #[test]
    fn a_namespace_or_class_no_lock_could_match_is_refused_by_name() {
        for (toml, what, name) in [
            ("[[namespace]]\nid = \"Orders\"\n", "namespace id", "Orders"),
            ("[[namespace]]\nid = \"orders \"\n", "namespace id", "orders "),
            ("[[namespace]]\nid = \"\"\n", "namespace id", ""),
            (
                "[[namespace]]\nid = \"orders\"\n[[namespace.grant]]\nids = [\"spiffe://a/b\"]\nclasses = [\"*\", \"Rows\"]\n",
                "class",
                "Rows",
            ),
        ] {
            match AuthzConfig::from_toml(toml) {
                Err(AuthzError::BadName { what: w, name: n }) => {
                    assert_eq!((w, n.as_str()), (what, name), "{toml}");
                }
                other => panic!("{toml}: {other:?}"),
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("authz.toml");
        std::fs::write(&path, "[[namespace]]\nid = \"Orders\"\n").unwrap();
        let e = Authz::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("authz.toml") && e.contains("namespace id \"Orders\" is not"),
            "{e}"
        );
    }

    #[test]
    fn a_namespace_in_two_tables_is_refused_by_name_and_a_reload_keeps_the_old_config() {
        let twice =
            format!("{CONFIG}[[namespace]]\nid = \"users\"\n[[namespace]]\nid = \"orders\"\n");
        assert!(matches!(
            AuthzConfig::from_toml(&twice),
            Err(AuthzError::DuplicateNamespace(id)) if id == "orders"
        ));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("authz.toml");
        std::fs::write(&path, CONFIG).unwrap();
        let authz = Authz::load(&path).unwrap();
        std::fs::write(&path, &twice).unwrap();
        let e = authz.reload().unwrap_err().to_string();
        assert!(
            e.contains("authz.toml") && e.contains("\"orders\" has two [[namespace]] tables"),
            "{e}"
        );
        assert!(authz
            .current()
            .may_lock("orders", "rows", &id("spiffe://acme/cron")));
        assert_eq!(authz.current().namespace.len(), 1);
    }

    #[test]
    fn reload_swaps_and_keeps_the_old_config_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("authz.toml");
        std::fs::write(&path, "admins = [\"spiffe://a/x\"]").unwrap();
        let authz = Authz::load(&path).unwrap();
        assert!(authz.current().is_admin(&id("spiffe://a/x")));
        std::fs::write(&path, "admins = [\"spiffe://a/y\"]").unwrap();
        authz.reload().unwrap();
        assert!(!authz.current().is_admin(&id("spiffe://a/x")));
        assert!(authz.current().is_admin(&id("spiffe://a/y")));
        std::fs::write(&path, "admins = 3").unwrap();
        assert!(authz.reload().is_err());
        assert!(authz.current().is_admin(&id("spiffe://a/y")));
    }
}
