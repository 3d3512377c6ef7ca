//! The exit codes of `palisade`, and the error that carries one.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | any other failure: the service unreachable, or unable to serve now (`quorum-lost`, `namespace-moving`, `shutting-down`, `epoch-mismatch`, `epoch-store-unavailable`, `upstream`, `internal`), a local I/O error |
//! | 2 | bad input: a usage error, a malformed argument or hold file, unusable certificates, or the service's `invalid-input` |
//! | 3 | not found: namespace, class, session or force release request (`not-found`) |
//! | 4 | conflict: `create` of something that exists, `already-approved`, `force-target-gone`, `epoch-exhausted`, `wrong-tier` |
//! | 5 | a quota of the namespace is reached (`quota-exceeded`) |
//! | 6 | unauthenticated: the service refused the certificate (or its absence), or answered 401 (`unauthenticated`) |
//! | 7 | forbidden: the caller may not do this (`forbidden`, 403) |
//! | 74 | outcome unknown: a release got no definite answer in time (sent again, with the same grant revision, for 10 s); the hold may still be held until its session's TTL lapses |
//! | 75 | not acquired: the wait ended while others held the lock (`deadline-exceeded`) |
//! | 76 | not held: the hold or its session is gone (`not-held`, `hold-forced`, `session-lost`) |
//! | 130 | interrupted (SIGINT) while `lock acquire` waited (its session is closed), or during a `chaos` run (its processes, directories and network hosts are removed) |
//! | 143 | terminated (SIGTERM) while `lock acquire` waited (its session is closed), or during a `chaos` run (as for SIGINT) |
//!
//! [`Exit::of_problem`] is the one mapping of the service's problem kinds to these codes.
//!
//! `lock run` exits with its command's code once the command ran.

use palisade_api::ProblemKind;
use palisade_client::{ClientError, ClientErrorKind};

/// One of the documented exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    Failure = 1,
    BadInput = 2,
    NotFound = 3,
    Conflict = 4,
    Quota = 5,
    Unauthenticated = 6,
    Forbidden = 7,
    OutcomeUnknown = 74,
    NotAcquired = 75,
    Lost = 76,
    Interrupted = 130,
    Terminated = 143,
}

impl Exit {
    /// The code of a client error, by its kind.
    pub(crate) fn of_client(e: &ClientError) -> Exit {
        match e.kind() {
            ClientErrorKind::Problem(kind) => Exit::of_problem(*kind),
            ClientErrorKind::Config => Exit::BadInput,
            ClientErrorKind::OutcomeUnknown => Exit::OutcomeUnknown,
            _ => Exit::Failure,
        }
    }

    /// The code of each problem kind the service answers with: the table above.
    pub(crate) fn of_problem(kind: ProblemKind) -> Exit {
        match kind {
            ProblemKind::InvalidInput => Exit::BadInput,
            ProblemKind::NotFound => Exit::NotFound,
            ProblemKind::AlreadyApproved
            | ProblemKind::ForceTargetGone
            | ProblemKind::EpochExhausted
            | ProblemKind::WrongTier => Exit::Conflict,
            ProblemKind::QuotaExceeded => Exit::Quota,
            ProblemKind::Unauthenticated => Exit::Unauthenticated,
            ProblemKind::Forbidden => Exit::Forbidden,
            ProblemKind::DeadlineExceeded => Exit::NotAcquired,
            ProblemKind::NotHeld | ProblemKind::HoldForced | ProblemKind::SessionLost => Exit::Lost,
            // The service cannot serve it now (etcd, a move, the epoch), or failed.
            ProblemKind::QuorumLost
            | ProblemKind::NamespaceMoving
            | ProblemKind::ShuttingDown
            | ProblemKind::EpochMismatch
            | ProblemKind::EpochStoreUnavailable
            | ProblemKind::Upstream
            | ProblemKind::Internal => Exit::Failure,
            // A kind newer than this table.
            _ => Exit::Failure,
        }
    }

    /// The code for any error a command returned.
    pub(crate) fn of(e: &(dyn std::error::Error + 'static)) -> Exit {
        if let Some(e) = e.downcast_ref::<CliError>() {
            e.exit
        } else if let Some(e) = e.downcast_ref::<ClientError>() {
            Exit::of_client(e)
        } else {
            Exit::Failure
        }
    }

    pub(crate) fn code(self) -> u8 {
        self as u8
    }
}

/// A failure with its exit code and a message for the user.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct CliError {
    pub(crate) exit: Exit,
    message: String,
}

impl CliError {
    pub(crate) fn new(exit: Exit, message: impl Into<String>) -> Self {
        CliError {
            exit,
            message: message.into(),
        }
    }

    pub(crate) fn bad_input(message: impl Into<String>) -> Self {
        CliError::new(Exit::BadInput, message)
    }
}

/// Boxed errors of the command handlers.
pub(crate) type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// `e` and its causes, `outer: inner: innermost`; a cause whose text the message
/// already contains is not repeated.
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !more.is_empty() && !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line of `text` that starts (after blanks and `|`) with `code`, and the lines
    /// that continue it (indented more).
    fn entry(text: &str, code: u8) -> String {
        let mut out = String::new();
        let mut inside = false;
        for line in text.lines() {
            let bare = line.trim_start_matches(['/', '!', ' ', '|']);
            let starts = bare
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .is_some_and(|n| n == code.to_string());
            if starts {
                inside = true;
            } else if inside && !line.starts_with("      ") {
                inside = false;
            }
            if inside {
                out.push_str(line);
            }
        }
        out
    }

    /// Every problem kind's code is written in `--help`, this module's table and the
    /// README's, next to the kind's slug.
    #[test]
    fn every_problem_kind_is_documented_with_its_code() {
        let module = include_str!("exit.rs");
        let readme = include_str!("../../README.md");
        for kind in ProblemKind::ALL {
            let code = Exit::of_problem(kind).code();
            let docs = [
                ("--help", crate::EXIT_CODES),
                ("exit.rs", module),
                ("README.md", readme),
            ];
            for (doc, text) in docs {
                let line = entry(text, code);
                assert!(
                    line.contains(kind.slug()),
                    "{doc}: code {code} does not name {}: {line:?}",
                    kind.slug()
                );
            }
        }
    }

    #[test]
    fn wrong_tier_is_a_conflict_and_namespace_moving_a_failure() {
        assert_eq!(Exit::of_problem(ProblemKind::WrongTier), Exit::Conflict);
        assert_eq!(
            Exit::of_problem(ProblemKind::NamespaceMoving),
            Exit::Failure
        );
        assert_eq!(Exit::of_problem(ProblemKind::QuorumLost), Exit::Failure);
    }
}
