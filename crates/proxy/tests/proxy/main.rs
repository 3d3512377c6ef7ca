//! The fencing proxy with real parts: a Python upstream (http.server) that writes to
//! PostgreSQL, real HTTP over loopback, the memory and Postgres stores, the audit trail.

mod common;
mod faithful;
mod verdicts;
