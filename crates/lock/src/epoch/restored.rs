//! Waiters a restore brought back. A snapshot keeps the `q/` keys of every session whose
//! lease it kept; after the restore nothing waits behind such a key (its acquire ended
//! in the lost history), so it never becomes a hold, and every waiter queued after it
//! waits until its session ends, which for a live client may be never.
//!
//! Rule: advancing the epoch for a restore deletes every waiter key under `locks/`
//! created at or before the revision the advance read. An acquire that is still waiting
//! finds its key gone and enqueues again at the back (the acquire's decide step), so
//! the only waiters lost are the ones nobody waits on. Holds are left alone: a hold
//! brought back may still be held, and its holder has no other way to learn it ended;
//! one whose holder released it in the lost history ends with its session, at the
//! session's next acquire of the lock, or by a force release.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::error::{ErrorKind, Result};
use crate::retry;
use palisade_api::keys::{LockEntry, RootKeys};

/// Deletes the waiter keys created at or before `revision` (each only if it is still
/// the key that was read: same create revision). Returns how many it deleted.
///
/// # Errors
///
/// [`ErrorKind::QuorumLost`] when etcd does not answer before `deadline`.
pub(crate) async fn drop_waiters_up_to(
    client: &Client,
    keys: &RootKeys,
    revision: i64,
    deadline: Instant,
    per_request: Duration,
) -> Result<usize> {
    let prefix = keys.locks();
    let resp = retry::call("epoch.restored_waiters", deadline, per_request, || {
        let (mut c, prefix) = (client.clone(), prefix.clone());
        async move {
            c.get(
                prefix,
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
        }
    })
    .await
    .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
    let waiters: Vec<(Vec<u8>, i64)> = resp
        .kvs()
        .iter()
        .filter(|kv| kv.create_revision() <= revision)
        .filter(|kv| {
            keys.parse_lock_entry(kv.key())
                .is_some_and(|e| matches!(e.entry, LockEntry::Waiter(..)))
        })
        .map(|kv| (kv.key().to_vec(), kv.create_revision()))
        .collect();
    let mut dropped = 0;
    for (key, created) in waiters {
        let resp = retry::call("epoch.drop_waiter", deadline, per_request, || {
            let (mut c, key) = (client.clone(), key.clone());
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    created,
                )])
                .and_then([TxnOp::delete(key, None)]);
            async move { c.txn(txn).await }
        })
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        dropped += usize::from(resp.succeeded());
    }
    Ok(dropped)
}
