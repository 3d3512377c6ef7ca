//! Integration tests: real PostgreSQL (a fresh database per test) and real HTTP on
//! loopback.

mod closure_form;
mod common;
mod conformance;
mod http_layer;
mod mark_locks;
mod mysql_examples;
mod mysql_helper;
mod mysql_privileges;
mod mysql_race;
mod mysql_store;
mod ordering;
mod pipelined;
mod pooler;
mod postgres_helper;
mod privileges;
mod redis_examples;
mod redis_fence;
mod redis_hostile;
mod redis_reset;
mod redis_store;
mod reporting;
mod reset;
mod store_batches;
mod upgrade;
