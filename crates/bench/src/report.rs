//! Samples (operation counts and latency histograms) and the tables they are printed as.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;

/// What one variant did over all its rounds: operations, time spent, latencies (µs).
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) ops: u64,
    pub(crate) elapsed: Duration,
    pub(crate) latency_us: Histogram<u64>,
}

impl Sample {
    pub(crate) fn new() -> Sample {
        Sample {
            ops: 0,
            elapsed: Duration::ZERO,
            latency_us: histogram(),
        }
    }

    pub(crate) fn add(&mut self, other: &Sample) {
        self.ops += other.ops;
        self.elapsed += other.elapsed;
        // Both histograms have the same bounds; values above them were clamped on record.
        let _ = self.latency_us.add(&other.latency_us);
    }

    /// Operations per second over the time the variant ran.
    pub(crate) fn rate(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.ops as f64 / s
        } else {
            0.0
        }
    }

    /// A latency quantile in milliseconds.
    pub(crate) fn ms(&self, q: f64) -> f64 {
        self.latency_us.value_at_quantile(q) as f64 / 1_000.0
    }
}

/// A histogram of microseconds from 1 µs to 60 s, 3 significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3)
        .expect("constant bounds are valid: 1 <= low, high >= 2 * low, 3 digits")
}

/// Records a latency, clamped into the histogram's range.
pub(crate) fn record(h: &mut Histogram<u64>, d: Duration) {
    let us = (d.as_micros() as u64).clamp(1, 60_000_000);
    h.saturating_record(us);
}

/// A Markdown table: a title line, a header and rows of cells.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(title: impl Into<String>, header: &[&str]) -> Table {
        Table {
            title: title.into(),
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Prints the table to stdout (the bench's only output there; progress goes to stderr).
    pub(crate) fn print(&self) {
        let mut out = String::new();
        let _ = writeln!(out, "\n### {}\n", self.title);
        let _ = writeln!(out, "| {} |", self.header.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(self.header.len()));
        for r in &self.rows {
            let _ = writeln!(out, "| {} |", r.join(" | "));
        }
        print!("{out}");
    }
}

/// `x` with `digits` decimals.
pub(crate) fn f(x: f64, digits: usize) -> String {
    format!("{x:.digits$}")
}

/// A ratio with two decimals and an `x`.
pub(crate) fn ratio(r: f64) -> String {
    format!("{r:.2}x")
}
