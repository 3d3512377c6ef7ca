//! palisade-audit against a real PostgreSQL (a fresh database per test).

mod browser;
mod common;
mod dashboard;
mod schema;
mod sink;
mod tailer_etcd;
