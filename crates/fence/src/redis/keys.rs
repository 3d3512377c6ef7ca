//! Where the fence keeps a resource's mark and reset log: the one definition of the key
//! layout on the Rust side.

use std::sync::Arc;

use super::RedisFenceError;

/// The keys of a resource's fence state, under a prefix.
///
/// | key | type | holds |
/// |---|---|---|
/// | `<prefix>{<resource>}:mark` | hash | `token` (the mark, canonical decimal), `updated_ms` (Unix ms of the last raise or reset) |
/// | `<prefix>{<resource>}:resets` | stream | one entry per reset: `old`, `new`, `reason`, `reset_by`, `lock`, `floor`; the entry id's first part is the time (Unix ms) |
///
/// The default prefix is `palisade:fence:`. The resource sits between braces: it is the
/// key's Redis Cluster **hash tag**, so a resource's mark and reset log live in one slot,
/// and so does every data key that starts with [`hash_tag`](Self::hash_tag)`(resource)`
/// (`{orders:17}:total` with the mark `palisade:fence:{orders:17}:mark`): the fenced
/// writes touch the mark and the data in one call, which Redis Cluster allows only within
/// one slot. (Redis takes a key's tag from its first `{` to the next `}`; the prefix holds
/// no brace, so a mark's tag and a data key's that starts with the same `{<resource>}` are
/// the same even when the resource holds braces. A resource that is empty or starts with `}`
/// gives an empty tag, which Redis ignores: such a resource's keys hash whole, each to its
/// own slot, and its fenced writes work only outside Redis Cluster.)
///
/// The functions of the library never build keys: they take them in `KEYS`, as Redis
/// requires of every key a script touches. Clients in other languages build the same
/// strings (docs/resources.md shows them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: Arc<str>,
}

impl KeyLayout {
    /// The default prefix, `palisade:fence:`.
    pub const DEFAULT_PREFIX: &'static str = "palisade:fence:";
    const MARK: &'static str = ":mark";
    const RESETS: &'static str = ":resets";

    /// A layout under `prefix` (use a prefix per application or tenant that shares a
    /// Redis; it may be empty).
    ///
    /// # Errors
    ///
    /// [`BadArguments`](super::RedisFenceErrorKind::BadArguments) when the prefix holds `{`
    /// or `}`: the hash tag would then not be the resource.
    pub fn new(prefix: impl Into<String>) -> Result<Self, RedisFenceError> {
        let prefix = prefix.into();
        if prefix.contains(['{', '}']) {
            return Err(RedisFenceError::prefix(&prefix));
        }
        Ok(KeyLayout {
            prefix: prefix.into(),
        })
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `{<resource>}`: start a data key with it to keep it in the slot of the resource's
    /// mark under Redis Cluster.
    pub fn hash_tag(resource: &str) -> String {
        format!("{{{resource}}}")
    }

    /// The key of `resource`'s mark: `<prefix>{<resource>}:mark`.
    pub fn mark_key(&self, resource: &str) -> String {
        self.key(resource, Self::MARK)
    }

    /// The key of `resource`'s reset log: `<prefix>{<resource>}:resets`.
    pub fn reset_log_key(&self, resource: &str) -> String {
        self.key(resource, Self::RESETS)
    }

    fn key(&self, resource: &str, suffix: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + resource.len() + 2 + suffix.len());
        key.push_str(&self.prefix);
        key.push('{');
        key.push_str(resource);
        key.push('}');
        key.push_str(suffix);
        key
    }
}

impl Default for KeyLayout {
    /// The layout under [`KeyLayout::DEFAULT_PREFIX`].
    fn default() -> Self {
        KeyLayout {
            prefix: KeyLayout::DEFAULT_PREFIX.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis Cluster's hash tag of a key (the cluster specification's rule).
    fn tag(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(len) = key[open + 1..].find('}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }

    #[test]
    fn keys_follow_the_documented_layout() {
        let l = KeyLayout::default();
        assert_eq!(l.mark_key("orders:17"), "palisade:fence:{orders:17}:mark");
        assert_eq!(
            l.reset_log_key("orders:17"),
            "palisade:fence:{orders:17}:resets"
        );
        let l = KeyLayout::new("app1:").unwrap();
        assert_eq!(l.mark_key("/r/1"), "app1:{/r/1}:mark");
        assert_eq!(KeyLayout::new("").unwrap().mark_key("x"), "{x}:mark");
        for bad in ["a{", "}", "x{y}"] {
            let e = KeyLayout::new(bad).unwrap_err();
            assert_eq!(e.kind(), crate::redis::RedisFenceErrorKind::BadArguments);
        }
    }

    #[test]
    fn a_data_key_that_starts_with_the_hash_tag_shares_the_mark_slot_even_with_braces() {
        let l = KeyLayout::default();
        for resource in ["orders:17", "a}b", "a{b", "{x}", "x}"] {
            let data = format!("{}:total", KeyLayout::hash_tag(resource));
            assert_eq!(tag(&l.mark_key(resource)), tag(&data), "{resource}");
            assert_eq!(tag(&l.mark_key(resource)), tag(&l.reset_log_key(resource)));
        }
        // The documented exception: an empty tag, so the whole key is hashed.
        assert_eq!(tag(&l.mark_key("}x")), l.mark_key("}x"));
    }
}
