//! Integration tests: real PostgreSQL (a fresh database per test) and real HTTP on
//! loopback.

mod closure_form;
mod common;
mod http_layer;
mod mark_locks;
mod ordering;
mod pipelined;
mod pooler;
mod postgres_helper;
mod privileges;
mod reporting;
mod reset;
mod store_batches;
mod upgrade;
