//! The error of the MySQL/MariaDB helper, classified by error number and SQLSTATE.

use std::fmt;

use mysql_async::{Error as DriverError, ServerError};

use crate::FencingToken;

/// `ER_SIGNAL_EXCEPTION`: the error number of every condition a procedure `SIGNAL`s
/// without its own `MYSQL_ERRNO` (the fence's procedures never set one). No error of the
/// server itself has it.
const SIGNALLED: u16 = 1644;
/// `ER_LOCK_DEADLOCK` (SQLSTATE `40001`): InnoDB rolled the whole transaction back.
const DEADLOCK: u16 = 1213;
/// `ER_LOCK_WAIT_TIMEOUT`: `innodb_lock_wait_timeout` passed; by default InnoDB rolls back
/// only the statement, so the helper rolls back the transaction itself.
const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// Server errors that mean the session is gone: `ER_SERVER_SHUTDOWN`,
/// `ER_CONNECTION_KILLED`, `ER_QUERY_INTERRUPTED` (the connection was killed mid-query),
/// `ER_CON_COUNT_ERROR` and `ER_TOO_MANY_USER_CONNECTIONS` (no connection to be had).
const GONE: [u16; 5] = [1053, 1927, 1317, 1040, 1203];

/// The start of the message `fence_raise` signals (SQLSTATE `45000`) for a stale token:
/// `fence_raise: stale token <token>, mark <mark>, resource <resource>`.
pub(crate) const STALE_PREFIX: &str = "fence_raise: stale token ";

/// What went wrong in a fenced write or an admin call. Returned by
/// [`MysqlFenceError::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MysqlFenceErrorKind {
    /// The token is below the resource's mark: `fence_raise` signalled SQLSTATE `45000`
    /// (or a folded update found a higher token in the row). Nothing was written: the
    /// transaction was rolled back.
    Stale,
    /// A folded update found no row with the key (see [`FencedUpdate`](super::FencedUpdate)).
    RowMissing,
    /// A reset was refused (SQLSTATE `22023`): an empty reason, a negative token, a token
    /// not below the mark, or below the lock's floor. The message says which.
    BadReset,
    /// A reset found no mark to lower (SQLSTATE `P0002`).
    NoMark,
    /// InnoDB chose this transaction as a deadlock victim (error 1213, SQLSTATE `40001`)
    /// and rolled it back: run the whole transaction again.
    Deadlock,
    /// A lock was not granted within `innodb_lock_wait_timeout` (error 1205): another
    /// writer of the resource held it that long. The transaction was rolled back; run it
    /// again.
    LockWaitTimeout,
    /// The connection is closed or could not be had (refused, reset, killed, the server
    /// shutting down, the pool disconnected): nothing is known to have committed but what
    /// committed before.
    Closed,
    /// A call the fence's SQL refused before touching a mark: a `NULL` argument (SQLSTATE
    /// `22004`), or a token given to `fence_raise` that is negative or not an integer in
    /// plain digits below 2^63 (`22003`: `1.5`, `'1e3'`, `' 7'`, `0x10` are refused, not
    /// rounded or converted).
    BadArgument,
    /// Any other database error; see [`MysqlFenceError::code`] and
    /// [`MysqlFenceError::sql_state`] (for example `1305`, no such procedure: run
    /// [`migrate`](super::migrate); or `1370`, EXECUTE denied).
    Database,
}

/// A fenced write or an admin call on MySQL/MariaDB that did not succeed.
///
/// Query it with [`is_stale`](Self::is_stale), [`is_retryable`](Self::is_retryable),
/// [`kind`](Self::kind); the driver's error, if any, is the
/// [`source`](std::error::Error::source).
#[derive(Debug)]
pub struct MysqlFenceError {
    repr: Repr,
}

#[derive(Debug)]
enum Repr {
    Stale {
        token: FencingToken,
        highest: FencingToken,
        source: Option<ServerError>,
    },
    RowMissing,
    Driver(DriverError),
    Value(&'static str),
}

impl MysqlFenceError {
    pub(crate) fn stale(token: FencingToken, highest: FencingToken) -> Self {
        MysqlFenceError {
            repr: Repr::Stale {
                token,
                highest,
                source: None,
            },
        }
    }

    pub(crate) fn row_missing() -> Self {
        MysqlFenceError {
            repr: Repr::RowMissing,
        }
    }

