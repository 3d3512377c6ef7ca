//! How the command line names the etcd clusters a command talks to: `--etcd` (the home
//! tier), `--tier NAME=ENDPOINTS` (the others), and TLS to each (`--etcd-ca`,
//! `--etcd-cert`, `--etcd-key` for the home tier; `--tier-ca`, `--tier-cert`,
//! `--tier-key NAME=FILE` for a tier). Everything is checked before anything connects.
//!
//! Rules: a cluster with a CA speaks TLS and none of its endpoints is `http://`; a
//! cluster without one speaks plain HTTP and none is `https://` (an endpoint without a
//! scheme, `HOST:PORT`, takes the cluster's). A client certificate comes with its key
//! and needs the CA.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use palisade_lock::{EtcdTls, EtcdTlsError, TlsPart};

use super::exit::{with_causes, CliError, Exit};

/// TLS to the `--etcd` cluster.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct EtcdTlsArgs {
    /// CA certificates (PEM) that the --etcd members' certificates chain to: TLS to etcd,
    /// whose endpoints are then https://HOST:PORT.
    #[arg(long, value_name = "FILE", requires = "etcd")]
    etcd_ca: Option<PathBuf>,
    /// Client certificate chain (PEM) shown to the --etcd members, for etcd's
    /// --client-cert-auth; with --etcd-key and --etcd-ca.
    #[arg(long, value_name = "FILE", requires_all = ["etcd_key", "etcd_ca"])]
    etcd_cert: Option<PathBuf>,
    /// The private key (PEM) of --etcd-cert.
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
}

/// TLS to each `--tier` cluster.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct TierTlsArgs {
    /// A --tier's CA certificates (PEM), NAME=FILE: TLS to that tier, whose endpoints are
    /// then https://. Repeated per tier.
    #[arg(long = "tier-ca", value_name = "NAME=FILE")]
    tier_ca: Vec<String>,
    /// A --tier's client certificate chain (PEM), NAME=FILE; with --tier-key and
    /// --tier-ca for the same NAME.
    #[arg(long = "tier-cert", value_name = "NAME=FILE")]
    tier_cert: Vec<String>,
    /// The private key (PEM) of a --tier-cert, NAME=FILE.
    #[arg(long = "tier-key", value_name = "NAME=FILE")]
    tier_key: Vec<String>,
}

/// One etcd cluster as the command line gave it: endpoints and, if any, TLS.
#[derive(Debug, Clone)]
pub(crate) struct EtcdTarget {
    pub(crate) endpoints: Vec<String>,
    pub(crate) tls: Option<EtcdTls>,
}

impl EtcdTarget {
    /// The endpoints, comma-separated, for messages.
    pub(crate) fn joined(&self) -> String {
        self.endpoints.join(",")
    }

    /// The start error for this cluster (tier `tier`, or the `--etcd` one) that did not
    /// answer: its endpoints, the cause, and with TLS what to check.
    pub(crate) fn unreachable(&self, tier: Option<&str>, e: &dyn std::error::Error) -> CliError {
        let what = match tier {
            Some(name) => format!("cannot start tier {name} on etcd {}", self.joined()),
            None => format!("cannot start on etcd {}", self.joined()),
        };
        let hint = match (&self.tls, tier) {
            (None, _) => String::new(),
            (Some(_), None) => "\n(TLS: the members' certificates must chain to --etcd-ca and \
                name the endpoint's host or IP; with --client-cert-auth etcd needs \
                --etcd-cert/--etcd-key from its --trusted-ca-file's CA)"
                .to_owned(),
            (Some(_), Some(name)) => format!(
                "\n(TLS: the members' certificates must chain to --tier-ca {name}=FILE and \
                 name the endpoint's host or IP; with --client-cert-auth etcd needs \
                 --tier-cert/--tier-key {name}=FILE from its --trusted-ca-file's CA)"
            ),
        };
        CliError::new(Exit::Failure, format!("{what}: {}{hint}", with_causes(e)))
    }
}

/// The `--etcd` cluster, checked (see the module docs).
pub(crate) fn home(etcd: &[String], tls: &EtcdTlsArgs) -> Result<EtcdTarget, CliError> {
    let identity = tls.etcd_cert.as_deref().zip(tls.etcd_key.as_deref());
    target("--etcd", etcd, tls.etcd_ca.as_deref(), identity)
}

