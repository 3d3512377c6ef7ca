//! `held_lease_quota`: slots in etcd, one per session opened with the namespace and one
//! per hold or wait of the namespace. The service takes them; the core owns the etcd
//! side.
//!
//! A hold's or wait's slot is the key `<root>quota/<ns>/<session>/<mode>/<class>/<escaped
//! key>`, a session's `<root>quota/<ns>/<session>/session`, both put on the session's
//! lease. It is taken before an acquire starts waiting and deleted when the wait fails,
//! in the Txn that releases or force-releases the hold (never by a release that found no
//! such hold), or, with the lease, when the session is closed or expires. Taking one is optimistic and
//! atomic across replicas: count the namespace's slots at revision R; if fewer than the
//! quota, put the slot in a Txn whose compare requires every key of the namespace's
//! slot range to have been created at or before R. A slot created by anyone since R
//! fails the compare and the count is redone; slots deleted since R only lower the true
//! count. So the number of slots never exceeds the quota.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use tokio::time::Instant;
use tracing::Instrument;

use palisade_api::keys::prefix_end;
use palisade_api::{LeaseId, Mode};
use palisade_fence::Revision;

use crate::error::{Error, ErrorKind, Result};
use crate::locker::Locker;
use crate::name::LockName;
use crate::retry::{self, CallError};

/// The wait's own deadline ran out before etcd was seen failing: deadline exceeded;
/// else etcd did not answer the check: quorum lost.
fn upstream(e: CallError) -> Error {
    if !matches!(e, CallError::NoTime | CallError::Cut) {
        tracing::error!(error = ?e, "quota slot: etcd error");
    }
    e.into_caller_error(ErrorKind::QuorumLost)
}

/// A taken `held_lease_quota` slot; deleted on drop (on a spawned task) unless
/// [`QuotaSlot::keep`] was called, so a wait that fails or whose client goes away stops
/// counting.
#[derive(Debug)]
#[must_use = "a slot dropped is freed at once"]
pub struct QuotaSlot {
    locker: Locker,
    key: Option<String>,
}

impl QuotaSlot {
    /// The hold was granted: the slot stays until release or the session's end.
    pub fn keep(mut self) {
        self.key = None;
    }
}

impl Drop for QuotaSlot {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let locker = self.locker.clone();
            // In the request's span, so the delete's etcd span is traced under it.
            tokio::spawn(
                async move { free(&locker, key).await }.instrument(tracing::Span::current()),
            );
        }
    }
}

impl Locker {
    /// Takes a slot of `name`'s namespace for the hold or wait of `lease` in `mode`, if
    /// fewer than `quota` slots of the namespace are taken.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::QuotaExceeded`] when the namespace has `quota` slots;
    /// [`ErrorKind::QuorumLost`] if etcd does not answer or the count keeps changing
    /// until `deadline`; [`ErrorKind::DeadlineExceeded`] if `deadline` cut the check
    /// short.
    pub async fn take_quota_slot(
        &self,
        name: &LockName,
        lease: LeaseId,
        mode: Mode,
        quota: u32,
        deadline: Instant,
    ) -> Result<QuotaSlot> {
        let key = self
            .inner
            .keys
            .quota_slot(&name.ns, lease, mode, &name.class, &name.key);
        take_key(self, &name.ns, key, lease, quota, deadline).await
    }

    /// Takes the slot of a session opened with namespace `ns` (it lives as long as the
    /// session's lease), if fewer than `quota` slots of `ns` are taken.
    ///
    /// # Errors
    ///
    /// As [`Locker::take_quota_slot`].
    pub async fn take_session_quota_slot(
        &self,
        ns: &str,
        lease: LeaseId,
        quota: u32,
        deadline: Instant,
    ) -> Result<QuotaSlot> {
        let key = self.inner.keys.quota_session_slot(ns, lease);
        take_key(self, ns, key, lease, quota, deadline).await
    }
}

/// Deletes a slot, retrying transient failures (such as a dead member) for a few
/// request timeouts.
async fn free(locker: &Locker, key: String) {
    let per_request = locker.inner.request_timeout;
    let deleted = retry::call(
        "quota.free",
        Instant::now() + per_request * 3,
        per_request,
        || {
            let (mut c, key) = (locker.client().clone(), key.clone());
            async move { c.delete(key, None).await }
        },
    )
    .await;
    if let Err(e) = deleted {
        tracing::warn!(error = ?e, "quota slot not deleted; it goes with its session");
    }
}

