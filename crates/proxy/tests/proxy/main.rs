//! The fencing proxy with real parts: a Python upstream (http.server) that writes to
//! PostgreSQL, real HTTP over loopback, the memory, Postgres, Redis and MariaDB stores, the
//! audit trail.

mod common;
mod faithful;
mod stores;
mod verdicts;
