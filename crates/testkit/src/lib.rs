//! Test support for Palisade: the real parts, started by the tests themselves.
//!
//! - [`TestDb`]: a fresh PostgreSQL database per test, dropped afterwards.
//!
//! Nothing here is mocked and nothing is skipped: a missing server fails the test with a
//! message that names `scripts/test`, which installs and starts what is missing.

mod postgres;

pub use postgres::TestDb;
