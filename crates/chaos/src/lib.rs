//! Palisade's safety harness: a seeded nemesis, a workload of fenced writers, and a checker
//! that reads the history they leave and fails on any stale write that landed.
//!
//! - [`history`]: the history format, one JSON object per line.

pub mod history;
