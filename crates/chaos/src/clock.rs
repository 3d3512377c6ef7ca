//! The run's one clock: `CLOCK_MONOTONIC`, which every process of the machine shares, so
//! the runner and its worker processes stamp entries on the same time line.

use nix::time::{clock_gettime, ClockId};

/// Nanoseconds on `CLOCK_MONOTONIC` (the clock behind `std::time::Instant` on Linux). It
/// keeps running while a process is stopped (SIGSTOP), which is what a pause must show.
pub fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail on Linux; 0 would only make an entry look early.
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| {
            (t.tv_sec() as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(t.tv_nsec() as u64)
        })
        .unwrap_or(0)
}

/// A run's start on the shared clock; [`RunClock::at_ns`] gives an entry's `at_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunClock {
    start_ns: u64,
}

impl RunClock {
    /// A run starting now.
    pub fn start() -> RunClock {
        RunClock {
            start_ns: monotonic_ns(),
        }
    }

    /// A run that started at `start_ns` (as another process read [`monotonic_ns`]).
    pub fn from_start(start_ns: u64) -> RunClock {
        RunClock { start_ns }
    }

    /// The start, in [`monotonic_ns`] nanoseconds.
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// Nanoseconds since the start.
    pub fn at_ns(&self) -> u64 {
        monotonic_ns().saturating_sub(self.start_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_clocks_from_one_start_agree_and_move_forward() {
        let a = RunClock::start();
        let b = RunClock::from_start(a.start_ns());
        let first = a.at_ns();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let second = b.at_ns();
        assert!(second >= first + 5_000_000, "{first} then {second}");
    }
}
