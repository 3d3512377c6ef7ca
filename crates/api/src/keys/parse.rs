//! Reading a key under `locks/` back into its parts: the one parser of the layout.

use crate::config::Mode;
use crate::ids::LeaseId;
use crate::keys::layout::{escape_key, RootKeys};
use crate::names::{is_name, validate_key};

/// What a key under a lock's base path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEntry {
    /// `q/<x|s>/<lease>`: a waiter.
    Waiter(Mode, LeaseId),
    /// `h/<x|s>/<lease>`: a hold.
    Hold(Mode, LeaseId),
    /// `g/<x|s>/<lease>`: a grant record.
    Grant(Mode, LeaseId),
    /// `c/<lease>/<attempt>`: the cancel marker of a dropped acquire.
    CancelMarker(LeaseId, u64),
}

/// A key of the documented shape `locks/<ns>/<class>/<escaped key>/<entry>`, borrowed
/// from the key it was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockEntryKey<'a> {
    /// The namespace.
    pub ns: &'a str,
    /// The class.
    pub class: &'a str,
    /// The lock key as stored (escaped); [`LockEntryKey::key`] undoes the escaping.
    pub escaped_key: &'a str,
    /// Which entry of the lock.
    pub entry: LockEntry,
}

impl LockEntryKey<'_> {
    /// The lock key, unescaped.
    pub fn key(&self) -> String {
        unescape_key(self.escaped_key).unwrap_or_default()
    }
}

impl RootKeys {
    /// Parses a key under [`RootKeys::locks`]: exactly the keys this layout builds, so
    /// two etcd keys never name one entry. `None` for anything else: another prefix, a
    /// name that is not `[a-z0-9][a-z0-9_-]{0,62}`, a lock key that is not valid
    /// ([`validate_key`](crate::validate_key)) or not escaped as [`escape_key`] escapes
    /// it, a lease that is not [`LeaseId::from_hex`]'s form, an attempt that is not
    /// plain decimal, or another entry shape.
    pub fn parse_lock_entry<'a>(&self, key: &'a [u8]) -> Option<LockEntryKey<'a>> {
        let rest = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(self.root())?
            .strip_prefix("locks/")?;
        let mut segs = rest.split('/');
        let (ns, class, escaped_key) = (segs.next()?, segs.next()?, segs.next()?);
        let (sub, a, b) = (segs.next()?, segs.next()?, segs.next()?);
        if segs.next().is_some() || !is_name(ns) || !is_name(class) {
            return None;
        }
        let unescaped = unescape_key(escaped_key)?;
        if validate_key(&unescaped).is_err() || escape_key(&unescaped) != escaped_key {
            return None;
        }
        let entry = if sub == "c" {
            LockEntry::CancelMarker(LeaseId::from_hex(a)?, decimal(b)?)
        } else {
            let mode = match a {
                "x" => Mode::Exclusive,
                "s" => Mode::Shared,
                _ => return None,
            };
            let lease = LeaseId::from_hex(b)?;
            match sub {
                "q" => LockEntry::Waiter(mode, lease),
                "h" => LockEntry::Hold(mode, lease),
                "g" => LockEntry::Grant(mode, lease),
                _ => return None,
            }
        };
        Some(LockEntryKey {
            ns,
            class,
            escaped_key,
            entry,
        })
    }
}

/// Plain decimal, as `{}` writes a `u64`: no sign, no leading zero.
fn decimal(s: &str) -> Option<u64> {
    let v: u64 = s.parse().ok()?;
    (v.to_string() == s).then_some(v)
}

