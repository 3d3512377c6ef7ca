//! The error of the Postgres helper, classified by SQLSTATE.

use std::fmt;

use tokio_postgres::error::SqlState;

use crate::FencingToken;

/// The SQLSTATE of the migration's refusal of an object it did not create (class `PF` is
/// used by no Postgres error).
const FOREIGN_OBJECT: &str = "PF002";

/// What went wrong in a fenced write. Returned by [`FenceError::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceErrorKind {
    /// The token is below the resource's mark; nothing was written.
    Stale,
    /// A folded update found no row with the key (see [`FencedUpdate`](crate::FencedUpdate)).
    RowMissing,
    /// SQLSTATE `40001` (serialization failure): retry the whole transaction.
    SerializationFailure,
    /// SQLSTATE `40P01` (deadlock detected): retry the whole transaction.
    Deadlock,
    /// The parameters did not fit their statement (count or type), found before anything
    /// was sent (see [`fenced_execute`](crate::fenced_execute)).
    BadParameters,
    /// The connection is closed (or a pool had none to give).
    Closed,
    /// A prepared form ran where its prepared statement does not exist: SQLSTATE `26000`
    /// (or `42P05` when preparing found the name taken). The prepared forms
    /// ([`PreparedFence`](crate::PreparedFence),
    /// [`PreparedFencedUpdate`](crate::PreparedFencedUpdate), [`fenced_execute`](crate::fenced_execute)
    /// with statements prepared on the client) need a session: a direct connection or a
    /// session-mode pool, not a transaction-mode pooler such as PgBouncer's
    /// `pool_mode = transaction`. Not retryable: the configuration must change.
    NeedsSession,
    /// A reset was refused: an empty reason, or a token not below the mark (SQLSTATE
    /// `22023`, see [`reset_mark`](crate::postgres::reset_mark)). The message says which.
    BadReset,
    /// A reset found no mark to lower (SQLSTATE `P0002`).
    NoMark,
    /// The migration found an object it did not create (SQLSTATE `PF002`, see
    /// [`migrate`](crate::migrate)): the schema `palisade_fence` owned by a role other than
    /// the one migrating, another role's object in it, a function there that the migration
    /// does not define, or another role's table or function of a fence name where earlier
    /// versions put them. The message names the object and its owner. Nothing was changed.
    ForeignObject,
    /// Any other database error; see [`FenceError::code`].
    Database,
}

/// A fenced write that did not commit.
///
/// Query it with [`is_stale`](Self::is_stale), [`is_retryable`](Self::is_retryable) and
/// friends; the database error, if any, is the [`source`](std::error::Error::source).
#[derive(Debug)]
pub struct FenceError {
    repr: Repr,
}

#[derive(Debug)]
enum Repr {
    Stale {
        token: FencingToken,
        highest: FencingToken,
    },
    RowMissing,
    Params {
        given: usize,
        expected: usize,
    },
    Param(Box<dyn std::error::Error + Send + Sync>),
    Db(tokio_postgres::Error),
    NoConnection(Box<dyn std::error::Error + Send + Sync>),
}

impl FenceError {
    pub(crate) fn stale(token: FencingToken, highest: FencingToken) -> Self {
        FenceError {
            repr: Repr::Stale { token, highest },
        }
    }

    pub(crate) fn no_connection(source: Box<dyn std::error::Error + Send + Sync>) -> Self {
        FenceError {
            repr: Repr::NoConnection(source),
        }
    }

    pub(crate) fn row_missing() -> Self {
        FenceError {
            repr: Repr::RowMissing,
        }
    }

    pub(crate) fn bad_params(given: usize, expected: usize) -> Self {
        FenceError {
            repr: Repr::Params { given, expected },
        }
    }

