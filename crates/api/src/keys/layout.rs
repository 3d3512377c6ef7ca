//! Building keys: [`RootKeys`] and [`LockKeys`]. Everything here builds strings; nothing
//! talks to etcd.

use crate::config::Mode;
use crate::ids::LeaseId;

/// The default root prefix of the key space.
pub const DEFAULT_ROOT: &str = "/palisade/";

/// Percent-encodes `%`, `/` and space as `%25`, `%2F` and `%20`. The escaped key has
/// no `/`, so the `/` that follows it in a lock's base path ends it: `a/b` becomes
/// `a%2Fb/` and `a/bc` becomes `a%2Fbc/`, and neither base is a prefix of the other.
pub fn escape_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 8);
    push_escaped(&mut out, key);
    out
}

/// Appends `key` escaped as [`escape_key`] does.
fn push_escaped(out: &mut String, key: &str) {
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            ' ' => out.push_str("%20"),
            c => out.push(c),
        }
    }
}

/// The end of etcd's range for "every key with this prefix": the prefix with its last
/// byte incremented (etcd's `clientv3.GetPrefixRangeEnd`).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.last_mut() {
        if *last < 0xff {
            *last += 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}

/// Appends `v` as 16 lower-case hex digits, zero-padded (as `{:016x}`).
fn push_hex16(out: &mut String, v: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(char::from(HEX[((v >> (shift * 4)) & 0xf) as usize]));
    }
}

/// `v` in decimal, written into the end of `buf`.
fn itoa_u64(mut v: u64, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[i..]).unwrap_or("0")
}

/// The keys of the root prefix that are not about one lock.
#[derive(Debug, Clone)]
pub struct RootKeys {
    root: String,
}

impl RootKeys {
    /// The keys under `root` (default `/palisade/`); a missing trailing `/` is added.
    pub fn new(root: &str) -> Self {
        let mut root = root.to_owned();
        if !root.ends_with('/') {
            root.push('/');
        }
        RootKeys { root }
    }

    /// The root prefix, ending in `/`.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// Everything a class lookup depends on: `config/` (namespaces, classes, epoch).
    pub fn config(&self) -> String {
        format!("{}config/", self.root)
    }

    /// A namespace's record: `config/ns/<ns>`.
    pub fn namespace(&self, ns: &str) -> String {
        format!("{}config/ns/{ns}", self.root)
    }

    /// Every class record of a namespace: `config/class/<ns>/`.
    pub fn classes(&self, ns: &str) -> String {
        format!("{}config/class/{ns}/", self.root)
    }

    /// A class's record: `config/class/<ns>/<class>`.
    pub fn class(&self, ns: &str, class: &str) -> String {
        format!("{}config/class/{ns}/{class}", self.root)
    }

    /// `<root>quota/<ns>/`: everything of the namespace's `held_lease_quota`.
    pub fn quota(&self, ns: &str) -> String {
        format!("{}quota/{ns}/", self.root)
    }

    /// `<root>quota/<ns>/slot/`: the namespace's numbered `held_lease_quota` slots.
    pub fn quota_slots(&self, ns: &str) -> String {
        format!("{}quota/{ns}/slot/", self.root)
    }

    /// Slot number `i` of a namespace: `quota/<ns>/slot/<i>`, `i` as 10 decimal digits,
    /// so the slots numbered `n` and above are one key range (from `quota_slot(ns, n)`
    /// to the end of [`RootKeys::quota_slots`]). Its value is a [`RootKeys::quota_taker`]
    /// with a suffix that tells one take from another.
    pub fn quota_slot(&self, ns: &str, i: u32) -> String {
        format!("{}{i:010}", self.quota_slots(ns))
    }

    /// Who takes a slot, the start of the slot's value: `<lease>/<x|s>/<class>/<escaped
    /// key>` for a hold or wait, `<lease>/session` ([`RootKeys::QUOTA_SESSION`]) for a
    /// session opened with the namespace.
    pub fn quota_taker(lease: LeaseId, what: Option<(Mode, &str, &str)>) -> String {
        match what {
            Some((mode, class, key)) => {
                format!("{lease}/{}/{class}/{}", mode.segment(), escape_key(key))
            }
            None => format!("{lease}/{}", Self::QUOTA_SESSION),
        }
    }

