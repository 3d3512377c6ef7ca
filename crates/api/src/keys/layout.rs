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

    /// The cancel marker of one acquire request: `c/<lease>/<request>` (see
    /// [`crate::keys`]; `request` is [`HoldValue::request`](crate::keys::HoldValue::request)).
    /// A key-creating Txn of that request that reaches etcd after it does nothing; a
    /// retry of the same attempt is another request, and is not stopped by it.
    pub fn cancel_marker(&self, lease: LeaseId, request: u64) -> String {
        let mut key = self.sub_key(b'c', None, Some(lease));
        key.push('/');
        key.push_str(itoa_u64(request, &mut [0; 20]));
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
mod tests;