    pub(crate) fn bad_param(source: Box<dyn std::error::Error + Send + Sync>) -> Self {
        FenceError {
            repr: Repr::Param(source),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> FenceErrorKind {
        match &self.repr {
            Repr::Stale { .. } => FenceErrorKind::Stale,
            Repr::RowMissing => FenceErrorKind::RowMissing,
            Repr::Params { .. } | Repr::Param(_) => FenceErrorKind::BadParameters,
            Repr::Db(e) if e.is_closed() => FenceErrorKind::Closed,
            Repr::NoConnection(_) => FenceErrorKind::Closed,
            Repr::Db(e) => match e.code() {
                Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE => {
                    FenceErrorKind::SerializationFailure
                }
                Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED => FenceErrorKind::Deadlock,
                Some(_) if needs_session(e) => FenceErrorKind::NeedsSession,
                Some(c) if *c == SqlState::INVALID_PARAMETER_VALUE => FenceErrorKind::BadReset,
                Some(c) if *c == SqlState::NO_DATA_FOUND => FenceErrorKind::NoMark,
                Some(c) if c.code() == FOREIGN_OBJECT => FenceErrorKind::ForeignObject,
                _ => FenceErrorKind::Database,
            },
        }
    }

    /// The token was below the resource's mark.
    pub fn is_stale(&self) -> bool {
        self.kind() == FenceErrorKind::Stale
    }

    /// A folded update found no row with its key.
    pub fn is_row_missing(&self) -> bool {
        self.kind() == FenceErrorKind::RowMissing
    }

    /// Running the same transaction again may succeed: a serialization failure or a
    /// deadlock (SQLSTATE `40001`, `40P01`). A stale token is never retryable.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            FenceErrorKind::SerializationFailure | FenceErrorKind::Deadlock
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

    /// The SQLSTATE of a database error.
    pub fn code(&self) -> Option<&SqlState> {
        match &self.repr {
            Repr::Db(e) => e.code(),
            _ => None,
        }
    }
}

impl fmt::Display for FenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Stale { token, highest } => {
                write!(
                    f,
                    "stale fencing token {token}: the resource has seen {highest}"
                )
            }
            Repr::RowMissing => f.write_str("fenced update found no row with the key"),
            Repr::Params { given, expected } => {
                write!(
                    f,
                    "fenced write: {given} parameters given where the statement takes {expected}"
                )
            }
            Repr::Param(_) => f.write_str("fenced write: a parameter does not fit its statement"),
            Repr::NoConnection(_) => f.write_str("no database connection could be had"),
            Repr::Db(_) if self.kind() == FenceErrorKind::NeedsSession => f.write_str(
                "fenced write: a prepared statement is not on the server session this \
                 transaction ran on; the prepared forms need a session of their own (a direct \
                 connection or a session-mode pool, not a transaction-mode pooler)",
            ),
            Repr::Db(e)
                if matches!(
                    self.kind(),
                    FenceErrorKind::BadReset
                        | FenceErrorKind::NoMark
                        | FenceErrorKind::ForeignObject
                ) =>
            {
                // The function's own message names the resource and the cause.
                match e.as_db_error() {
                    Some(db) => f.write_str(db.message()),
                    None => f.write_str("refused by the fence's SQL"),
                }
            }
            Repr::Db(_) => f.write_str("fenced write failed in the database"),
        }
    }
}

impl std::error::Error for FenceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.repr {
            Repr::Db(e) => Some(e),
            Repr::Param(e) | Repr::NoConnection(e) => Some(&**e),
            _ => None,
        }
    }
}

impl From<tokio_postgres::Error> for FenceError {
    fn from(e: tokio_postgres::Error) -> Self {
        FenceError { repr: Repr::Db(e) }
    }
}

/// Whether a database error says a prepared statement is not on this server session:
/// SQLSTATE `26000` (missing) or `42P05` (the name is taken by another statement).
pub(crate) fn needs_session(e: &tokio_postgres::Error) -> bool {
    matches!(e.code(), Some(c) if *c == SqlState::INVALID_SQL_STATEMENT_NAME || *c == SqlState::DUPLICATE_PSTATEMENT)
}

/// Whether a database error is worth retrying: SQLSTATE `40001` or `40P01`.
pub(crate) fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(e.code(), Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED)
}