/// Undoes [`escape_key`](crate::keys::escape_key) (`%25`, `%2F`, `%20`); `None` for an
/// empty key or any other `%` sequence, which the escaping never writes.
pub fn unescape_key(s: &str) -> Option<String> {
    if s.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let c = match rest.get(i..i + 3)? {
            "%25" => '%',
            "%2F" => '/',
            "%20" => ' ',
            _ => return None,
        };
        out.push(c);
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_the_layout_builds_parses_back() {
        let keys = [
            "a/b c%d",
            "k",
            ".",
            "%2F",
            "h/x/00000000000000ff",
            "é/ü",
            "a..b",
        ];
        let long = "k".repeat(crate::MAX_KEY_LEN);
        let max_name = "n".repeat(crate::MAX_NAME_LEN);
        for root in ["/p", "", "/locks/", "/a b/"] {
            let root = RootKeys::new(root);
            for (ns, class) in [("ns", "c-1"), (max_name.as_str(), "0")] {
                for key in keys.iter().copied().chain([long.as_str()]) {
                    let k = root.lock(ns, class, key);
                    for l in [
                        LeaseId::new(1),
                        LeaseId::new(0x3211a22c6da3b70c),
                        LeaseId::new(i64::MAX),
                    ] {
                        for (built, entry) in [
                            (
                                k.waiter(Mode::Exclusive, l),
                                LockEntry::Waiter(Mode::Exclusive, l),
                            ),
                            (k.hold(Mode::Shared, l), LockEntry::Hold(Mode::Shared, l)),
                            (
                                k.grant(Mode::Exclusive, l),
                                LockEntry::Grant(Mode::Exclusive, l),
                            ),
                            (k.cancel_marker(l, 0), LockEntry::CancelMarker(l, 0)),
                            (
                                k.cancel_marker(l, u64::MAX),
                                LockEntry::CancelMarker(l, u64::MAX),
                            ),
                        ] {
                            let p = root.parse_lock_entry(built.as_bytes()).unwrap();
                            assert_eq!((p.ns, p.class, p.entry), (ns, class, entry), "{built}");
                            assert_eq!(p.escaped_key, escape_key(key));
                            assert_eq!(p.key(), key);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn keys_of_other_shapes_do_not_parse() {
        let root = RootKeys::new("/p/");
        for bad in [
            "/q/locks/ns/c/k/h/x/00000000000000ff",
            "/p/locks/ns/c/k/h/x/00000000000000FF",
            "/p/locks/ns/c/k/h/x/ff",
            "/p/locks/ns/c/k/h/y/00000000000000ff",
            "/p/locks/ns/c/k/z/x/00000000000000ff",
            "/p/locks/ns/c/k/h/x/00000000000000ff/more",
            "/p/locks/NS/c/k/h/x/00000000000000ff",
            "/p/locks/ns/c/a%2/h/x/00000000000000ff",
            "/p/locks/ns/c//h/x/00000000000000ff",
            "/p/locks/ns/c/k/c/00000000000000ff/x7",
            "/p/config/ns/ns",
            // Not as the layout escapes or validates a key: two etcd keys would name one
            // lock, or a key the API refuses would be read back.
            "/p/locks/ns/c/a b/h/x/00000000000000ff",
            "/p/locks/ns/c/a%2f/h/x/00000000000000ff",
            "/p/locks/ns/c/a%2F..%2Fb/h/x/00000000000000ff",
            "/p/locks/ns/c/../h/x/00000000000000ff",
            "/p/locks/ns/c/a\u{0}b/h/x/00000000000000ff",
            // Attempts and leases only in the form the layout writes them.
            "/p/locks/ns/c/k/c/00000000000000ff/007",
            "/p/locks/ns/c/k/c/00000000000000ff/00",
            "/p/locks/ns/c/k/c/00000000000000ff/+7",
            "/p/locks/ns/c/k/h/x/0000000000000000",
            "/p/locks/ns/c/k/h/x/8000000000000000",
        ] {
            assert_eq!(root.parse_lock_entry(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn unescaping_undoes_escaping_only() {
        assert_eq!(unescape_key("a%2Fb%20c%25d").as_deref(), Some("a/b c%d"));
        assert_eq!(unescape_key("a%252Fb").as_deref(), Some("a%2Fb"));
        assert_eq!(unescape_key("a%2"), None);
        assert_eq!(unescape_key(""), None);
        for k in ["a/b", "%", "x y/z%2F"] {
            assert_eq!(unescape_key(&escape_key(k)).as_deref(), Some(k));
        }
    }
}
