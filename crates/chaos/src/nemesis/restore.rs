//! The restore fault: etcd restored from a snapshot taken before a gap, then the epoch
//! advanced.

use std::time::Duration;

use nix::sys::signal::Signal;
use palisade_testkit::RestoreMode;
use serde_json::json;

use crate::audit_rows::{self, Replayed};
use crate::error::ChaosError;
use crate::etcd_history::RevisionSpace;
use crate::etcd_history::{self, Head};
use crate::history::{Event, Phase};
use crate::runner::{epoch_field, retry, Run, REPLICAS, ROOT};
use crate::schedule::PlannedFault;
use palisade_api::keys::RootKeys;

impl Run {
    pub(super) async fn restore(&mut self, f: &PlannedFault) -> Result<(), ChaosError> {
        let kind = f.kind;
        let Some(snapshot) = self.snapshot.take() else {
            return Ok(());
        };
        self.fault(
            kind,
            Phase::Start,
            format!(
                "etcd restored from the snapshot at revision {}",
                snapshot.revision()
            ),
        );
        // Revision marks of the home tier wait for the new space (see `marks`).
        let space_cell = self.home_space.clone();
        let mut home_space = space_cell.lock().await;
        // The old cluster's history goes with it: read it to its very end. With the
        // replicas stopped nothing is granted or released; with the leader's followers
        // stopped nothing commits at all (not even a lease expiry), so what the leader
        // has applied is final.
        self.replicas.signal_all(Signal::SIGSTOP);
        // The whole root: a hold's end is told by its lease's marker too.
        let keys = RootKeys::new(ROOT);
        let prefix = keys.root().to_owned();
        // Let the audit tailer read the space first, while etcd still has quorum (after a
        // restore its backoff can leave it seconds behind).
        if let Ok(read) = etcd_history::read(
            &self.etcd.endpoints(),
            &prefix,
            self.space.from,
            Head::Linearizable,
            false,
        )
        .await
        {
            let last = read.last_lock_revision(&keys);
            let _ = audit_rows::wait_for_tailer(
                &self.audit_pool,
                read.cluster_id,
                last,
                Duration::from_secs(15),
            )
            .await;
        }
        let leader = self.etcd.leader().await;
        let followers: Vec<usize> = (0..self.etcd.member_count())
            .filter(|i| *i != leader)
            .collect();
        for i in &followers {
            self.etcd.pause(*i);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let endpoint = [self.etcd.endpoint(leader)];
        let read = etcd_history::read(
            &endpoint,
            &prefix,
            self.space.from,
            Head::Serializable,
            true,
        )
        .await;
        let read = match read {
            Ok(r) => r,
            Err(e) => {
                for i in &followers {
                    self.etcd.resume(*i);
                }
                self.replicas.signal_all(Signal::SIGCONT);
                return Err(e);
            }
        };
        let found = etcd_history::holds(&RootKeys::new(ROOT), &read, self.space, None);
        self.holds.extend(found.holds);
        self.unmatched_ends += found.unmatched_ends;
        // The last few changes (lease expiries since the tailer caught up): the tailer may
        // be watching a stopped follower, and then they are lost with the cluster, as in
        // any restore. The history says how far it got, so that the checker expects rows
        // only of what it could read.
        let last = read.last_lock_revision(&keys);
        let _ = audit_rows::wait_for_tailer(
            &self.audit_pool,
            read.cluster_id,
            last,
            Duration::from_secs(3),
        )
        .await;
        match audit_rows::tailer_through(&self.audit_pool, read.cluster_id).await {
            Ok(through) => self.record(Event::AuditCut {
                space: self.space.number,
                through: through.min(last),
            }),
            // Without it every event of the space must have its row.
            Err(e) => {
                tracing::warn!(error = %e, "the audit position before the restore is unknown")
            }
        }
        self.etcd
            .restore_in_place(&snapshot, RestoreMode::NewClusterId)
            .await;
        let cluster_id = self.etcd.cluster_id().await;
        self.replicas.signal_all(Signal::SIGCONT);

        let mut epoch = self.advance(0).await?;
        for i in 1..REPLICAS {
            // A replica that saw the other cluster id refuses until it is advanced itself.
            let serves = retry(Duration::from_millis(1500), || async {
                match self.epoch_of(i).await? {
                    (e, false) if e == epoch => Ok(()),
                    _ => Err(ChaosError::NotReady(format!(
                        "replica {i} on the new epoch"
                    ))),
                }
            })
            .await;
            if serves.is_err() {
                epoch = self.advance(i).await?;
            }
        }
        self.replayed.push(Replayed {
            cluster_id,
            through: snapshot.revision(),
            epoch,
        });
        self.space = RevisionSpace {
            epoch,
            from: snapshot.revision() + 1,
            number: self.space.number + 1,
        };
        *home_space = self.space.number;
        drop(home_space);
        self.fault(
            kind,
            Phase::End,
            format!("etcd cluster {cluster_id:x} serves epoch {epoch}"),
        );
        Ok(())
    }

    /// Advances the epoch through replica `i` (as an operator would after a restore).
    async fn advance(&self, i: usize) -> Result<u16, ChaosError> {
        let admin = self.admin(i)?;
        let v = retry(Duration::from_secs(30), || async {
            admin
                .call_json(
                    "POST",
                    "/v1/epoch/advance",
                    Some(json!({ "reason": "restore" })),
                )
                .await
                .map_err(ChaosError::service("advancing the epoch"))
        })
        .await?;
        let epoch = epoch_field(&v);
        self.record(Event::EpochAdvanced { epoch, tier: None });
        Ok(epoch)
    }
}
