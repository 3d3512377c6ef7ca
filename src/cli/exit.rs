//! The exit codes of `palisade`, and the error that carries one.
//!
//! [`TABLE`] is the one list of the codes and their meanings: `palisade --help` prints
//! it ([`help`]) and the README's table copies it (a test keeps the two equal).
//! [`Exit::of_problem`] is the one mapping of the service's problem kinds to these codes.

use palisade_api::ProblemKind;
use palisade_client::{ClientError, ClientErrorKind};

/// Every exit code and what it means, in order: the table of `palisade --help` and of
/// the README.
pub(crate) const TABLE: &[(&str, &str)] = &[
    ("0", "done"),
    (
        "1",
        "any other failure: the service unreachable, or no answer within `--timeout-ms`, or unable to serve now (`quorum-lost`, `namespace-moving`, `shutting-down`, `epoch-mismatch`, `epoch-store-unavailable`, `upstream`, `internal`), local I/O such as a closed stdout",
    ),
    (
        "2",
        "bad input: usage, malformed argument or hold file, unusable certificate files, the service's `invalid-input`",
    ),
    (
        "3",
        "not found: namespace, class, session or force release request (`not-found`)",
    ),
    (
        "4",
        "conflict: `create` of something that exists, `already-approved`, `force-target-gone`, `epoch-exhausted`, `wrong-tier` (a session on another tier than the namespace), `already-held` and `acquire-in-flight` (the session holds or waits for the lock under another acquire)",
    ),
    ("5", "quota exceeded (`quota-exceeded`)"),
    (
        "6",
        "unauthenticated: certificate missing or refused (`unauthenticated`, 401)",
    ),
    ("7", "forbidden (`forbidden`, 403)"),
    (
        "74",
        "outcome unknown: no definite answer in time to a release (sent again for 10 s, or until `--timeout-ms` if sooner) or to an acquire (by `--timeout-ms` after its wait); a hold may stay until its session's TTL lapses: run the release again, or close the session",
    ),
    (
        "75",
        "not acquired: others held the lock for the whole wait (`deadline-exceeded`)",
    ),
    (
        "76",
        "not held: the hold or its session is gone, or the hold was force-released (`not-held`, `session-lost`, `hold-forced`); `lock run` also when its session ended while it waited",
    ),
    (
        "130, 143",
        "interrupted (SIGINT) or terminated (SIGTERM) while `lock acquire` waited (its session is closed either way), or during a `chaos` run (its processes, directories and network hosts are removed)",
    ),
];

/// What `palisade --help` says after the commands: the connection flags, the deadline,
/// and [`TABLE`], each meaning wrapped to 88 columns.
pub(crate) fn help() -> String {
    const WIDTH: usize = 88;
    const INDENT: usize = 11;
    let mut out = String::from(
        "Commands that talk to the lock service take --service URL and either --cert, --key and
--ca (mTLS; or PALISADE_SERVICE, PALISADE_CERT, PALISADE_KEY, PALISADE_CA) or
--dev-identity SPIFFE_ID (a service in dev mode; or PALISADE_DEV_IDENTITY). Each ends
within --timeout-ms (default 30 s; PALISADE_TIMEOUT_MS), plus the wait of an acquire.

Exit codes:
",
    );
    for (code, meaning) in TABLE {
        let mut line = format!("  {code:<9}");
        for word in meaning.split(' ') {
            if line.len() + 1 + word.len() > WIDTH && line.len() > INDENT {
                out.push_str(line.trim_end());
                out.push('\n');
                line = " ".repeat(INDENT);
            } else if line.len() > INDENT {
                line.push(' ');
            }
            line.push_str(word);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str("`lock run` exits with its command's code once the command ran.");
    out
}

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
            | ProblemKind::WrongTier
            | ProblemKind::AlreadyHeld
            | ProblemKind::AcquireInFlight => Exit::Conflict,
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

    /// The meaning of `code` in [`TABLE`].
    fn meaning(code: u8) -> &'static str {
        TABLE
            .iter()
            .find(|(codes, _)| codes.split(", ").any(|c| c == code.to_string()))
            .map(|(_, m)| *m)
            .unwrap_or_else(|| panic!("code {code} is not in the table"))
    }

    /// Every problem kind's code is in the table, next to the kind's slug.
    #[test]
    fn every_problem_kind_is_documented_with_its_code() {
        for kind in ProblemKind::ALL {
            let code = Exit::of_problem(kind).code();
            assert!(
                meaning(code).contains(&format!("`{}`", kind.slug())),
                "code {code} does not name {}: {:?}",
                kind.slug(),
                meaning(code)
            );
        }
    }

    /// Every code a command can return is in the table.
    #[test]
    fn every_code_is_in_the_table() {
        use Exit::*;
        for exit in [
            Failure,
            BadInput,
            NotFound,
            Conflict,
            Quota,
            Unauthenticated,
            Forbidden,
            OutcomeUnknown,
            NotAcquired,
            Lost,
            Interrupted,
            Terminated,
        ] {
            assert!(!meaning(exit.code()).is_empty());
        }
    }

    /// The README's table has the rows of [`TABLE`], in order, word for word.
    #[test]
    fn the_readme_table_is_this_table() {
        let readme = include_str!("../../README.md");
        let section = readme
            .split("### Exit codes")
            .nth(1)
            .expect("the README has an exit codes section");
        let rows: Vec<&str> = section
            .lines()
            .skip_while(|l| !l.starts_with("|---"))
            .skip(1)
            .take_while(|l| l.starts_with('|'))
            .collect();
        let want: Vec<String> = TABLE
            .iter()
            .map(|(c, m)| format!("| {c} | {m} |"))
            .collect();
        assert_eq!(rows, want);
    }

    /// `--help` shows every code and every word of its meaning, wrapped to 88 columns.
    #[test]
    fn help_shows_the_table_wrapped() {
        let help = help();
        assert!(help.lines().all(|l| l.chars().count() <= 88), "{help}");
        let words: Vec<&str> = help.split_whitespace().collect();
        for (code, m) in TABLE {
            let first = code.split(' ').next().unwrap_or_default();
            let at = words
                .iter()
                .position(|w| *w == first)
                .unwrap_or_else(|| panic!("{code} is not in --help"));
            let shown = words[at..].join(" ");
            assert!(shown.starts_with(&format!("{code} {m}")), "{code}: {shown}");
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