    /// The last segment of a session's [`RootKeys::quota_taker`].
    pub const QUOTA_SESSION: &'static str = "session";

    /// Every detached session's keys: `sessions/`.
    pub fn sessions(&self) -> String {
        format!("{}sessions/", self.root)
    }

    /// A detached session's record: `sessions/<lease>`.
    pub fn session(&self, lease: LeaseId) -> String {
        format!("{}sessions/{lease}", self.root)
    }

    /// The notice that the hold granted at `grant_rev` to the session of `lease` was
    /// force-released: `sessions/<lease>/forced/<grant_rev>` (`grant_rev` as 20 decimal
    /// digits). Put on the session's lease by the force release's Txn, so it lasts as
    /// long as the session and is read with the session's record (see
    /// [`RootKeys::session_range`]).
    pub fn session_forced(&self, lease: LeaseId, grant_rev: u64) -> String {
        format!("{}sessions/{lease}/forced/{grant_rev:020}", self.root)
    }

    /// The range `[start, end)` of a session's record and its force notices: one Range
    /// reads both. No other session's key is in it (lease ids have 16 digits).
    pub fn session_range(&self, lease: LeaseId) -> (String, Vec<u8>) {
        let start = self.session(lease);
        let end = prefix_end(&start);
        (start, end)
    }

    /// A session's lease marker: `leases/<lease>`, empty, on the lease, put by the lock
    /// core when it opens a session (a detached session's record,
    /// [`RootKeys::session`], plays the same part). etcd deletes it with the lease's
    /// other keys, in one revision, when the lease expires or is revoked: that is how a
    /// hold that ends with its lease is told from a release (see [`crate::keys`]).
    pub fn lease_marker(&self, lease: LeaseId) -> String {
        format!("{}leases/{lease}", self.root)
    }

    /// The lease whose end a key's deletion shows: `Some` for a lease marker
    /// (`leases/<lease>`) and for a detached session's record (`sessions/<lease>`,
    /// exactly: not its force notices), `None` for every other key.
    pub fn ended_lease(&self, key: &[u8]) -> Option<LeaseId> {
        let rest = key.strip_prefix(self.root.as_bytes())?;
        let hex = rest
            .strip_prefix(b"leases/")
            .or_else(|| rest.strip_prefix(b"sessions/"))?;
        LeaseId::from_hex(std::str::from_utf8(hex).ok()?)
    }

    /// `<root>owners/<escaped spiffe id>/`: one key per open session of that identity,
    /// each on its session's lease (the per-identity session limit).
    pub fn owner_sessions(&self, spiffe_id: &str) -> String {
        format!("{}owners/{}/", self.root, escape_key(spiffe_id))
    }

    /// The key counting one session of `spiffe_id`: `owners/<escaped id>/<lease>`.
    pub fn owner_session(&self, spiffe_id: &str, lease: LeaseId) -> String {
        format!("{}{lease}", self.owner_sessions(spiffe_id))
    }

    /// The epoch record in etcd: `config/epoch`.
    pub fn epoch(&self) -> String {
        let mut key = String::with_capacity(self.root.len() + 12);
        key.push_str(&self.root);
        key.push_str("config/epoch");
        key
    }

    /// `epoch-bump`: written (empty, no lease) only to move etcd's revision past the
    /// durable epoch reservation before a locker's first grant.
    pub fn epoch_bump(&self) -> String {
        format!("{}epoch-bump", self.root)
    }

    /// `tier/fence/<ns>`: while it exists in a cluster, that cluster grants nothing in
    /// the namespace (it lives on another tier, or is being rehomed). Written and
    /// deleted only by a rehome; every acquire's first Txn compares it absent.
    pub fn ns_fence(&self, ns: &str) -> String {
        format!("{}tier/fence/{ns}", self.root)
    }

    /// `tier/rehome/<ns>`: a rehome of the namespace in progress (a
    /// [`RehomeRecord`](crate::RehomeRecord)), on the home tier only.
    pub fn rehome(&self, ns: &str) -> String {
        format!("{}tier/rehome/{ns}", self.root)
    }

    /// Every lock's keys: `locks/`.
    pub fn locks(&self) -> String {
        format!("{}locks/", self.root)
    }

