//! The load driver: N workers each run one operation in a loop for a fixed time; variants
//! of a comparison take turns (A, B, C, A, B, C...) so that they share the machine's
//! noise.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{BenchError, Result};
use crate::report::{histogram, record, Sample};

/// The future of one operation.
pub(crate) type OpFuture = Pin<Box<dyn Future<Output = Result<()>> + Send>>;
/// One worker: makes the next operation (it owns its connection, session...).
pub(crate) type Op = Box<dyn FnMut() -> OpFuture + Send>;

/// Runs every worker of `ops` for `secs` (each loops: one operation, record its latency)
/// and returns the workers (to run again) with what they did.
pub(crate) async fn drive(ops: Vec<Op>, secs: Duration) -> Result<(Vec<Op>, Sample)> {
    let start = Instant::now();
    let deadline = start + secs;
    let mut tasks = Vec::with_capacity(ops.len());
    for mut op in ops {
        tasks.push(tokio::spawn(async move {
            let mut h = histogram();
            let mut n = 0u64;
            let mut failed = None;
            while Instant::now() < deadline {
                let t0 = Instant::now();
                if let Err(e) = op().await {
                    failed = Some(e);
                    break;
                }
                record(&mut h, t0.elapsed());
                n += 1;
            }
            (op, n, h, failed)
        }));
    }
    let mut sample = Sample::new();
    let mut back = Vec::with_capacity(tasks.len());
    let mut first_error = None;
    for t in tasks {
        let (op, n, h, failed) = t
            .await
            .map_err(|_| BenchError::Unexpected("a worker panicked"))?;
        sample.ops += n;
        let _ = sample.latency_us.add(&h);
        if first_error.is_none() {
            first_error = failed;
        }
        back.push(op);
    }
    sample.elapsed = start.elapsed();
    match first_error {
        Some(e) => Err(e),
        None => Ok((back, sample)),
    }
}

/// What [`interleave`] measured: per variant, the merged sample and each round's rate.
#[derive(Debug)]
pub(crate) struct Interleaved {
    pub(crate) merged: Vec<Sample>,
    pub(crate) rounds: Vec<Vec<f64>>,
}

impl Interleaved {
    /// The median over rounds of `variant`'s rate divided by `base`'s rate in the same
    /// round: the ratio of neighbours in time, robust against a stall in one round.
    pub(crate) fn ratio(&self, variant: usize, base: usize) -> f64 {
        let mut r: Vec<f64> = self.rounds[variant]
            .iter()
            .zip(&self.rounds[base])
            .filter(|(_, b)| **b > 0.0)
            .map(|(v, b)| v / b)
            .collect();
        r.sort_by(|a, b| a.total_cmp(b));
        match r.len() {
            0 => 0.0,
            n if n % 2 == 1 => r[n / 2],
            n => (r[n / 2 - 1] + r[n / 2]) / 2.0,
        }
    }
}

/// Runs each variant's workers for `secs`, `rounds` times, in turn (variant 0, 1, ...,
/// then again), and returns what each variant did.
pub(crate) async fn interleave(
    mut variants: Vec<Vec<Op>>,
    rounds: usize,
    secs: Duration,
) -> Result<Interleaved> {
    let mut merged: Vec<Sample> = variants.iter().map(|_| Sample::new()).collect();
    let mut per_round: Vec<Vec<f64>> = variants.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (i, slot) in variants.iter_mut().enumerate() {
            let ops = std::mem::take(slot);
            let (ops, s) = drive(ops, secs).await?;
            eprintln!(
                "  round {round} variant {i}: {} ops, {:.0}/s",
                s.ops,
                s.rate()
            );
            merged[i].add(&s);
            per_round[i].push(s.rate());
            *slot = ops;
        }
    }
    Ok(Interleaved {
        merged,
        rounds: per_round,
    })
}
