//! How a hold ended, told from the one revision that deleted its hold key: the rule the
//! audit tailer and the chaos checker both apply (see [`crate::keys`] for the layout).

use super::values::ForcedGrant;

/// How a hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEnd {
    /// Its holder released it (or its release was finished by a retry).
    Released,
    /// Its lease ended (expired, or revoked by closing the session) while it was held.
    Expired,
    /// An operator force-released it.
    Forced,
}

/// What the revision that deleted a hold key did to the hold's grant record
/// (`g/<m>/<lease>`, same lock, mode and lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordChange<'a> {
    /// Not changed in that revision (or the hold had none).
    Untouched,
    /// Deleted in that revision.
    Deleted,
    /// Put in that revision, with this value.
    Put(&'a [u8]),
}

impl HoldEnd {
    /// How a hold ended, from the revision that deleted its hold key:
    ///
    /// - its grant record deleted: [`HoldEnd::Released`];
    /// - its grant record put as `{"forced": …}` ([`ForcedGrant`]): [`HoldEnd::Forced`];
    /// - otherwise, its lease's marker (`leases/<lease>`, or a detached session's
    ///   `sessions/<lease>`) deleted in the same revision (`lease_ended`):
    ///   [`HoldEnd::Expired`];
    /// - otherwise, a hold granted without a grant record (`had_record ==
    ///   Some(false)`, from the hold's stored [`HoldValue`](super::HoldValue)):
    ///   [`HoldEnd::Released`] (its release deletes the hold key alone);
    /// - otherwise [`HoldEnd::Expired`]: a hold with a grant record whose record
    ///   outlives it, or one whose stored value is unknown (history without it).
    pub fn classify(had_record: Option<bool>, record: RecordChange<'_>, lease_ended: bool) -> Self {
        match record {
            RecordChange::Deleted => return HoldEnd::Released,
            RecordChange::Put(v) if ForcedGrant::is_forced(v) => return HoldEnd::Forced,
            _ => {}
        }
        if lease_ended {
            HoldEnd::Expired
        } else if had_record == Some(false) {
            HoldEnd::Released
        } else {
            HoldEnd::Expired
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORCED: &[u8] =
        br#"{"forced":{"request_id":"r1","requester":"alice","reason":"stuck holder"}}"#;

    #[test]
    fn every_combination_is_classified_by_the_documented_rule() {
        use HoldEnd::*;
        use RecordChange::*;
        let cases: &[(Option<bool>, RecordChange<'_>, bool, HoldEnd)] = &[
            // A hold with a grant record: the record tells.
            (Some(true), Deleted, false, Released),
            (Some(true), Put(FORCED), false, Forced),
            (Some(true), Untouched, true, Expired),
            // Its lease ended but no marker went with it (a lease from before markers).
            (Some(true), Untouched, false, Expired),
            // A hold without one: the lease's marker tells.
            (Some(false), Untouched, false, Released),
            (Some(false), Untouched, true, Expired),
            (Some(false), Put(FORCED), false, Forced),
            // A put that is not a force marker says nothing.
            (Some(false), Put(b"{}"), false, Released),
            (Some(true), Put(b"{}"), false, Expired),
            // Unknown value: release and force still show; else the cautious answer.
            (None, Deleted, false, Released),
            (None, Put(FORCED), true, Forced),
            (None, Untouched, true, Expired),
            (None, Untouched, false, Expired),
        ];
        for &(had, change, ended, want) in cases {
            assert_eq!(
                HoldEnd::classify(had, change, ended),
                want,
                "record {had:?}, change {change:?}, lease ended {ended}"
            );
        }
    }
}