    /// Every lock key of one namespace: `locks/<ns>/`.
    pub fn namespace_locks(&self, ns: &str) -> String {
        format!("{}locks/{ns}/", self.root)
    }

    /// The keys of one lock: `locks/<ns>/<class>/<escaped key>/`.
    pub fn lock(&self, ns: &str, class: &str, key: &str) -> LockKeys {
        let mut base =
            String::with_capacity(self.root.len() + 9 + ns.len() + class.len() + key.len() + 8);
        base.push_str(&self.root);
        base.push_str("locks/");
        base.push_str(ns);
        base.push('/');
        base.push_str(class);
        base.push('/');
        push_escaped(&mut base, key);
        base.push('/');
        LockKeys { base }
    }
}

/// The keys of one lock: `<root>locks/<ns>/<class>/<escaped key>/` plus a sub-key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    base: String,
}

impl LockKeys {
    /// `<base><sub>/`, then `<m>/` with a mode, then the lease's 16 hex digits with a
    /// lease (as [`LeaseId`]'s `Display`). Built by hand, without the formatting
    /// machinery: every acquire and release builds several of these.
    fn sub_key(&self, sub: u8, mode: Option<Mode>, lease: Option<LeaseId>) -> String {
        let mut key = String::with_capacity(self.base.len() + 4 + 16);
        key.push_str(&self.base);
        key.push(char::from(sub));
        key.push('/');
        if let Some(m) = mode {
            key.push_str(m.segment());
            key.push('/');
        }
        if let Some(l) = lease {
            push_hex16(&mut key, l.get() as u64);
        }
        key
    }

    /// Every waiter, both modes: `q/`.
    pub fn queue(&self) -> String {
        self.sub_key(b'q', None, None)
    }

    /// Waiters of one mode: `q/x/` or `q/s/`.
    pub fn queue_of(&self, mode: Mode) -> String {
        self.sub_key(b'q', Some(mode), None)
    }

    /// One waiter: `q/<x|s>/<lease>`.
    pub fn waiter(&self, mode: Mode, lease: LeaseId) -> String {
        self.sub_key(b'q', Some(mode), Some(lease))
    }

    /// Every hold, both modes: `h/`.
    pub fn holds(&self) -> String {
        self.sub_key(b'h', None, None)
    }

    /// Holds of one mode.
    pub fn holds_of(&self, mode: Mode) -> String {
        self.sub_key(b'h', Some(mode), None)
    }

    /// One hold: `h/<x|s>/<lease>`.
    pub fn hold(&self, mode: Mode, lease: LeaseId) -> String {
        self.sub_key(b'h', Some(mode), Some(lease))
    }

    /// Every grant record: `g/`.
    pub fn grants(&self) -> String {
        self.sub_key(b'g', None, None)
    }

    /// Grant records of one mode.
    pub fn grants_of(&self, mode: Mode) -> String {
        self.sub_key(b'g', Some(mode), None)
    }

    /// One grant record: `g/<x|s>/<lease>`.
    pub fn grant(&self, mode: Mode, lease: LeaseId) -> String {
        self.sub_key(b'g', Some(mode), Some(lease))
    }

    /// The bounded range of the lease-id keys of one sub-prefix (`q`, `h` or `g`) and
    /// mode: from `<sub>/<m>/0000000000000000` to `<sub>/<m>/ffffffffffffffff`
    /// inclusive, as `(start, end)` for etcd (end exclusive). Compares and reads use it,
    /// so stray keys of other shapes under the sub-prefix never block the lock.
    pub fn lease_range(&self, sub: char, mode: Mode) -> (String, Vec<u8>) {
        // Built by hand: every acquire's grant Txn needs six of these.
        let mut start = String::with_capacity(self.base.len() + 4 + 16);
        start.push_str(&self.base);
        start.push(sub);
        start.push('/');
        start.push_str(mode.segment());
        start.push('/');
        let mut end = Vec::with_capacity(start.len() + 17);
        end.extend_from_slice(start.as_bytes());
        end.extend_from_slice(b"ffffffffffffffff\0");
        start.push_str("0000000000000000");
        (start, end)
    }

    /// The range of the lock's hold and waiter keys, `h/` to the end of `q/`, as
    /// `(start, end)` for etcd (end exclusive): what a wait watches (see
    /// the lock core's waits). Grant records (`g/`) and cancel markers (`c/`) sort
    /// before it, so their writes are not sent to waiters.
    pub fn wait_range(&self) -> (String, Vec<u8>) {
        (self.holds(), prefix_end(&self.queue()))
    }