    /// An answer of the database that the helper cannot use (a negative token, a lock
    /// not granted); `what` says it in a sentence.
    pub(crate) fn bad_value(what: &'static str) -> Self {
        MysqlFenceError {
            repr: Repr::Value(what),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> MysqlFenceErrorKind {
        match &self.repr {
            Repr::Stale { .. } => MysqlFenceErrorKind::Stale,
            Repr::RowMissing => MysqlFenceErrorKind::RowMissing,
            Repr::Value(_) => MysqlFenceErrorKind::Database,
            Repr::Driver(DriverError::Server(e)) => server_kind(e),
            Repr::Driver(DriverError::Url(_)) => MysqlFenceErrorKind::Database,
            Repr::Driver(_) => MysqlFenceErrorKind::Closed,
        }
    }

    /// The token was below the resource's mark.
    pub fn is_stale(&self) -> bool {
        self.kind() == MysqlFenceErrorKind::Stale
    }

    /// A folded update found no row with its key.
    pub fn is_row_missing(&self) -> bool {
        self.kind() == MysqlFenceErrorKind::RowMissing
    }

    /// Running the same transaction again may succeed: a deadlock, a lock wait timeout,
    /// or a closed connection (on a new one). A stale token is never retryable.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            MysqlFenceErrorKind::Deadlock
                | MysqlFenceErrorKind::LockWaitTimeout
                | MysqlFenceErrorKind::Closed
        )
    }

    /// The refused token, for a stale write.
    pub fn token(&self) -> Option<FencingToken> {
        match self.repr {
            Repr::Stale { token, .. } => Some(token),
            _ => None,
        }
    }

    /// The resource's mark that refused the token, for a stale write.
    pub fn highest(&self) -> Option<FencingToken> {
        match self.repr {
            Repr::Stale { highest, .. } => Some(highest),
            _ => None,
        }
    }

    /// The server's error number (`1644` for every condition the fence's procedures
    /// signal, `1213` for a deadlock...).
    pub fn code(&self) -> Option<u16> {
        self.server().map(|e| e.code)
    }

    /// The server's SQLSTATE (`45000` stale, `22023` bad reset, `P0002` no mark...).
    pub fn sql_state(&self) -> Option<&str> {
        self.server().map(|e| e.state.as_str())
    }

    fn server(&self) -> Option<&ServerError> {
        match &self.repr {
            Repr::Driver(DriverError::Server(e)) => Some(e),
            Repr::Stale {
                source: Some(e), ..
            } => Some(e),
            _ => None,
        }
    }
}

/// The kind of a server error: by error number and SQLSTATE, never by message.
fn server_kind(e: &ServerError) -> MysqlFenceErrorKind {
    match (e.code, e.state.as_str()) {
        (SIGNALLED, "22023") => MysqlFenceErrorKind::BadReset,
        (SIGNALLED, "P0002") => MysqlFenceErrorKind::NoMark,
        (SIGNALLED, "22004" | "22003") => MysqlFenceErrorKind::BadArgument,
        (DEADLOCK, _) => MysqlFenceErrorKind::Deadlock,
        (LOCK_WAIT_TIMEOUT, _) => MysqlFenceErrorKind::LockWaitTimeout,
        (code, _) if GONE.contains(&code) => MysqlFenceErrorKind::Closed,
        _ => MysqlFenceErrorKind::Database,
    }
}

/// The token and mark of `fence_raise`'s stale signal: error 1644, SQLSTATE `45000`, and
/// the message `fence_raise: stale token <token>, mark <mark>, resource …`. `None` for any
/// other error (another procedure's `45000` included).
pub(crate) fn parse_stale(e: &ServerError) -> Option<(FencingToken, FencingToken)> {
    if e.code != SIGNALLED || e.state != "45000" {
        return None;
    }
    let rest = e.message.strip_prefix(STALE_PREFIX)?;
    let (token, rest) = rest.split_once(", mark ")?;
    let (mark, _) = rest.split_once(", resource ")?;
    Some((token.parse().ok()?, mark.parse().ok()?))
}

impl fmt::Display for MysqlFenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Stale { token, highest, .. } => write!(
                f,
                "stale fencing token {token}: the resource has seen {highest}"
            ),
            Repr::RowMissing => f.write_str("fenced update found no row with the key"),
            Repr::Value(what) => f.write_str(what),
            Repr::Driver(DriverError::Server(e)) => match self.kind() {
                // The procedure's own message names the resource and the cause.
                MysqlFenceErrorKind::BadReset
                | MysqlFenceErrorKind::NoMark
                | MysqlFenceErrorKind::BadArgument => f.write_str(&e.message),
                MysqlFenceErrorKind::Deadlock => {
                    f.write_str("fenced write chosen as a deadlock victim; run it again")
                }
                MysqlFenceErrorKind::LockWaitTimeout => f.write_str(
                    "fenced write waited longer than innodb_lock_wait_timeout for a lock; \
                     run it again",
                ),
                _ => write!(f, "fenced write failed in the database (error {})", e.code),
            },
            Repr::Driver(DriverError::Url(_)) => f.write_str("invalid MySQL connection URL"),
            Repr::Driver(_) => f.write_str("the MySQL connection is closed or could not be had"),
        }
    }
}

