//! Integration tests: real PostgreSQL (a fresh database per test) and real HTTP on
//! loopback.

mod common;
mod postgres_helper;
