//! Reading a key under `locks/` back into its parts: the one parser of the layout.

use crate::config::Mode;
use crate::ids::LeaseId;
use crate::keys::layout::RootKeys;
use crate::names::is_name;

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
    /// Parses a key under [`RootKeys::locks`]. `None` for anything else: another prefix,
    /// a name that is not `[a-z0-9][a-z0-9_-]{0,62}`, an escaped key that does not
    /// unescape, a lease that is not 16 lower-case hex digits, or another entry shape.
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
        unescape_key(escaped_key)?;
        let entry = if sub == "c" {
            LockEntry::CancelMarker(lease_segment(a)?, decimal(b)?)
        } else {
            let mode = match a {
                "x" => Mode::Exclusive,
                "s" => Mode::Shared,
                _ => return None,
            };
            let lease = lease_segment(b)?;
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

/// Exactly 16 lower-case hex digits, as [`LeaseId`]'s `Display` writes them.
fn lease_segment(s: &str) -> Option<LeaseId> {
    let ok = s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    // Two's complement, as `{:016x}` of an i64 writes it.
    ok.then(|| {
        u64::from_str_radix(s, 16)
            .ok()
            .map(|v| LeaseId::new(v as i64))
    })?
}

fn decimal(s: &str) -> Option<u64> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
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
    use crate::keys::escape_key;

    #[test]
    fn every_key_the_layout_builds_parses_back() {
        let root = RootKeys::new("/p");
        let key = "a/b c%d";
        let k = root.lock("ns", "c-1", key);
        let l = LeaseId::new(0x3211a22c6da3b70c);
        let neg = LeaseId::new(-1);
        for (built, entry) in [
            (
                k.waiter(Mode::Exclusive, l),
                LockEntry::Waiter(Mode::Exclusive, l),
            ),
            (k.hold(Mode::Shared, l), LockEntry::Hold(Mode::Shared, l)),
            (
                k.grant(Mode::Exclusive, neg),
                LockEntry::Grant(Mode::Exclusive, neg),
            ),
            (k.cancel_marker(l, 42), LockEntry::CancelMarker(l, 42)),
        ] {
            let p = root.parse_lock_entry(built.as_bytes()).unwrap();
            assert_eq!((p.ns, p.class, p.entry), ("ns", "c-1", entry), "{built}");
            assert_eq!(p.escaped_key, escape_key(key));
            assert_eq!(p.key(), key);
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