    /// Whether `key` falls inside one of the lock's bounded `q/`, `h/`, `g/` ranges
    /// (those of [`LockKeys::lease_range`]). Every key between two keys with the prefix
    /// `<sub>/<m>/` has that prefix, so this compares the rest with the ranges' ends
    /// without building them.
    pub fn in_lease_ranges(&self, key: &[u8]) -> bool {
        let Some(rest) = key.strip_prefix(self.base.as_bytes()) else {
            return false;
        };
        let [sub, b'/', mode, b'/', id @ ..] = rest else {
            return false;
        };
        matches!(sub, b'q' | b'h' | b'g')
            && matches!(mode, b'x' | b's')
            && id >= &b"0000000000000000"[..]
            && id < &b"ffffffffffffffff\0"[..]
    }

    /// Whether `key` is exactly `<sub>/<x|s>/<16 lower-case hex digits>` of this lock.
    pub fn is_lease_key(&self, key: &[u8]) -> bool {
        let Some(rest) = key.strip_prefix(self.base.as_bytes()) else {
            return false;
        };
        rest.len() == 4 + 16
            && matches!(rest[0], b'q' | b'h' | b'g')
            && rest[1] == b'/'
            && matches!(rest[2], b'x' | b's')
            && rest[3] == b'/'
            && rest[4..]
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    }

    /// The cancel marker of one acquire attempt: `c/<lease>/<attempt>` (see
    /// [`crate::keys`]). A first Txn of that attempt that reaches etcd after it does nothing.
    pub fn cancel_marker(&self, lease: LeaseId, attempt: u64) -> String {
        let mut key = self.sub_key(b'c', None, Some(lease));
        key.push('/');
        key.push_str(itoa_u64(attempt, &mut [0; 20]));
        key
    }

    /// The hold key that a grant record `g/<m>/<lease>` belongs to.
    pub fn hold_for_grant(&self, grant_key: &[u8]) -> Option<String> {
        let rest = std::str::from_utf8(grant_key)
            .ok()?
            .strip_prefix(&self.grants())?;
        Some(format!("{}h/{rest}", self.base))
    }

    /// The hold key `h/<m>/<lease>` that the grant of waiter key `q/<m>/<lease>`
    /// creates; `None` for a key that is not a waiter key of this lock.
    pub fn hold_for_waiter(&self, waiter_key: &[u8]) -> Option<String> {
        let rest = std::str::from_utf8(waiter_key)
            .ok()?
            .strip_prefix(&self.queue())?;
        Some(format!("{}h/{rest}", self.base))
    }

    /// The grant record that a hold key `h/<m>/<lease>` belongs to.
    pub fn grant_for_hold(&self, hold_key: &[u8]) -> Vec<u8> {
        let rest = &hold_key[(self.base.len() + 2).min(hold_key.len())..];
        let mut g = format!("{}g/", self.base).into_bytes();
        g.extend_from_slice(rest);
        g
    }