/// Every `--tier NAME=ENDPOINTS`, checked (see the module docs): well formed, each name
/// once and none of them `home_tier` (the `--etcd` cluster's), and each `--tier-ca`,
/// `--tier-cert` and `--tier-key` naming one of them.
pub(crate) fn tiers(
    home_tier: &str,
    specs: &[String],
    tls: &TierTlsArgs,
) -> Result<Vec<(String, EtcdTarget)>, CliError> {
    let mut parsed = Vec::new();
    let mut names = BTreeSet::new();
    for spec in specs {
        let (name, endpoints) = parse_tier(spec)?;
        if name == home_tier {
            return Err(CliError::bad_input(format!(
                "--tier {name}=...: {name} is the home tier's name (--home-tier {home_tier}, \
                 the --etcd cluster); give this tier another name, or --home-tier another"
            )));
        }
        if !names.insert(name.clone()) {
            return Err(CliError::bad_input(format!(
                "--tier {name}=... is given twice: each tier needs a name of its own"
            )));
        }
        parsed.push((name, endpoints));
    }
    let cas = per_tier("--tier-ca", &tls.tier_ca, &names)?;
    let certs = per_tier("--tier-cert", &tls.tier_cert, &names)?;
    let keys = per_tier("--tier-key", &tls.tier_key, &names)?;
    let mut out = Vec::new();
    for (name, endpoints) in parsed {
        let identity = match (certs.get(&name), keys.get(&name)) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            (None, None) => None,
            (Some(_), None) => {
                return Err(CliError::bad_input(format!(
                    "--tier-cert {name}=... needs --tier-key {name}=FILE, its private key"
                )))
            }
            (None, Some(_)) => {
                return Err(CliError::bad_input(format!(
                    "--tier-key {name}=... needs --tier-cert {name}=FILE, its certificate"
                )))
            }
        };
        let ca = cas.get(&name).map(PathBuf::as_path);
        if identity.is_some() && ca.is_none() {
            return Err(CliError::bad_input(format!(
                "--tier-cert {name}=... needs --tier-ca {name}=FILE: a client certificate is \
                 only shown over TLS"
            )));
        }
        let flag = format!("--tier {name}");
        let target = target(&flag, &endpoints, ca, identity)?;
        out.push((name, target));
    }
    Ok(out)
}

/// One `--tier NAME=ENDPOINTS`, its endpoints checked.
fn parse_tier(spec: &str) -> Result<(String, Vec<String>), CliError> {
    let Some((name, endpoints)) = spec.split_once('=') else {
        return Err(CliError::bad_input(format!(
            "--tier {spec:?} is not NAME=http://HOST:PORT[,http://HOST:PORT...]"
        )));
    };
    palisade_api::validate_name(name)
        .map_err(|e| CliError::bad_input(format!("--tier {spec:?}: {e}")))?;
    let endpoints: Vec<String> = endpoints.split(',').map(str::to_owned).collect();
    for e in &endpoints {
        check_endpoint(&format!("--tier {name}"), e)?;
    }
    Ok((name.to_owned(), endpoints))
}

/// `NAME=FILE` values of `flag`, each NAME a `--tier` and given once.
fn per_tier(
    flag: &str,
    specs: &[String],
    names: &BTreeSet<String>,
) -> Result<BTreeMap<String, PathBuf>, CliError> {
    let mut out = BTreeMap::new();
    for spec in specs {
        let Some((name, file)) = spec
            .split_once('=')
            .filter(|(n, f)| !n.is_empty() && !f.is_empty())
        else {
            return Err(CliError::bad_input(format!(
                "{flag} {spec:?} is not NAME=FILE"
            )));
        };
        if !names.contains(name) {
            return Err(CliError::bad_input(format!(
                "{flag} {name}=...: there is no --tier {name}"
            )));
        }
        if out.insert(name.to_owned(), PathBuf::from(file)).is_some() {
            return Err(CliError::bad_input(format!(
                "{flag} {name}=... is given twice"
            )));
        }
    }
    Ok(out)
}

