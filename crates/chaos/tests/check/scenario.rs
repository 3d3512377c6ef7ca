//! One valid history that uses every kind of entry: four workers, two exclusive locks and a
//! shared one, a worker paused past its TTL whose stale writes are refused, concurrent and
//! indeterminate writes, unprotected writes, a forced release, faults, and a snapshot
//! restore that sends revisions back, brings back a hold that was in the snapshot, and
//! advances the epoch.

use palisade_chaos::history::{Entry, FaultKind, HoldEnd, LossReason, Phase, Target, WriteOutcome};

use crate::model::{lock, Sim};

pub(crate) fn scenario() -> Vec<Entry> {
    let mut sim = Sim::new();
    let (a, b, s) = (lock("a"), lock("b"), lock("s"));

    let h0 = sim.acquire(0, &a, true);
    assert!(matches!(
        sim.write(0, "row-a", Target::Postgres, Some(h0.token)),
        WriteOutcome::Committed { .. }
    ));
    sim.write(0, "/a", Target::Http, Some(h0.token));
    let h1 = sim.acquire(1, &b, true);
    sim.write(1, "row-b", Target::Postgres, Some(h1.token));

    // Concurrent writes of two workers, completed in the other order.
    let w0 = sim.begin_write(0, "row-a", Target::Postgres, Some(h0.token));
    let w1 = sim.begin_write(1, "row-b", Target::Postgres, Some(h1.token));
    sim.finish_write(&w1);
    sim.finish_write(&w0);

    // Worker 0 is paused past its TTL; worker 2 takes the lock and writes.
    sim.fault(FaultKind::PauseWorker, Phase::Start);
    sim.end_quietly(&h0, HoldEnd::Expired);
    let h2 = sim.acquire(2, &a, true);
    sim.write(2, "row-a", Target::Postgres, Some(h2.token));
    sim.fault(FaultKind::PauseWorker, Phase::End);
    // Worker 0 resumes and writes with its old token: refused where the new holder wrote,
    // admitted where it did not (the mark there is still its own token).
    let refused = sim.write(0, "row-a", Target::Postgres, Some(h0.token));
    assert!(matches!(refused, WriteOutcome::Rejected { highest: Some(t) } if t == h2.token));
    assert!(matches!(
        sim.write(0, "/a", Target::Http, Some(h0.token)),
        WriteOutcome::Committed { .. }
    ));
    sim.write(2, "/a", Target::Http, Some(h2.token));
    let refused = sim.write(0, "/a", Target::Http, Some(h0.token));
    assert!(matches!(refused, WriteOutcome::Rejected { .. }));
    // Then its client tells it the session is gone.
    sim.tell_lost(&h0, LossReason::SessionEnded);

    // Indeterminate writes: one reached the resource, one did not.
    sim.fault(FaultKind::KillEtcdLeader, Phase::Start);
    let w = sim.begin_write(2, "row-a", Target::Postgres, Some(h2.token));
    sim.finish_indeterminate(&w, true);
    let w = sim.begin_write(1, "row-b", Target::Postgres, Some(h1.token));
    sim.finish_indeterminate(&w, false);
    sim.fault(FaultKind::KillEtcdLeader, Phase::End);
    sim.write(2, "row-a", Target::Postgres, Some(h2.token));

    // Two shared holds of one lock overlap, as they may.
    let s1 = sim.acquire(1, &s, false);
    let s3 = sim.acquire(3, &s, false);
    sim.release(&s1);
    sim.release(&s3);

    // Unprotected writes to an advisory resource, one of them indeterminate and applied,
    // one indeterminate and lost.
    sim.write(3, "/legacy/report", Target::Http, None);
    sim.write(3, "/legacy/report", Target::Http, None);
    let w = sim.begin_write(3, "/legacy/report", Target::Http, None);
    sim.finish_indeterminate(&w, true);
    let w = sim.begin_write(3, "/legacy/other", Target::Http, None);
    sim.finish_indeterminate(&w, false);
    // A write without a token to a fenced resource is refused.
    sim.write(3, "row-a", Target::Postgres, None);

    sim.release(&h2);
    // Worker 1's release gets no answer in time; the client's retry lands later.
    sim.release_unknown(&h1);
    sim.fail_acquire(3, &b);

    // Worker 2 takes lock b and holds it across the restore below.
    let h6 = sim.acquire(2, &b, true);
    sim.write(2, "row-b", Target::Postgres, Some(h6.token));

    // An admin forces a release.
    let h3 = sim.acquire(3, &a, true);
    sim.write(3, "row-a", Target::Postgres, Some(h3.token));
    let request_id = sim.force_untold(&h3);

    // etcd is restored from the snapshot taken just after h6's grant: revisions go back,
    // h3's grant and force are undone, h6 comes back, the epoch advances.
    sim.fault(FaultKind::RestartPostgres, Phase::Start);
    sim.fault(FaultKind::RestartPostgres, Phase::End);
    let restored = sim.restore_and_advance(2, 0);
    assert_eq!(restored.len(), 1);
    assert_eq!(restored[0].token, h6.token);
    let h4 = sim.acquire(0, &a, true);
    assert!(h4.token > h3.token && (h4.token & 0xffff_ffff_ffff) <= (h3.token & 0xffff_ffff_ffff));
    sim.write(0, "row-a", Target::Postgres, Some(h4.token));
    // The forced holder, not told yet, writes on: refused. Then it is told.
    assert!(matches!(
        sim.write(3, "row-a", Target::Postgres, Some(h3.token)),
        WriteOutcome::Rejected { .. }
    ));
    let forced = LossReason::Forced {
        request_id: Some(request_id),
    };
    sim.tell_lost(&h3, forced);
    // Worker 2 still holds b (the restored hold): its old-epoch token is still the
    // newest on row-b. It releases b in the restored cluster; then worker 1 takes it.
    assert!(matches!(
        sim.write(2, "row-b", Target::Postgres, Some(h6.token)),
        WriteOutcome::Committed { .. }
    ));
    sim.release(&restored[0]);
    let h5 = sim.acquire(1, &b, true);
    sim.write(1, "row-b", Target::Postgres, Some(h5.token));
    sim.release(&h5);
    // After a newer-epoch token on row-b, the restored hold's token is refused.
    assert!(matches!(
        sim.write(2, "row-b", Target::Postgres, Some(h6.token)),
        WriteOutcome::Rejected { .. }
    ));
    // h4 is still held when the run ends.
    sim.finish()
}