    /// The lock's base path, ending in `/`.
    pub fn base(&self) -> &str {
        &self.base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_slots_at_and_above_a_number_are_one_key_range() {
        let r = RootKeys::new("/palisade");
        let end = prefix_end(&r.quota_slots("ns"));
        let (from, nine, ten, last) = (
            r.quota_slot("ns", 10),
            r.quota_slot("ns", 9),
            r.quota_slot("ns", 1000),
            r.quota_slot("ns", u32::MAX),
        );
        assert!(nine < from && from < ten && ten < last);
        assert!(last.as_bytes() < end.as_slice());
        assert!(r.quota_slot("ns2", 0).as_bytes() >= end.as_slice());
        assert_eq!(from, "/palisade/quota/ns/slot/0000000010");
        let lease = LeaseId::new(0xab);
        assert_eq!(
            RootKeys::quota_taker(lease, Some((Mode::Shared, "c", "a/b"))),
            format!("{lease}/s/c/a%2Fb")
        );
        assert_eq!(
            RootKeys::quota_taker(lease, None),
            format!("{lease}/session")
        );
    }

    #[test]
    fn keys_that_are_prefixes_of_each_other_get_disjoint_spaces() {
        let r = RootKeys::new("/palisade");
        let ab = r.lock("ns", "c", "a/b");
        let abc = r.lock("ns", "c", "a/bc");
        assert_eq!(ab.base(), "/palisade/locks/ns/c/a%2Fb/");
        assert!(!abc.base().starts_with(ab.base()) && !ab.base().starts_with(abc.base()));
        // A key that looks like an escape is escaped itself.
        let pct = r.lock("ns", "c", "a%2Fb");
        assert_eq!(pct.base(), "/palisade/locks/ns/c/a%252Fb/");
        assert_ne!(pct.base(), ab.base());
        // A key ending where another's sub-keys begin stays apart.
        let q = r.lock("ns", "c", "a/b/q");
        assert!(!q.queue().starts_with(ab.base()));
    }

    #[test]
    fn the_wait_range_holds_every_hold_and_waiter_key_and_nothing_else_of_the_lock() {
        let r = RootKeys::new("/p/");
        let k = r.lock("n", "c", "k");
        let (start, end) = k.wait_range();
        let inside =
            |key: &str| key.as_bytes() >= start.as_bytes() && key.as_bytes() < end.as_slice();
        let l = LeaseId::new(i64::MAX);
        for m in [Mode::Exclusive, Mode::Shared] {
            assert!(inside(&k.hold(m, l)) && inside(&k.waiter(m, l)));
            assert!(!inside(&k.grant(m, l)));
        }
        assert!(!inside(&k.cancel_marker(l, 7)));
        // Nor a key of a lock whose escaped key starts with this one's.
        let kq = r.lock("n", "c", "kq");
        assert!(!inside(&kq.hold(Mode::Exclusive, l)) && !inside(&kq.waiter(Mode::Exclusive, l)));
        let k_q = r.lock("n", "c", "k/q");
        assert!(!inside(&k_q.waiter(Mode::Exclusive, l)));
    }

    #[test]
    fn sub_keys() {
        let k = RootKeys::new("/p/").lock("n", "c", "k");
        let l = LeaseId::new(255);
        assert_eq!(
            k.waiter(Mode::Exclusive, l),
            "/p/locks/n/c/k/q/x/00000000000000ff"
        );
        assert_eq!(
            k.hold(Mode::Shared, l),
            "/p/locks/n/c/k/h/s/00000000000000ff"
        );
        assert_eq!(
            k.hold_for_grant(k.grant(Mode::Shared, l).as_bytes())
                .unwrap(),
            k.hold(Mode::Shared, l)
        );
        assert_eq!(
            k.hold_for_waiter(k.waiter(Mode::Shared, l).as_bytes())
                .unwrap(),
            k.hold(Mode::Shared, l)
        );
        assert_eq!(k.hold_for_waiter(k.hold(Mode::Shared, l).as_bytes()), None);
        assert_eq!(
            k.grant_for_hold(k.hold(Mode::Exclusive, l).as_bytes()),
            k.grant(Mode::Exclusive, l).into_bytes()
        );
        assert!(k.waiter(Mode::Shared, l).starts_with(&k.queue()));
        assert!(k
            .hold(Mode::Shared, l)
            .starts_with(&k.holds_of(Mode::Shared)));
    }

    #[test]
    fn a_lease_ends_with_its_marker_or_its_session_record_only() {
        let k = RootKeys::new("/p/");
        let l = LeaseId::new(0x3211a22c6da3b70c);
        assert_eq!(k.lease_marker(l), "/p/leases/3211a22c6da3b70c");
        assert_eq!(k.ended_lease(k.lease_marker(l).as_bytes()), Some(l));
        assert_eq!(k.ended_lease(k.session(l).as_bytes()), Some(l));
        for other in [
            k.session_forced(l, 7),
            k.owner_session("spiffe://t/a", l),
            k.lock("n", "c", "k").hold(Mode::Exclusive, l),
            "/q/leases/3211a22c6da3b70c".to_owned(),
            "/p/leases/3211A22C6DA3B70C".to_owned(),
            "/p/leases/3211a22c6da3b70".to_owned(),
            "/p/leases/".to_owned(),
        ] {
            assert_eq!(k.ended_lease(other.as_bytes()), None, "{other}");
        }
    }

    #[test]
    fn lease_ranges_hold_lease_keys_only() {
        let k = RootKeys::new("/p/").lock("n", "c", "k");
        let l = LeaseId::new(0x3211a22c6da3b70c);
        for m in [Mode::Exclusive, Mode::Shared] {
            for key in [k.waiter(m, l), k.hold(m, l), k.grant(m, l)] {
                assert!(k.in_lease_ranges(key.as_bytes()) && k.is_lease_key(key.as_bytes()));
            }
        }
        for stray in [
            "q/x/junk",
            "q/junk",
            "h/",
            "g/x/",
            "q/y/0000000000000000",
            "h/x/fffffffffffffffff0",
        ] {
            let key = format!("{}{stray}", k.base());
            assert!(!k.in_lease_ranges(key.as_bytes()), "{stray}");
        }
        // Inside a range, but not a lease key: reported by lock_state.
        let odd = format!("{}q/x/1", k.base());
        assert!(k.in_lease_ranges(odd.as_bytes()) && !k.is_lease_key(odd.as_bytes()));
        let c = k.cancel_marker(l, 7);
        assert!(!k.in_lease_ranges(c.as_bytes()));
        // The bounds themselves: the smallest and, inclusive, the largest lease id.
        let (start, end) = k.lease_range('g', Mode::Shared);
        assert_eq!(start, "/p/locks/n/c/k/g/s/0000000000000000");
        assert_eq!(end, b"/p/locks/n/c/k/g/s/ffffffffffffffff\0");
    }

    /// The keys built by hand are the formatted forms, and the range check answers as
    /// the ranges do, for lease ids at the edges (negative ids print as their two's
    /// complement, as `{:016x}` does).
    #[test]
    fn hand_built_keys_match_their_formatted_forms() {
        let r = RootKeys::new("/p");
        let k = r.lock("n", "c", "a/b c%");
        assert_eq!(k.base(), "/p/locks/n/c/a%2Fb%20c%25/");
        assert_eq!(r.epoch(), "/p/config/epoch");
        for raw in [0, 1, 0x3211a22c6da3b70c, i64::MAX, -1, i64::MIN] {
            let l = LeaseId::new(raw);
            for m in [Mode::Exclusive, Mode::Shared] {
                let s = m.segment();
                let b = k.base();
                assert_eq!(k.waiter(m, l), format!("{b}q/{s}/{raw:016x}"));
                assert_eq!(k.hold(m, l), format!("{b}h/{s}/{raw:016x}"));
                assert_eq!(k.grant(m, l), format!("{b}g/{s}/{raw:016x}"));
                assert_eq!(k.queue_of(m), format!("{b}q/{s}/"));
                assert_eq!(k.holds_of(m), format!("{b}h/{s}/"));
                assert_eq!(k.grants_of(m), format!("{b}g/{s}/"));
            }
            for attempt in [0, 7, 10, u64::MAX] {
                assert_eq!(
                    k.cancel_marker(l, attempt),
                    format!("{}c/{raw:016x}/{attempt}", k.base())
                );
            }
        }
        let in_ranges = |key: &[u8]| {
            ['q', 'h', 'g'].into_iter().any(|sub| {
                [Mode::Exclusive, Mode::Shared].into_iter().any(|m| {
                    let (start, end) = k.lease_range(sub, m);
                    key >= start.as_bytes() && key < end.as_slice()
                })
            })
        };
        let b = k.base();
        for rest in [
            "h/x/0000000000000000",
            "h/x/000000000000000",
            "h/x/ffffffffffffffff",
            "h/x/ffffffffffffffff\0",
            "h/x/ffffffffffffffff\0a",
            "h/x/fffffffffffffffg",
            "g/s/1",
            "q/x/",
            "q/x",
            "c/x/0000000000000000",
            "h/t/0000000000000000",
            "",
        ] {
            let key = format!("{b}{rest}");
            assert_eq!(
                k.in_lease_ranges(key.as_bytes()),
                in_ranges(key.as_bytes()),
                "{rest:?}"
            );
        }
        assert!(!k.in_lease_ranges(b"/p/locks/n/c/other/h/x/0000000000000000"));
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end("a/"), b"a0".to_vec());
        assert_eq!(prefix_end("\u{7f}"), vec![0x80]);
    }
}
