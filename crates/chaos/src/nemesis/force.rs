//! The force-release fault: two admins force a held lock free, racing its holder.

use std::time::Duration;

use serde_json::json;

use crate::error::ChaosError;
use crate::history::{Event, ForceOutcome, Phase};
use crate::runner::{Run, ADMIN, ADMIN2};
use crate::schedule::PlannedFault;
use palisade_api::routes;
use palisade_client::ProblemKind;

impl Run {
    /// Two rounds: in each, one admin requests a force release of a lock a worker holds
    /// (by its grant revision, or every holder at request time), and a second admin
    /// approves it through the other replica: at once in the first round, after
    /// `pick % 1500` ms in the second, in which the worker may release and acquire again.
    pub(super) async fn force_release(&mut self, f: &PlannedFault) -> Result<(), ChaosError> {
        let kind = f.kind;
        let delay = Duration::from_millis(u64::from(f.pick % 1500));
        self.fault(
            kind,
            Phase::Start,
            format!(
                "force releases of held locks, approved at once and {} ms later",
                delay.as_millis()
            ),
        );
        let mut ends = Vec::new();
        for (round, delay) in [Duration::ZERO, delay].into_iter().enumerate() {
            let pick = f.pick.wrapping_add(round as u32);
            ends.push(self.force_one(pick, delay).await?);
        }
        tokio::time::sleep(f.hold).await;
        self.fault(kind, Phase::End, ends.join("; "));
        Ok(())
    }

    /// One force release of the lock of holder `pick % holders`, approved after `delay`;
    /// says what came of it.
    async fn force_one(&mut self, pick: u32, delay: Duration) -> Result<String, ChaosError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        let held = loop {
            match self.holding.pick(pick) {
                Some(h) => break Some(h),
                None if tokio::time::Instant::now() >= deadline => break None,
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let Some((worker, lock, token)) = held else {
            return Ok("no worker held a lock".into());
        };
        let by_grant = (pick >> 16) & 1 == 1;
        let grant_rev = token & ((1 << 48) - 1);
        let replica = pick as usize % self.replicas.count();
        let mut body = json!({
            "namespace": lock.ns,
            "class": lock.class,
            "key": lock.key,
            "reason": "chaos: a force release racing the holder",
        });
        if by_grant {
            body["grant_rev"] = json!(grant_rev);
        }
        let requested = self
            .admin_as(replica, ADMIN)?
            .call_json("POST", routes::FORCE_RELEASES, Some(body))
            .await;
        let v = match requested {
            Ok(v) => v,
            Err(e) => {
                return Ok(format!(
                    "{} of worker {worker}: the request was refused: {e}",
                    lock.key
                ))
            }
        };
        let request_id = v["id"].as_str().unwrap_or_default().to_owned();
        self.record(Event::ForceRequested {
            lock: lock.clone(),
            request_id: request_id.clone(),
            targets: revisions(&v["targets"]),
        });
        tokio::time::sleep(delay).await;
        // An approval that fails part way is finished by approving again (it lists the
        // holds the earlier attempt deleted): up to three attempts.
        let approver = self.admin_as((replica + 1) % self.replicas.count(), ADMIN2)?;
        let path = routes::approve_force_release(&request_id);
        let mut outcome = ForceOutcome::Unknown {
            reason: "not approved".into(),
        };
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            outcome = match approver.call_json("POST", &path, None).await {
                Ok(v) => ForceOutcome::Released {
                    grant_revs: revisions(&v["released"]),
                },
                Err(e) if e.problem() == Some(ProblemKind::ForceTargetGone) => {
                    ForceOutcome::TargetGone
                }
                Err(e) => ForceOutcome::Unknown {
                    reason: e.to_string(),
                },
            };
            if !matches!(outcome, ForceOutcome::Unknown { .. }) {
                break;
            }
        }
        let end = format!(
            "{} of worker {worker} (grant {grant_rev}{}), approved after {} ms: {outcome:?}",
            lock.key,
            if by_grant { ", named" } else { "" },
            delay.as_millis()
        );
        self.record(Event::ForceApproved {
            lock,
            request_id,
            outcome,
        });
        Ok(end)
    }
}

/// The `grant_rev` of each object of a JSON array (force release targets or released
/// holds).
fn revisions(v: &serde_json::Value) -> Vec<i64> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["grant_rev"].as_i64())
        .collect()
}
