//! Palisade's safety harness: a seeded nemesis, a workload of fenced writers, and a checker
//! that reads the history they leave and fails on any stale write that landed.
//!
//! `palisade chaos --seed S --duration D` calls [`run`], which starts, each on a network
//! host of its own ([`net`]; or all on loopback with `--loopback`):
//!
//! - a three-member etcd ([`palisade_testkit::EtcdCluster`]), the home tier, and a
//!   one-member one, a second tier (`spare`);
//! - a private PostgreSQL ([`palisade_testkit::PgServer`]) holding the resources, the
//!   fence's high-water marks and the audit trail;
//! - two lock-service replicas (`palisade serve`, child processes sharing one epoch
//!   record per tier, each serving both tiers);
//! - the HTTP resource service behind `FenceLayer` and the audit tailer of each tier, in
//!   the runner's process (see [`resource`]);
//! - N workers (`palisade chaos worker`, one process each, see [`worker`]).
//!
//! The nemesis ([`schedule`] plans, `nemesis` injects) then kills and restarts the etcd
//! leader, pauses an etcd member, kills a replica, pauses a worker past its TTL, restarts
//! PostgreSQL, restores etcd from a snapshot and advances the epoch, force-releases
//! (two admins) a lock a worker holds while it may release and re-acquire, and has a
//! worker's proxy lose its releases' requests and answers, and moves the workers'
//! namespace to the other tier and back (rehome); on hosts it also partitions
//! the network, drops packets one way or at random, adds netem latency (where the kernel
//! has it) and jumps wall clocks. With [`RACES_ENV`] on, the workers also race acquires
//! of one session: one sent again after its connection was reset while the service
//! still worked on it, and two tasks acquiring one lock at once. SIGINT and SIGTERM stop a run and remove everything it
//! started ([`Interrupt`]). Every step of
//! the workers and every fault goes into the history ([`history`]), with each tier's etcd
//! revision read every 250 ms; after the run, the holds in both clusters' etcd history
//! and the rows of the audit trail are appended, and the
//! [`Summary`] counts it all. The [`check`]er reads the history and reports every rule it
//! breaks.
//!
//! Modules: [`history`] (the format), [`check`] (the checker), [`clock`] (one monotonic
//! clock for every process), [`net`] (network hosts, partitions, netem and clock jumps),
//! [`schedule`], [`worker`], [`resource`], and the runner
//! ([`run`], [`RunOptions`], [`Summary`], [`ChaosError`]).

pub mod check;
pub mod clock;
pub mod history;
pub mod net;
pub mod resource;
pub mod schedule;
pub mod worker;

mod audit_rows;
mod error;
mod etcd_history;
mod interrupt;
mod layout;
mod marks;
mod nemesis;
mod options;
mod procs;
mod runner;
mod summary;

pub use error::ChaosError;
pub use interrupt::Interrupt;
pub use options::{races_from_env, RunOptions, RACES_ENV};
pub use runner::run;
pub use summary::{Summary, WriteCounts};
pub use worker::{run_worker, WorkerConfig};
