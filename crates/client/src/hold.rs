//! [`RemoteHold`]: a held lock, its loss signal and its release.

use std::time::Duration;

use palisade_api::wire::ReleaseBody;
use palisade_api::Mode;
use palisade_fence::{FencingToken, Revision};
use tokio::time::Instant;

use crate::error::ClientError;
use crate::release::{self, RELEASE_BUDGET};
use crate::session::ClientSession;

/// Why a [`RemoteHold`] is no longer held: what [`RemoteHold::loss`] tells once
/// [`RemoteHold::lost`] completed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldLoss {
    /// The session ended (expired, closed, or no renewal succeeded for a whole TTL):
    /// every hold of it is gone.
    SessionEnded,
    /// The hold was force-released (two admins) while its session lived; the service
    /// told the session's keepalive so.
    Forced {
        /// The force release request that ended it.
        request_id: String,
    },
}

/// A held lock. Send [`RemoteHold::token`] with every write to the resource; stop when
/// [`RemoteHold::lost`] completes.
pub struct RemoteHold {
    pub(crate) session: ClientSession,
    pub(crate) ns: String,
    pub(crate) class: String,
    pub(crate) key: String,
    pub(crate) mode: Mode,
    pub(crate) token: Option<FencingToken>,
    pub(crate) grant_rev: Option<Revision>,
    pub(crate) done: bool,
}

impl std::fmt::Debug for RemoteHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteHold")
            .field("lock", &(&self.ns, &self.class, &self.key))
            .field("mode", &self.mode)
            .field("token", &self.token)
            .finish()
    }
}

impl RemoteHold {
    /// The fencing token; `None` for an unprotected grant (open class, etcd down).
    pub fn token(&self) -> Option<FencingToken> {
        self.token
    }

    /// The revision of the granting Txn.
    pub fn grant_rev(&self) -> Option<Revision> {
        self.grant_rev
    }

    /// Completes when the hold is gone: its session ended, or it was force-released
    /// (learnt from the session's next keepalive, at most a third of the TTL later).
    /// From then on the lock may be granted to someone else; [`RemoteHold::loss`] says
    /// why. Completes at once if it already is.
    pub async fn lost(&self) {
        let Some(rev) = self.grant_rev else {
            return self.session.lost().await;
        };
        tokio::select! {
            () = self.session.lost() => {}
            () = self.session.forced(rev) => {}
        }
    }

    /// Why the hold is gone, once it is known to be; `None` while it is held.
    pub fn loss(&self) -> Option<HoldLoss> {
        if let Some(request_id) = self.grant_rev.and_then(|r| self.session.forced_by(r)) {
            return Some(HoldLoss::Forced { request_id });
        }
        self.session.is_lost().then_some(HoldLoss::SessionEnded)
    }

    /// The session the hold belongs to.
    pub fn session(&self) -> &ClientSession {
        &self.session
    }

    fn release_body(&self) -> Option<ReleaseBody> {
        Some(ReleaseBody {
            session: self.session.id().to_owned(),
            namespace: self.ns.clone(),
            class: self.class.clone(),
            key: self.key.clone(),
            mode: self.mode,
            grant_rev: self.grant_rev?,
        })
    }

    /// Releases the hold, trying for up to 10 s (see [`RemoteHold::release_within`]).
    ///
    /// # Errors
    ///
    /// As [`RemoteHold::release_within`].
    pub async fn release(self) -> Result<(), ClientError> {
        self.release_within(RELEASE_BUDGET).await
    }

    /// Releases the hold. A release is idempotent (it names the hold's grant revision,
    /// so it never ends a later hold), so it is sent again, with backoff, while the
    /// answer is lost (no answer, a reset connection, a 5xx) until the service answers
    /// definitely or `budget` runs out. A retry that finds the hold gone counts as
    /// released: the earlier attempt committed, or the hold ended otherwise; either way
    /// this session no longer holds it.
    ///
    /// # Errors
    ///
    /// [`ClientErrorKind::OutcomeUnknown`](crate::ClientErrorKind::OutcomeUnknown) when
    /// `budget` ran out without a definite answer: the release then goes on in the
    /// background for as long as the session lives, so the hold is never left held
    /// silently. [`ProblemKind::NotHeld`](crate::ProblemKind::NotHeld) if the first
    /// attempt found the hold already gone, [`ProblemKind::HoldForced`](crate::ProblemKind::HoldForced)
    /// if it was force-released, and any other definite answer of the service.
    pub async fn release_within(mut self, budget: Duration) -> Result<(), ClientError> {
        self.done = true;
        let Some(body) = self.release_body() else {
            return Ok(());
        };
        let http = self.session.http();
        let result = release::send(http, &body, Instant::now() + budget).await;
        if matches!(&result, Err(e) if e.is_outcome_unknown()) {
            release::in_background(self.session.clone(), body);
        }
        result
    }
}

impl Drop for RemoteHold {
    /// A hold dropped without [`RemoteHold::release`] is released in the background,
    /// with the same retries, for as long as its session lives.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(body) = self.release_body() {
            release::in_background(self.session.clone(), body);
        }
    }
}
