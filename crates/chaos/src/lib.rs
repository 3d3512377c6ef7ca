//! Palisade's safety harness: a seeded nemesis, a workload of fenced writers, and a checker
//! that reads the history they leave and fails on any stale write that landed.
//!
//! - [`history`]: the history format, one JSON object per line.
//! - [`check`]: the checker, which reads a history and reports every rule it breaks.

pub mod check;
pub mod history;
