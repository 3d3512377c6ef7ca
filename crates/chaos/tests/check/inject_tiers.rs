//! Rule (i), holds of one lock on two tiers, and rule (d)'s epochs per tier: a move of
//! the namespace from the home tier to tier `spare`, placed in real time by revision
//! marks, then each violation injected once.
//!
//! The valid history: the home tier's hold (epoch 1, revisions 12..15) ended before the
//! home mark at revision 20 was answered (t = 200); the spare tier's hold (epoch 2,
//! revisions 5..7) was granted after the spare mark at revision 3 was sent (t = 290).

use palisade_chaos::check::{check, ViolationKind};
use palisade_chaos::history::{Entry, Event, HoldEnd, RehomeOutcome};

use crate::assert_only;
use crate::model::{lock, RUNNER};

const SPARE: &str = "spare";

fn token(epoch: u16, rev: i64) -> u64 {
    (u64::from(epoch) << 48) | rev as u64
}

/// A hold of lock `a` on `tier` (`None`: the home tier).
#[derive(Clone, Copy)]
struct Hold {
    tier: Option<&'static str>,
    epoch: u16,
    grant_rev: i64,
    end_rev: i64,
    lease: i64,
}

const OLD: Hold = Hold {
    tier: None,
    epoch: 1,
    grant_rev: 12,
    end_rev: 15,
    lease: 0xa1,
};

const NEW: Hold = Hold {
    tier: Some(SPARE),
    epoch: 2,
    grant_rev: 5,
    end_rev: 7,
    lease: 0xb1,
};

fn push(h: &mut Vec<Entry>, at_ns: u64, worker: u32, event: Event) -> usize {
    h.push(Entry {
        at_ns,
        worker,
        event,
    });
    h.len() - 1
}

/// A revision mark: `tier` at `revision`, asked at `asked`, answered 10 ns later.
fn mark(h: &mut Vec<Entry>, tier: Option<&str>, revision: i64, asked: u64) -> usize {
    let event = Event::RevisionSeen {
        tier: tier.map(str::to_owned),
        space: 0,
        revision,
        asked_ns: asked,
    };
    push(h, asked + 10, RUNNER, event)
}

/// The hold as etcd's history shows it, with its audit rows; returns the hold's index.
fn hold(h: &mut Vec<Entry>, at_ns: u64, x: Hold) -> usize {
    let t = token(x.epoch, x.grant_rev);
    let i = push(
        h,
        at_ns,
        RUNNER,
        Event::EtcdHold {
            lock: lock("a"),
            epoch: x.epoch,
            grant_rev: x.grant_rev,
            end_rev: Some(x.end_rev),
            exclusive: true,
            end: HoldEnd::Released,
            space: 0,
            session: Some(x.lease),
            tier: x.tier.map(str::to_owned),
        },
    );
    for (kind, revision) in [("grant", x.grant_rev), ("release", x.end_rev)] {
        let row = Event::AuditRow {
            kind: kind.into(),
            lock: Some(lock("a")),
            resource: None,
            token: Some(t),
            revision: Some(revision),
        };
        push(h, at_ns + 1, RUNNER, row);
    }
    i
}

/// The move: marks of both tiers, the new tier's epoch advance and the rehome, then the
/// two holds read after the run. Returns the history and the holds' indices.
fn moved(old: Hold, new: Hold) -> (Vec<Entry>, usize, usize) {
    let mut h = Vec::new();
    mark(&mut h, None, 10, 90);
    mark(&mut h, None, 20, 190);
    let advance = Event::EpochAdvanced {
        epoch: new.epoch,
        tier: new.tier.map(str::to_owned),
    };
    push(&mut h, 250, RUNNER, advance);
    let rehome = Event::Rehome {
        ns: "orders".into(),
        from: "home".into(),
        to: SPARE.into(),
        outcome: RehomeOutcome::Moved { epoch: new.epoch },
    };
    push(&mut h, 260, RUNNER, rehome);
    mark(&mut h, new.tier, 3, 290);
    mark(&mut h, new.tier, 9, 390);
    let a = hold(&mut h, 1000, old);
    let b = hold(&mut h, 1010, new);
    (h, a, b)
}

#[test]
fn a_move_whose_holds_are_apart_and_ordered_passes() {
    let (h, _, _) = moved(OLD, NEW);
    let report = check(&h);
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.counts.rehomes_moved, 1);
    assert_eq!(report.counts.revision_marks, 4);
}

#[test]
fn an_old_tier_hold_that_outlives_a_new_tier_grant_overlaps_it() {
    // The old hold ends at revision 25, and a home mark at revision 22 sent at t = 450
    // saw it still there: after the new hold was granted (before t = 400).
    let old = Hold { end_rev: 25, ..OLD };
    let (mut h, a, b) = moved(old, NEW);
    mark(&mut h, None, 22, 450);
    assert_only(&check(&h), ViolationKind::TierHoldsOverlap, &[a, b]);
}

#[test]
fn an_overlap_no_mark_can_show_is_not_reported() {
    // The same late end, but no home mark between the new grant and it: the marks
    // cannot tell the two apart in time, so nothing is concluded.
    let old = Hold { end_rev: 25, ..OLD };
    let (h, _, _) = moved(old, NEW);
    let report = check(&h);
    assert!(report.is_ok(), "{report}");
}

#[test]
fn a_new_tier_token_below_an_old_tier_token_is_reported() {
    // The new tier grants in epoch 0 after the move: its token is below the old hold's.
    let new = Hold { epoch: 0, ..NEW };
    let (h, a, b) = moved(OLD, new);
    // The advance named epoch 2; the grant is in etcd's history only, so rule (d) has
    // nothing to say and (i) is the one that sees it.
    assert_only(&check(&h), ViolationKind::TierTokenNotAbove, &[a, b]);
}

/// A worker's acquire and grant of lock `a` on `tier`, after a home tier's epoch
/// advance to 3.
fn grant_after_home_advance(tier: Option<&str>) -> (Vec<Entry>, usize) {
    let mut h = Vec::new();
    let advance = Event::EpochAdvanced {
        epoch: 3,
        tier: None,
    };
    push(&mut h, 100, RUNNER, advance);
    push(&mut h, 200, 0, Event::AcquireInvoked { lock: lock("a") });
    let granted = push(
        &mut h,
        300,
        0,
        Event::Granted {
            lock: lock("a"),
            token: token(2, 40),
            session: 0xb2,
            grant_rev: 40,
            tier: tier.map(str::to_owned),
        },
    );
    (h, granted)
}

#[test]
fn an_epoch_advance_binds_only_its_own_tier() {
    // The home tier was restored and advanced to epoch 3 while the namespace lived on
    // the spare tier, whose epoch is still 2: its grants are not from an old epoch.
    let (h, _) = grant_after_home_advance(Some(SPARE));
    let report = check(&h);
    assert!(report.is_ok(), "{report}");
    // The same grant on the home tier is.
    let (h, granted) = grant_after_home_advance(None);
    assert_only(&check(&h), ViolationKind::TokenFromOldEpoch, &[granted, 0]);
}
