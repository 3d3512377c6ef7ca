//! The rehome fault: the workers' namespace moved to the other etcd cluster tier
//! through a replica's admin API (`POST /v1/namespaces/{ns}/rehome`), and back on the
//! next occurrence.
//!
//! The drain is the plan's `hold` (1.5–4 s): long enough for the holds of a worker that
//! writes and releases as usual to end, short enough that a hold kept longer (a worker
//! pausing for 1.5 TTL before a write) makes the service roll the move back. Both
//! outcomes are recorded ([`Event::Rehome`]); a move also records the new tier's epoch
//! advance ([`Event::EpochAdvanced`] naming the tier), as the restore fault does.

use std::time::Duration;

use palisade_api::wire::{RehomeBody, RehomeView};
use palisade_client::ProblemKind;

use crate::error::ChaosError;
use crate::history::{Event, Phase, RehomeOutcome};
use crate::runner::{retry, tier_field, Run, HOME_TIER, SPARE_TIER};
use crate::schedule::PlannedFault;
use crate::worker::NAMESPACE;

/// Time for the rest of a rehome (fences, copy, epoch advance, switch) on top of its
/// drain.
const BEYOND_DRAIN: Duration = Duration::from_secs(15);
/// How long a rehome whose answer was lost is sent again (the same request resumes
/// the move recorded on the home tier, or finds it rolled back and starts it anew).
const RESEND_FOR: Duration = Duration::from_secs(60);

impl Run {
    pub(super) async fn rehome(&mut self, f: &PlannedFault) -> Result<(), ChaosError> {
        let kind = f.kind;
        let from = self.ns_tier.clone();
        let to = if from == HOME_TIER {
            SPARE_TIER
        } else {
            HOME_TIER
        };
        let i = f.pick as usize % self.replicas.count();
        let drain = f.hold;
        self.fault(
            kind,
            Phase::Start,
            format!(
                "namespace {NAMESPACE} moved from tier {from} to tier {to} through replica {i} \
                 (drain {} ms)",
                drain.as_millis()
            ),
        );
        let admin = self.admin(i)?;
        let path = palisade_api::routes::rehome(NAMESPACE);
        let body = serde_json::to_value(RehomeBody {
            to: to.into(),
            drain_ms: Some(u64::try_from(drain.as_millis()).unwrap_or(u64::MAX)),
        })
        .map_err(|e| ChaosError::NotReady(format!("a rehome's body ({e})")))?;
        let answer = retry(RESEND_FOR, || async {
            let call = admin.call_json("POST", &path, Some(body.clone()));
            match tokio::time::timeout(drain + BEYOND_DRAIN, call).await {
                Ok(Ok(v)) => serde_json::from_value::<RehomeView>(v)
                    .map(Ok)
                    .map_err(|e| ChaosError::NotReady(format!("a rehome's answer ({e})"))),
                Ok(Err(e)) if e.problem() == Some(ProblemKind::NamespaceMoving) => {
                    Ok(Err(e.to_string()))
                }
                Ok(Err(e)) => Err(ChaosError::service("rehoming the namespace")(e)),
                Err(_) => Err(ChaosError::NotReady("an answer to the rehome".into())),
            }
        })
        .await?;
        let (outcome, detail) = match answer {
            Ok(view) => {
                let epoch = view.epoch.epoch.get();
                self.record(Event::EpochAdvanced {
                    epoch,
                    tier: tier_field(to),
                });
                to.clone_into(&mut self.ns_tier);
                (
                    RehomeOutcome::Moved { epoch },
                    format!("namespace {NAMESPACE} lives on tier {to} at epoch {epoch}"),
                )
            }
            Err(reason) => (
                RehomeOutcome::RolledBack {
                    reason: reason.clone(),
                },
                format!("namespace {NAMESPACE} stays on tier {from}: {reason}"),
            ),
        };
        self.record(Event::Rehome {
            ns: NAMESPACE.into(),
            from,
            to: to.into(),
            outcome,
        });
        self.fault(kind, Phase::End, detail);
        Ok(())
    }
}
