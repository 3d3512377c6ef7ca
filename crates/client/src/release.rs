//! The release of a hold when answers can be lost: one retry policy, used by
//! [`RemoteHold`](crate::RemoteHold), its drop, and [`Client::release`](crate::Client::release).

use std::time::Duration;

use palisade_api::routes;
use palisade_api::wire::ReleaseBody;
use tokio::time::Instant;

use crate::error::{ClientError, ClientErrorKind};
use crate::http::Http;
use crate::session::ClientSession;

/// How long [`RemoteHold::release`](crate::RemoteHold::release) tries before it reports
/// an unknown outcome.
pub(crate) const RELEASE_BUDGET: Duration = Duration::from_secs(10);

/// The longest one attempt may wait for its answer: a request lost on the way gets none.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);

/// The first pause between attempts; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Whether an attempt's failure leaves its outcome open, so sending it again may help:
/// no answer at all, or the service's own failure (5xx: etcd did not answer in time, or
/// a proxy in between failed). A 4xx is definite.
fn outcome_open(e: &ClientError) -> bool {
    e.kind() == &ClientErrorKind::Transport || e.status().is_some_and(|s| s >= 500)
}

/// Sends the release in `body` until the service answers it definitely or `deadline`
/// passes (see [`RemoteHold::release_within`](crate::RemoteHold::release_within)).
pub(crate) async fn send(
    http: &Http,
    body: &ReleaseBody,
    deadline: Instant,
) -> Result<(), ClientError> {
    let json = serde_json::to_value(body).unwrap_or_default();
    let mut pause = FIRST_PAUSE;
    let mut last: Option<ClientError> = None;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(ClientError::outcome_unknown(last));
        }
        let attempt = http.send_empty("POST", routes::RELEASE, Some(json.clone()));
        match tokio::time::timeout((deadline - now).min(ATTEMPT_TIMEOUT), attempt).await {
            Ok(Ok(())) => return Ok(()),
            // An earlier attempt's outcome was open: it committed, or the hold ended
            // otherwise. Either way the session no longer holds it.
            Ok(Err(e)) if e.is_not_held() && last.is_some() => return Ok(()),
            Ok(Err(e)) if outcome_open(&e) => last = Some(e),
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                last = Some(ClientError::transport(
                    http.base(),
                    format!("no answer within {} ms", ATTEMPT_TIMEOUT.as_millis()),
                ));
            }
        }
        tokio::time::sleep_until((Instant::now() + pause).min(deadline)).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// Keeps sending the release in `body` while its outcome stays unknown and `session`
/// lives (once the session is gone, so is the hold).
pub(crate) fn in_background(session: ClientSession, body: ReleaseBody) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    // Until it is answered, the session's next acquire of the lock names the hold in
    // `replaces` (see `ClientSession::acquire_with_meta`).
    let lock = (body.namespace.clone(), body.class.clone(), body.key.clone());
    session.letting_go().insert(lock.clone(), body.grant_rev);
    rt.spawn(async move {
        let _answered = Answered {
            session: &session,
            lock,
            grant_rev: body.grant_rev,
        };
        while !session.is_lost() {
            let deadline = Instant::now() + RELEASE_BUDGET;
            match send(session.http(), &body, deadline).await {
                Err(e) if e.is_outcome_unknown() => {
                    tracing::debug!(error = %e, "release still unanswered; trying again");
                }
                _ => return,
            }
        }
    });
}

/// Forgets, when the background release ends (answered, or its session gone), that the
/// session's hold of `lock` at `grant_rev` is being let go of.
struct Answered<'a> {
    session: &'a ClientSession,
    lock: crate::session::LockRef,
    grant_rev: palisade_api::Revision,
}

impl Drop for Answered<'_> {
    fn drop(&mut self) {
        let mut letting_go = self.session.letting_go();
        if letting_go.get(&self.lock) == Some(&self.grant_rev) {
            letting_go.remove(&self.lock);
        }
    }
}
