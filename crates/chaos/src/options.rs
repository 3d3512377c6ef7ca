//! [`RunOptions`]: what a chaos run runs.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::ChaosError;

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

/// The environment variable that turns the workload's session races on for
/// [`run`](crate::run): `on` (or `1`) or `off` (or `0`); unset is off. With them on, some
/// of each worker's acquires lose their connection while the service still works on them
/// and are sent again on the same session, and some race a second task acquiring the
/// same lock on the same session (see [`crate::worker`]). A lock service that ends a hold
/// behind its holder's back then breaks the checker's rule (j).
pub const RACES_ENV: &str = "PALISADE_CHAOS_RACES";

/// Whether the session races are on, from [`RACES_ENV`].
///
/// # Errors
///
/// [`ChaosError::InvalidOptions`] for a value other than `on`, `off`, `1` or `0`.
pub fn races_from_env() -> Result<bool, ChaosError> {
    match std::env::var_os(RACES_ENV) {
        None => Ok(false),
        Some(v) => match v.to_str() {
            Some("on" | "1") => Ok(true),
            Some("off" | "0" | "") => Ok(false),
            _ => Err(ChaosError::InvalidOptions(
                "PALISADE_CHAOS_RACES must be `on` or `off`",
            )),
        },
    }
}