impl std::error::Error for MysqlFenceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.repr {
            Repr::Driver(e) => Some(e),
            Repr::Stale {
                source: Some(e), ..
            } => Some(e),
            _ => None,
        }
    }
}

impl From<DriverError> for MysqlFenceError {
    fn from(e: DriverError) -> Self {
        if let DriverError::Server(server) = &e {
            if let Some((token, highest)) = parse_stale(server) {
                return MysqlFenceError {
                    repr: Repr::Stale {
                        token,
                        highest,
                        source: Some(server.clone()),
                    },
                };
            }
        }
        MysqlFenceError {
            repr: Repr::Driver(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16, state: &str, message: &str) -> MysqlFenceError {
        MysqlFenceError::from(DriverError::Server(ServerError {
            code,
            message: message.to_owned(),
            state: state.to_owned(),
        }))
    }

    #[test]
    fn the_stale_signal_is_parsed_and_nothing_else_is() {
        let e = server(
            1644,
            "45000",
            "fence_raise: stale token 5, mark 12, resource orders/1",
        );
        assert!(e.is_stale() && !e.is_retryable());
        assert_eq!(e.token().map(FencingToken::get), Some(5));
        assert_eq!(e.highest().map(FencingToken::get), Some(12));
        assert_eq!((e.code(), e.sql_state()), (Some(1644), Some("45000")));
        // A resource shown in hex, or one that repeats the message's separators: the
        // token and the mark are the numbers before the first ", resource ".
        for message in [
            "fence_raise: stale token 5, mark 12, resource 0xFF41FE",
            "fence_raise: stale token 5, mark 12, resource x, mark 99, resource y",
            "fence_raise: stale token 5, mark 12, resource ",
        ] {
            let e = server(1644, "45000", message);
            assert_eq!(
                (
                    e.token().map(FencingToken::get),
                    e.highest().map(FencingToken::get)
                ),
                (Some(5), Some(12)),
                "{message}"
            );
        }
        // Another procedure's 45000, a mark that is no token, a server error with the text.
        for (code, state, msg) in [
            (1644, "45000", "stock too low"),
            (
                1644,
                "45000",
                "fence_raise: stale token 5, mark -3, resource x",
            ),
            (
                1064,
                "45000",
                "fence_raise: stale token 5, mark 12, resource x",
            ),
            (
                1644,
                "22023",
                "fence_raise: stale token 5, mark 12, resource x",
            ),
        ] {
            let e = server(code, state, msg);
            assert!(!e.is_stale(), "{code} {state} {msg}");
            assert_eq!(e.highest(), None);
        }
    }

    #[test]
    fn kinds_follow_the_error_number_and_sqlstate() {
        let cases = [
            (1644, "22023", MysqlFenceErrorKind::BadReset),
            (1644, "P0002", MysqlFenceErrorKind::NoMark),
            (1644, "22004", MysqlFenceErrorKind::BadArgument),
            (1213, "40001", MysqlFenceErrorKind::Deadlock),
            (1205, "HY000", MysqlFenceErrorKind::LockWaitTimeout),
            (1927, "70100", MysqlFenceErrorKind::Closed),
            (1305, "42000", MysqlFenceErrorKind::Database),
            (1146, "22023", MysqlFenceErrorKind::Database),
        ];
        for (code, state, kind) in cases {
            let e = server(code, state, "text is not read");
            assert_eq!(e.kind(), kind, "{code} {state}");
            assert_eq!(
                e.is_retryable(),
                matches!(
                    kind,
                    MysqlFenceErrorKind::Deadlock
                        | MysqlFenceErrorKind::LockWaitTimeout
                        | MysqlFenceErrorKind::Closed
                )
            );
        }
        let io = MysqlFenceError::from(DriverError::Io(mysql_async::IoError::Io(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        )));
        assert_eq!(io.kind(), MysqlFenceErrorKind::Closed);
        assert!(io.is_retryable());
    }
}
