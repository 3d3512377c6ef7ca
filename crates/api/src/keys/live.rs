//! Which keys count: a hold, a waiter or a quota slot belongs to someone only while etcd
//! keeps it attached to the session lease it names. Such a key ends with its lease; a
//! key with no lease (lease 0: a copy made by `etcdctl make-mirror`, which copies keys
//! without their leases, or a key put by hand) or on another lease never does, so it
//! is no holder, no waiter and no slot, and whoever finds one may delete it.

use crate::ids::LeaseId;
use crate::keys::layout::LockKeys;

impl LockKeys {
    /// The lease a key of this lock names: `Some` for a key exactly
    /// `<q|h|g>/<x|s>/<lease>` ([`LockKeys::is_lease_key`]) whose lease is
    /// [`LeaseId::from_hex`]'s form, else `None`.
    pub fn named_lease(&self, key: &[u8]) -> Option<LeaseId> {
        if !self.is_lease_key(key) {
            return None;
        }
        let hex = std::str::from_utf8(&key[key.len() - 16..]).ok()?;
        LeaseId::from_hex(hex)
    }

    /// Whether a key in the lock's bounded `q/` or `h/` ranges is a live waiter or
    /// hold: it names a lease ([`LockKeys::named_lease`]) and `attached`, the lease
    /// etcd reports for it, is that lease. `false` for a key with no lease (0), on
    /// another lease, or of another shape: nothing Palisade writes looks like that,
    /// and no such key ever goes away by itself.
    pub fn is_live_entry(&self, key: &[u8], attached: i64) -> bool {
        attached != 0 && self.named_lease(key).map(LeaseId::get) == Some(attached)
    }
}

/// Whether a quota slot (`quota/<ns>/slot/<i>`) counts as taken: etcd keeps it on a
/// lease (`attached`, the lease etcd reports for it, is not 0). Every take puts the slot
/// on its session's lease; a slot with no lease is free to take, and the take's compare
/// (`lease == 0`, true of a missing key too) is this same rule, so the two never
/// disagree.
pub fn is_live_slot(attached: i64) -> bool {
    attached != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;
    use crate::keys::RootKeys;

    #[test]
    fn only_keys_on_the_lease_they_name_are_live() {
        let k = RootKeys::new("/p/").lock("ns", "c", "a/b");
        let l = LeaseId::new(0x2a);
        for key in [k.hold(Mode::Exclusive, l), k.waiter(Mode::Shared, l)] {
            assert_eq!(k.named_lease(key.as_bytes()), Some(l));
            assert!(k.is_live_entry(key.as_bytes(), 0x2a), "{key}");
            // Copied without its lease, or attached to another one.
            assert!(!k.is_live_entry(key.as_bytes(), 0), "{key}");
            assert!(!k.is_live_entry(key.as_bytes(), 0x2b), "{key}");
        }
        // Inside the ranges but not of the lease-key shape.
        let odd = format!("{}q/x/1", k.base());
        assert_eq!(k.named_lease(odd.as_bytes()), None);
        assert!(!k.is_live_entry(odd.as_bytes(), 1));
        let zero = format!("{}h/x/0000000000000000", k.base());
        assert!(!k.is_live_entry(zero.as_bytes(), 0));
    }

    #[test]
    fn only_slots_on_a_lease_are_taken() {
        assert!(is_live_slot(0x2a));
        assert!(!is_live_slot(0));
    }
}
