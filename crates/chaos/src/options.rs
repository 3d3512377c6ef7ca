//! [`RunOptions`]: what a chaos run runs.

use std::path::PathBuf;
use std::time::Duration;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// Seeds the fault schedule and the workers' choices.
    pub seed: u64,
    /// How long the workers work. The first round of faults (one of each kind) always
    /// completes, so a very short run lasts longer than this.
    pub duration: Duration,
    /// Worker processes (at least 1).
    pub workers: u32,
    /// Lock keys the workers share (at least 1); fewer keys, more contention.
    pub keys: u32,
    /// Where to write the history (JSON lines); it is replaced.
    pub history: PathBuf,
    /// The `palisade` binary, which serves the replicas and runs the workers.
    pub exe: PathBuf,
    /// Every part on loopback, as on a machine without the privilege for network hosts
    /// (`CAP_NET_ADMIN` and `CAP_SYS_ADMIN`); the network faults are not planned then.
    pub loopback: bool,
}
