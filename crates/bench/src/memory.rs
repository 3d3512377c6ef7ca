//! `MemoryStore` at scale: bytes per resource (resident memory before and after inserting
//! N resources, each structure measured in a fresh child process so freed memory of one
//! cannot hide the next) and the cost of a raise at N resources.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::process::Command;
use std::time::Instant;

use palisade_fence::{FencingToken, MemoryStore, Raise};

use crate::error::{BenchError, Result};
use crate::report::{f, Table};

/// The structures whose footprint is measured.
pub(crate) const STRUCTURES: [&str; 4] = [
    "MemoryStore",
    "moka Cache<u64, u64>",
    "HashMap<Box<str>, u64>",
    "HashMap<u64, u64>",
];

/// What the `MemoryStore` design notes say each structure is.
const NOTES: [&str; 4] = [
    "what ships: keyed 64-bit hash to mark in 64 locked shards, insertion queue, bounded, eviction floor",
    "moka keyed by a 64-bit hash of the resource (no key bytes)",
    "unbounded std map with the key bytes (no eviction, no concurrency)",
    "unbounded std map keyed by a 64-bit hash",
];

fn key(i: usize) -> String {
    format!("orders/invoice-{i:08}")
}

fn token(v: u64) -> FencingToken {
    FencingToken::from_u64(v).unwrap_or(FencingToken::MAX)
}

/// Resident memory of this process in bytes (`VmRSS` of `/proc/self/status`).
fn rss() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or(BenchError::Unexpected("no VmRSS in /proc/self/status"))
}

/// CPU time of the calling thread (user + system) in nanoseconds, from
/// `/proc/thread-self/stat` (10 ms ticks): on a shared machine wall time also counts the
/// time other processes had the core.
fn thread_cpu_ns() -> Result<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat")?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(u), Some(s)) => Ok((u + s) * 10_000_000),
        _ => Err(BenchError::Unexpected(
            "no CPU times in /proc/thread-self/stat",
        )),
    }
}

/// A 64-bit hash of a resource name, the same for every call.
fn hash64(s: &str) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(s)
}

/// In a child process: builds structure `which` with `n` resources and prints the
/// resident bytes it added per resource.
pub(crate) fn child(which: usize, n: usize) -> Result<()> {
    let keys: Vec<String> = (0..n).map(key).collect();
    let hashes: Vec<u64> = keys.iter().map(|k| hash64(k)).collect();
    let before = rss()?;
    let kept: Box<dyn std::any::Any> = match which {
        0 => {
            let store = MemoryStore::new(n as u64 + 1);
            for (i, k) in keys.iter().enumerate() {
                if !store.raise_now(k, token(i as u64 + 1)).is_admitted() {
                    return Err(BenchError::Unexpected("a fresh resource was refused"));
                }
            }
            Box::new(store)
        }
        1 => {
            let cache: moka::sync::Cache<u64, u64> = moka::sync::Cache::new(n as u64 + 1);
            for (i, h) in hashes.iter().enumerate() {
                cache.insert(*h, i as u64 + 1);
            }
            cache.run_pending_tasks();
            Box::new(cache)
        }
        2 => {
            let mut map: HashMap<Box<str>, u64> = HashMap::new();
            for (i, k) in keys.iter().enumerate() {
                map.insert(k.as_str().into(), i as u64 + 1);
            }
            Box::new(map)
        }
        _ => {
            let mut map: HashMap<u64, u64> = HashMap::new();
            for (i, h) in hashes.iter().enumerate() {
                map.insert(*h, i as u64 + 1);
            }
            Box::new(map)
        }
    };
    let after = rss()?;
    drop(kept);
    println!("{}", after.saturating_sub(before) as f64 / n as f64);
    Ok(())
}

/// Measures every structure (each in a child process) and the raise cost of
/// `MemoryStore` at `n` resources (`ops` raises per kind, in this process).
pub(crate) fn run(n: usize, ops: usize) -> Result<(Table, Table)> {
    let exe = std::env::current_exe()?;
    let mut footprint = Table::new(
        format!("Bytes per resource at {n} resources (resident memory after minus before, 23-byte keys such as `orders/invoice-00000042`; target for MemoryStore: <= 150)"),
        &["structure", "bytes/resource", "what it is"],
    );
    for (i, name) in STRUCTURES.iter().enumerate() {
        eprintln!("memory-store: {name}");
        let out = Command::new(&exe)
            .args([
                "memory-store",
                "--resources",
                &n.to_string(),
                "--child",
                &i.to_string(),
            ])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let bytes: f64 = text
            .trim()
            .parse()
            .map_err(|_| BenchError::Unexpected("the child process printed no byte count"))?;
        footprint.row(vec![(*name).to_owned(), f(bytes, 0), NOTES[i].to_owned()]);
    }

    let keys: Vec<String> = (0..n).map(key).collect();
    let store = MemoryStore::new(n as u64 + 1);
    for (i, k) in keys.iter().enumerate() {
        store.raise_now(k, token(1_000 + i as u64));
    }
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut pick = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    // Each resource's current mark, to send equal, newer and older tokens.
    let mut marks: Vec<u64> = (0..n).map(|i| 1_000 + i as u64).collect();
    let mut next = 1_000 + n as u64;
    let mut cost = Table::new(
        format!("MemoryStore raise at {n} resources ({ops} raises per row, one thread, random resources; CPU time has 10 ms ticks)"),
        &["raise", "ns/op (wall)", "ns/op (this thread's CPU)", "admitted"],
    );
    for kind in [
        "equal token (hit, no insert)",
        "newer token (insert)",
        "older token (refused)",
    ] {
        let mut admitted = 0usize;
        let t0 = Instant::now();
        let cpu0 = thread_cpu_ns()?;
        for _ in 0..ops {
            let r = pick();
            let t = match kind.as_bytes()[0] {
                b'e' => marks[r],
                b'n' => {
                    next += 1;
                    marks[r] = next;
                    next
                }
                _ => marks[r] - 1,
            };
            if store.raise_now(&keys[r], token(t)) == Raise::Admitted {
                admitted += 1;
            }
        }
        let ns = t0.elapsed().as_nanos() as f64 / ops as f64;
        let cpu = thread_cpu_ns()?.saturating_sub(cpu0) as f64 / ops as f64;
        cost.row(vec![
            kind.to_owned(),
            f(ns, 0),
            f(cpu, 0),
            format!("{admitted}/{ops}"),
        ]);
    }
    Ok((footprint, cost))
}
