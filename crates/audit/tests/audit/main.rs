//! palisade-audit against a real PostgreSQL (a fresh database per test).

mod access;
mod browser;
mod common;
mod dashboard;
mod dashboard_etcd;
mod epoch_etcd;
mod overview;
mod rollups;
mod schema;
mod sink;
mod tailer_etcd;
