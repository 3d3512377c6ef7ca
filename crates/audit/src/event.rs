//! The write-event model: one `write_event` row.

use std::time::SystemTime;

use palisade_fence::{Enforcement, FencingToken, WriteEvent, WriteOutcome};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What happened to a write, as the dashboard groups it (`write_event.outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// The write carried a current token and went through.
    Admitted,
    /// A fenced resource refused the write.
    Rejected,
    /// An advisory resource let the write through without a current token.
    Unprotected,
    /// Not a write: this many events were dropped by the sink under overload.
    Dropped,
}

impl Outcome {
    /// The value stored in `write_event.outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::Rejected => "rejected",
            Outcome::Unprotected => "unprotected",
            Outcome::Dropped => "dropped",
        }
    }
}

/// What the fence layer found about the token (`write_event.finding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Finding {
    /// A current token; the resource's mark was raised.
    Current,
    /// No `Fencing-Token` header.
    MissingToken,
    /// A header that is not one decimal token.
    MalformedToken,
    /// A token below the resource's mark.
    Stale,
    /// The high-water store did not answer.
    StoreUnavailable,
}

impl Finding {
    /// The value stored in `write_event.finding`.
    pub fn as_str(self) -> &'static str {
        match self {
            Finding::Current => "current",
            Finding::MissingToken => "missing_token",
            Finding::MalformedToken => "malformed_token",
            Finding::Stale => "stale",
            Finding::StoreUnavailable => "store_unavailable",
        }
    }

    fn of(outcome: WriteOutcome) -> Finding {
        match outcome {
            WriteOutcome::Admitted => Finding::Current,
            WriteOutcome::MissingToken => Finding::MissingToken,
            WriteOutcome::MalformedToken => Finding::MalformedToken,
            WriteOutcome::Stale => Finding::Stale,
            // StoreUnavailable, and any outcome a later fence version adds: the token
            // was not confirmed current.
            _ => Finding::StoreUnavailable,
        }
    }
}

/// A resource's lock namespace and class, when the sink's classifier knows them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Labels {
    /// The lock namespace.
    pub namespace: Option<String>,
    /// The lock class.
    pub class: Option<String>,
}

impl Labels {
    /// Both labels.
    pub fn new(namespace: impl Into<String>, class: impl Into<String>) -> Self {
        Labels {
            namespace: Some(namespace.into()),
            class: Some(class.into()),
        }
    }
}

/// One `write_event` row: a checked write, or a count of dropped events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WriteRecord {
    /// Minted by the sink (UUID v7, time-ordered); the primary key that makes inserts
    /// idempotent.
    pub id: Uuid,
    /// When the fence layer decided (or when the drops were counted).
    pub at: SystemTime,
    /// The service that reported it (the sink's name).
    pub service: String,
    /// What happened.
    pub outcome: Outcome,
    /// The resource key (`None` only for [`Outcome::Dropped`]).
    pub resource: Option<String>,
    /// The HTTP method (`None` only for [`Outcome::Dropped`]).
    pub method: Option<String>,
    /// The token, when the header held a well-formed one.
    pub token: Option<FencingToken>,
    /// The resource's mark, when the token was stale.
    pub highest: Option<FencingToken>,
    /// What the layer found (`None` only for [`Outcome::Dropped`]).
    pub finding: Option<Finding>,
    /// `true` for a fenced resource, `false` for an advisory one (`None` for drops).
    pub fenced: Option<bool>,
    /// Namespace and class, when known.
    #[serde(flatten)]
    pub labels: Labels,
    /// The caller's identity (a SPIFFE ID), when known.
    pub caller: Option<String>,
    /// For [`Outcome::Dropped`], how many events were dropped.
    pub dropped: Option<u64>,
}

impl WriteRecord {
    /// A write with the given fields and the rest empty (no token, labels or caller; set
    /// the public fields to fill them in). For imports and tests; the sink builds rows
    /// with [`from_event`](Self::from_event).
    pub fn new(
        service: impl Into<String>,
        resource: impl Into<String>,
        method: impl Into<String>,
        outcome: Outcome,
        finding: Finding,
        at: SystemTime,
    ) -> Self {
        WriteRecord {
            id: Uuid::now_v7(),
            at,
            service: service.into(),
            outcome,
            resource: Some(resource.into()),
            method: Some(method.into()),
            token: None,
            highest: None,
            finding: Some(finding),
            fenced: Some(outcome == Outcome::Rejected),
            labels: Labels::default(),
            caller: None,
            dropped: None,
        }
    }

    /// The row for one fence layer event.
    ///
    /// NUL characters (which Postgres `text` cannot hold, so one such row would block
    /// every later insert) become U+FFFD in the strings that come from callers'
    /// closures: resource, labels and caller.
    pub fn from_event(service: &str, event: WriteEvent, labels: Labels) -> Self {
        let labels = Labels {
            namespace: labels.namespace.map(no_nul),
            class: labels.class.map(no_nul),
        };
        let outcome = if event.rejected {
            Outcome::Rejected
        } else if event.unprotected {
            Outcome::Unprotected
        } else {
            Outcome::Admitted
        };
        WriteRecord {
            id: Uuid::now_v7(),
            at: event.at,
            service: service.to_owned(),
            outcome,
            resource: Some(no_nul(event.resource)),
            method: Some(event.method.as_str().to_owned()),
            token: event.token,
            highest: event.highest,
            finding: Some(Finding::of(event.outcome)),
            fenced: Some(event.enforcement == Enforcement::Fenced),
            labels,
            caller: event.caller.map(no_nul),
            dropped: None,
        }
    }

    /// The row that reports `count` dropped events.
    pub fn dropped(service: &str, count: u64) -> Self {
        WriteRecord {
            id: Uuid::now_v7(),
            at: SystemTime::now(),
            service: service.to_owned(),
            outcome: Outcome::Dropped,
            resource: None,
            method: None,
            token: None,
            highest: None,
            finding: None,
            fenced: None,
            labels: Labels::default(),
            caller: None,
            dropped: Some(count),
        }
    }
}

/// Replaces NUL characters, which Postgres `text` refuses.
fn no_nul(s: String) -> String {
    if s.contains('\0') {
        s.replace('\0', "\u{fffd}")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_characters_are_replaced_and_other_text_kept() {
        assert_eq!(no_nul("a\0b".to_owned()), "a\u{fffd}b");
        assert_eq!(no_nul("<script>é".to_owned()), "<script>é");
    }
}