/// A cluster from its flag's endpoints and TLS files.
fn target(
    flag: &str,
    endpoints: &[String],
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> Result<EtcdTarget, CliError> {
    for e in endpoints {
        check_endpoint(flag, e)?;
        match (ca, e.starts_with("https://")) {
            (Some(_), false) if e.starts_with("http://") => {
                return Err(CliError::bad_input(format!(
                    "{flag} {e:?}: with a CA for this cluster every endpoint is \
                     https://HOST:PORT (TLS); plain http:// would send the traffic in clear"
                )))
            }
            (None, true) => {
                let ca_flag = match flag.strip_prefix("--tier ") {
                    Some(name) => format!("--tier-ca {name}=FILE"),
                    None => "--etcd-ca FILE".to_owned(),
                };
                return Err(CliError::bad_input(format!(
                    "{flag} {e:?}: an https:// endpoint needs {ca_flag}, the CA the members' \
                     certificates chain to"
                )));
            }
            _ => {}
        }
    }
    let tls = match ca {
        Some(ca) => Some(
            EtcdTls::from_files(ca, identity)
                .map_err(|e| CliError::bad_input(format!("{}: {e}", file_flag(flag, &e))))?,
        ),
        None => None,
    };
    Ok(EtcdTarget {
        endpoints: endpoints.to_vec(),
        tls,
    })
}

/// The flag that named the file `e` is about, for the cluster of `flag` (`--etcd` or
/// `--tier NAME`).
fn file_flag(flag: &str, e: &EtcdTlsError) -> String {
    let suffix = match e.part() {
        TlsPart::Ca => "ca",
        TlsPart::ClientCert => "cert",
        TlsPart::ClientKey => "key",
    };
    match flag.strip_prefix("--tier ") {
        Some(name) => format!("--tier-{suffix} {name}=..."),
        None => format!("--etcd-{suffix}"),
    }
}

/// Refuses an endpoint etcd-client would only fail on after its timeout.
fn check_endpoint(flag: &str, endpoint: &str) -> Result<(), CliError> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .unwrap_or(endpoint);
    let ok = match rest.trim_end_matches('/').rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok()
        }
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(CliError::bad_input(format!(
            "{flag} {endpoint:?} is not an etcd endpoint of the form http://HOST:PORT \
             (or https://HOST:PORT with TLS)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn an_https_endpoint_without_a_ca_names_the_flag_to_add() {
        let e = home(
            &strings(&["https://127.0.0.1:2379"]),
            &EtcdTlsArgs::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--etcd-ca FILE"), "{e}");
        let e = tiers(
            "default",
            &strings(&["east=https://127.0.0.1:2379"]),
            &TierTlsArgs::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--tier-ca east=FILE"), "{e}");
    }

    #[test]
    fn a_ca_with_an_http_endpoint_is_refused() {
        let tls = EtcdTlsArgs {
            etcd_ca: Some("/nonexistent/ca.pem".into()),
            ..EtcdTlsArgs::default()
        };
        let e = home(&strings(&["http://127.0.0.1:2379"]), &tls)
            .unwrap_err()
            .to_string();
        assert!(e.contains("https://HOST:PORT (TLS)"), "{e}");
    }

    #[test]
    fn tier_tls_flags_must_name_a_tier_and_come_in_pairs() {
        let specs = strings(&["east=https://127.0.0.1:2379"]);
        let stray = TierTlsArgs {
            tier_ca: strings(&["west=/ca.pem"]),
            ..TierTlsArgs::default()
        };
        let e = tiers("default", &specs, &stray).unwrap_err().to_string();
        assert!(e.contains("there is no --tier west"), "{e}");
        let half = TierTlsArgs {
            tier_ca: strings(&["east=/ca.pem"]),
            tier_cert: strings(&["east=/c.pem"]),
            ..TierTlsArgs::default()
        };
        let e = tiers("default", &specs, &half).unwrap_err().to_string();
        assert!(e.contains("needs --tier-key east=FILE"), "{e}");
        let twice = TierTlsArgs {
            tier_ca: strings(&["east=/a.pem", "east=/b.pem"]),
            ..TierTlsArgs::default()
        };
        let e = tiers("default", &specs, &twice).unwrap_err().to_string();
        assert!(e.contains("given twice"), "{e}");
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let tls = EtcdTlsArgs {
            etcd_ca: Some("/nonexistent/etcd-ca.pem".into()),
            ..EtcdTlsArgs::default()
        };
        let e = home(&strings(&["https://127.0.0.1:2379"]), &tls)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/etcd-ca.pem"), "{e}");
        assert!(
            e.starts_with("--etcd-ca: cannot read the etcd CA file"),
            "{e}"
        );
    }

    #[test]
    fn plain_tiers_parse_and_names_are_checked() {
        let ok = tiers(
            "default",
            &strings(&["east=http://127.0.0.1:1,http://127.0.0.1:2"]),
            &TierTlsArgs::default(),
        )
        .unwrap();
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].0, "east");
        assert_eq!(ok[0].1.joined(), "http://127.0.0.1:1,http://127.0.0.1:2");
        assert!(ok[0].1.tls.is_none());
        let e = tiers(
            "east",
            &strings(&["east=http://127.0.0.1:1"]),
            &TierTlsArgs::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("is the home tier's name"), "{e}");
        let e = home(&strings(&["http://127.0.0.1"]), &EtcdTlsArgs::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not an etcd endpoint"), "{e}");
    }
}
