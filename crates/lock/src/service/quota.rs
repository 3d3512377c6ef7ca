//! `held_lease_quota`: slots in etcd, one per hold or wait of a namespace.
//!
//! A slot is the key `<root>quota/<ns>/<session>/<mode>/<class>/<escaped key>`, put on
//! the session's lease. It is taken before an acquire starts waiting and deleted when
//! the wait fails, when the hold is released (whatever the release answers), or, with
//! the lease, when the session is closed or expires. Taking one is optimistic and
//! atomic across replicas: count the namespace's slots at revision R; if fewer than the
//! quota, put the slot in a Txn whose compare requires every key of the namespace's
//! slot range to have been created at or before R. A slot created by anyone since R
//! fails the compare and the count is redone; slots deleted since R only lower the true
//! count. So the number of slots never exceeds the quota.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use super::problem::{Problem, ProblemKind};
use crate::keys::{escape_key, prefix_end};
use crate::locker::{LockName, Locker};
use crate::model::{LeaseId, Mode};

/// The slot key of a hold or wait.
pub(super) fn slot_key(locker: &Locker, name: &LockName, lease: LeaseId, mode: Mode) -> String {
    format!(
        "{}{lease}/{}/{}/{}",
        locker.inner.keys.quota(&name.ns),
        mode.segment(),
        name.class,
        escape_key(&name.key)
    )
}

fn upstream(e: &etcd_client::Error) -> Problem {
    tracing::error!(error = %e, "quota slot: etcd error");
    Problem::new(
        ProblemKind::QuorumLost,
        "etcd did not answer the quota check",
    )
}

/// A taken slot; deleted on drop (on a spawned task) unless [`Slot::keep`] was called,
/// so a wait that fails or whose client goes away stops counting.
pub(super) struct Slot {
    locker: Locker,
    key: Option<String>,
}

impl Slot {
    /// The hold was granted: the slot stays until release or the session's end.
    pub(super) fn keep(mut self) {
        self.key = None;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut client = self.locker.client().clone();
            tokio::spawn(async move {
                if let Err(e) = client.delete(key, None).await {
                    tracing::warn!(error = %e, "quota slot not deleted; it goes with its session");
                }
            });
        }
    }
}

/// Deletes the slot of a hold (after a release).
pub(super) async fn free(locker: &Locker, key: String) {
    if let Err(e) = locker.client().clone().delete(key, None).await {
        tracing::warn!(error = %e, "quota slot not deleted; it goes with its session");
    }
}

/// Takes a slot of `name`'s namespace for `lease`, if fewer than `quota` are taken.
///
/// # Errors
///
/// 429 `quota-exceeded` naming `held_lease_quota` when the namespace has `quota`
/// slots; 503 `quorum-lost` if etcd does not answer or the count keeps changing
/// until `deadline`.
pub(super) async fn take(
    locker: &Locker,
    name: &LockName,
    lease: LeaseId,
    mode: Mode,
    quota: u32,
    deadline: Instant,
) -> Result<Slot, Problem> {
    let prefix = locker.inner.keys.quota(&name.ns);
    let end = prefix_end(&prefix);
    let key = slot_key(locker, name, lease, mode);
    let mut client = locker.client().clone();
    let mut attempt = 0u32;
    loop {
        let resp = client
            .get(
                prefix.as_str(),
                Some(GetOptions::new().with_range(end.clone()).with_count_only()),
            )
            .await
            .map_err(|e| upstream(&e))?;
        if resp.count() >= i64::from(quota) {
            return Err(Problem::new(
                ProblemKind::QuotaExceeded,
                format!(
                    "held_lease_quota of namespace {} reached: {quota} holds and waits",
                    name.ns
                ),
            ));
        }
        let rev = resp
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        let txn = Txn::new()
            .when([
                Compare::create_revision(prefix.as_str(), CompareOp::Less, rev + 1)
                    .with_range(end.clone()),
            ])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(lease.get())),
            )]);
        let done = client.txn(txn).await.map_err(|e| upstream(&e))?;
        if done.succeeded() {
            return Ok(Slot {
                locker: locker.clone(),
                key: Some(key),
            });
        }
        if Instant::now() >= deadline {
            return Err(Problem::new(
                ProblemKind::QuorumLost,
                "the quota count kept changing until the wait deadline",
            ));
        }
        // Someone else took a slot since the count: back off a little, with jitter.
        attempt = attempt.saturating_add(1);
        let jitter = u64::from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .subsec_nanos(),
        ) % 7;
        tokio::time::sleep(Duration::from_millis(
            1 + jitter + u64::from(attempt.min(20)),
        ))
        .await;
    }
}