async fn take_key(
    locker: &Locker,
    ns: &str,
    key: String,
    lease: LeaseId,
    quota: u32,
    deadline: Instant,
) -> Result<QuotaSlot> {
    let prefix = locker.inner.keys.quota(ns);
    let counted = CountedPut {
        spans: ["quota.count", "quota.take"],
        prefix: &prefix,
        limit: quota,
        ops: vec![TxnOp::put(
            key.as_str(),
            "",
            Some(PutOptions::new().with_lease(lease.get())),
        )],
        deadline,
    };
    match counted.commit(locker).await? {
        Some(_) => Ok(QuotaSlot {
            locker: locker.clone(),
            key: Some(key),
        }),
        None => Err(Error::new(ErrorKind::QuotaExceeded {
            ns: ns.to_owned(),
            quota,
        })),
    }
}

/// Puts that take one of at most `limit` keys under `prefix`, atomically across every
/// locker: count the keys under `prefix` at revision R; if fewer than `limit`, commit
/// `ops` (which put one more key there) in a Txn whose compare requires every key under
/// `prefix` to have been created at or before R. A key created by anyone since R fails
/// the compare and the count is redone; keys deleted since R only lower the true count.
/// So the number of keys never exceeds `limit`.
pub(crate) struct CountedPut<'a> {
    /// The `op` of its etcd calls' spans: the count's, then the Txn's.
    pub(crate) spans: [&'static str; 2],
    pub(crate) prefix: &'a str,
    pub(crate) limit: u32,
    pub(crate) ops: Vec<TxnOp>,
    pub(crate) deadline: Instant,
}

impl CountedPut<'_> {
    /// The revision of the Txn that committed `ops`, or `None` when `limit` keys exist.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::QuorumLost`] if etcd does not answer or the count keeps changing
    /// until the deadline; [`ErrorKind::DeadlineExceeded`] if the deadline cut a call
    /// short before etcd was seen failing.
    pub(crate) async fn commit(self, locker: &Locker) -> Result<Option<Revision>> {
        let end = prefix_end(self.prefix);
        let [count_op, take_op] = self.spans;
        // Every etcd call goes through the shared retry, which moves a request off a dead
        // member (etcd-client keeps sending some requests to it) until the deadline.
        let per_request = locker.inner.request_timeout;
        let mut attempt = 0u32;
        loop {
            let resp = retry::call(count_op, self.deadline, per_request, || {
                let (mut c, end) = (locker.client().clone(), end.clone());
                let prefix = self.prefix.to_owned();
                async move {
                    c.get(
                        prefix,
                        Some(GetOptions::new().with_range(end).with_count_only()),
                    )
                    .await
                }
            })
            .await
            .map_err(upstream)?;
            if resp.count() >= i64::from(self.limit) {
                return Ok(None);
            }
            let rev = resp
                .header()
                .map_or(0, etcd_client::ResponseHeader::revision);
            let txn = Txn::new()
                .when([
                    Compare::create_revision(self.prefix, CompareOp::Less, rev + 1)
                        .with_range(end.clone()),
                ])
                .and_then(self.ops.clone());
            // Safe to repeat: the puts are of this caller's own keys, and a repeat after
            // a lost answer fails the compare (the key is newer than R) and recounts.
            let done = retry::call(take_op, self.deadline, per_request, || {
                let (mut c, txn) = (locker.client().clone(), txn.clone());
                async move { c.txn(txn).await }
            })
            .await
            .map_err(upstream)?;
            if done.succeeded() {
                let rev = done
                    .header()
                    .map_or(0, etcd_client::ResponseHeader::revision);
                return Ok(Some(Revision::from_i64(rev).unwrap_or_default()));
            }
            if Instant::now() >= self.deadline {
                // The count kept changing until the deadline: etcd did not let it commit.
                return Err(Error::new(ErrorKind::QuorumLost));
            }
            // Someone else took a key since the count: back off a little, with jitter.
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
}
