//! The lock cycle (acquire + release) on real etcd: Palisade's core against etcd's own
//! lock service (v3lock) and the concurrency-mutex recipe done by hand, with the raw
//! acquire-shaped Txn rate of the same etcd as the ceiling.
//!
//! Each client has its own session (Palisade) or lease (the others) and, per cycle, picks
//! one of `keys` lock names at random. Round trips are etcd's own count of the unary
//! RPCs it answered during the variant's runs (watch and keepalive streams are not
//! unary calls), divided by the cycles.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use palisade_lock::{
    BoxFuture, EpochRecord, EpochStore, FileEpochStore, Hold, LockClass, LockName, Locker,
    LockerOptions, Mode, Namespace, Session, SpiffeId, StoreError,
};
use palisade_testkit::{EtcdBinaries, EtcdCluster};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::drive::{drive, Op};
use crate::error::{BenchError, Result};
use crate::etcd_ops::{raw_txn, recipe_cycle, unary_calls, v3lock_cycle};
use crate::report::{f, ratio, Sample, Table};

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct LockArgs {
    pub(crate) members: Vec<usize>,
    pub(crate) clients: Vec<usize>,
    pub(crate) keys: Vec<usize>,
    /// Holds kept (on other keys) while the cells run: the scaling runs.
    pub(crate) held: Vec<usize>,
    pub(crate) secs: Duration,
    pub(crate) rounds: usize,
}

/// The variants, in the order they take turns.
pub(crate) const VARIANTS: [&str; 5] = [
    "Palisade core",
    "Palisade core, epoch record in memory (diagnosis)",
    "etcd v3lock",
    "mutex recipe",
    "raw Txn",
];
const PALISADE: usize = 0;
const PALISADE_MEM: usize = 1;
const V3LOCK: usize = 2;
const RECIPE: usize = 3;
const RAW: usize = 4;

/// An epoch record kept in memory: the same max-merge as the durable stores, without the
/// write to disk. Not durable, so not for use; it shows what the durable record costs.
#[derive(Debug, Default)]
struct MemoryEpochStore {
    record: std::sync::Mutex<Option<EpochRecord>>,
}

impl EpochStore for MemoryEpochStore {
    fn load(&self) -> BoxFuture<'_, Result<Option<EpochRecord>, StoreError>> {
        let r = self
            .record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Box::pin(async move { Ok(r) })
    }

    fn store(&self, new: EpochRecord) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut r = self.record.lock().unwrap_or_else(|e| e.into_inner());
        *r = Some(match r.take() {
            Some(old) if old.epoch > new.epoch => old,
            Some(old) if old.epoch == new.epoch => EpochRecord {
                highest_grant_rev: old.highest_grant_rev.max(new.highest_grant_rev),
                ..new
            },
            _ => new,
        });
        Box::pin(async { Ok(()) })
    }
}

/// Runs every (members, keys, clients) cell and returns one table.
pub(crate) async fn run(args: &LockArgs) -> Result<Table> {
    let mut table = Table::new(
        format!(
            "Lock cycle (acquire + release) on etcd {}, {} s x {} rounds per cell; ratios = median of per-round ratios",
            EtcdBinaries::get().version(),
            args.secs.as_secs_f64(),
            args.rounds
        ),
        &[
            "members", "held", "keys", "clients", "variant", "cycles/s", "p50 ms", "p99 ms", "RPCs/cycle",
            "etcd CPU µs/cycle", "bench CPU µs/cycle", "vs v3lock", "vs raw Txn/s",
        ],
    );
    for &members in &args.members {
        eprintln!("lock: starting {members} etcd member(s)");
        let cluster = EtcdCluster::start(members).await;
        let endpoints = cluster.endpoints();
        let dir = tempfile::tempdir()?;
        let options =
            LockerOptions::new(endpoints.clone()).with_request_timeout(Duration::from_secs(2));
        let locker = Locker::connect(
            options.clone(),
            FileEpochStore::new(dir.path().join("epoch.json")),
        )
        .await?;
        // The diagnosis locker has its own key space (and so its own epoch record).
        let nodurable = Locker::connect(
            options.with_root("/palisade-nodurable/"),
            MemoryEpochStore::default(),
        )
        .await?;
        let mut class = LockClass::new("bench", "c", "");
        class.mode = Mode::Exclusive;
        for l in [&locker, &nodurable] {
            l.config()
                .put_namespace(&Namespace::new("bench", "bench"))
                .await?;
            l.config().put_class(&class).await?;
        }
        let etcd = Client::connect(endpoints.clone(), None).await?;
        let pids: Vec<u32> = (0..members).filter_map(|i| cluster.pid(i)).collect();
        let env = Env {
            lockers: [&locker, &nodurable],
            etcd: &etcd,
            endpoints: &endpoints,
            pids: &pids,
        };
        let mut holder = Holder::default();
        for &held in &args.held {
            holder.fill(&nodurable, held).await?;
            for &keys in &args.keys {
                for &clients in &args.clients {
                    eprintln!("lock: {members} member(s), {held} held, {keys} key(s), {clients} client(s)");
                    let at = Cell {
                        members,
                        held,
                        keys,
                        clients,
                    };
                    cell(&mut table, &env, at, args).await?;
                }
            }
        }
        holder.release().await;
        drop(cluster);
    }
    Ok(table)
}

/// What a cell runs against.
struct Env<'a> {
    lockers: [&'a Locker; 2],
    etcd: &'a Client,
    endpoints: &'a [String],
    pids: &'a [u32],
}

/// Where a cell is in the table.
#[derive(Debug, Clone, Copy)]
struct Cell {
    members: usize,
    held: usize,
    keys: usize,
    clients: usize,
}

/// Holds kept while cells run (the "held keys" of the scaling runs): at most 100 per
/// session, as etcd 3.4 slows after one lease deletes many keys.
#[derive(Default)]
struct Holder {
    holds: Vec<Hold>,
    sessions: Vec<Arc<Session>>,
}

impl Holder {
    /// Acquires holds on `held/<n>` until `target` are held (16 at a time).
    async fn fill(&mut self, locker: &Locker, target: usize) -> Result<()> {
        let t0 = Instant::now();
        while self.holds.len() < target {
            if self.holds.len() >= self.sessions.len() * 100 {
                let id = SpiffeId::new(format!("spiffe://bench/holder{}", self.sessions.len()))
                    .map_err(palisade_lock::Error::from)?;
                self.sessions.push(Arc::new(
                    locker.open_session(id, Duration::from_secs(60)).await?,
                ));
            }
            let session = Arc::clone(
                self.sessions
                    .last()
                    .ok_or(BenchError::Unexpected("no session"))?,
            );
            let room = (self.sessions.len() * 100).min(target) - self.holds.len();
            let batch = room.min(16);
            let start = self.holds.len();
            let mut tasks = Vec::with_capacity(batch);
            for n in start..start + batch {
                let (locker, session) = (locker.clone(), Arc::clone(&session));
                tasks.push(tokio::spawn(async move {
                    let name = LockName::new("bench", "c", format!("held/{n}"));
                    locker
                        .acquire(
                            &session,
                            &name,
                            Mode::Exclusive,
                            Instant::now() + Duration::from_secs(60),
                        )
                        .await
                }));
            }
            for t in tasks {
                self.holds.push(
                    t.await
                        .map_err(|_| BenchError::Unexpected("an acquire panicked"))??,
                );
            }
        }
        if target > 0 {
            eprintln!(
                "lock: {} holds held ({:.1} s to fill)",
                self.holds.len(),
                t0.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }

    async fn release(self) {
        for h in self.holds {
            let _ = h.release().await;
        }
        for s in self.sessions {
            if let Ok(s) = Arc::try_unwrap(s) {
                let _ = s.close().await;
            }
        }
    }
}

/// CPU time (user + system) of processes `pids`, in microseconds, from `/proc/<pid>/stat`
/// (clock ticks of 10 ms).
fn cpu_us(pids: &[Option<u32>]) -> u64 {
    pids.iter()
        .map(|pid| {
            let path = match pid {
                Some(p) => format!("/proc/{p}/stat"),
                None => "/proc/self/stat".to_owned(),
            };
            std::fs::read_to_string(path)
                .ok()
                .and_then(|s| {
                    // Fields after the command name (which may hold spaces) start at ')'.
                    let rest = s.rsplit_once(')')?.1;
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
                })
                .unwrap_or(0)
                * 10_000
        })
        .sum()
}

async fn cell(table: &mut Table, env: &Env<'_>, at: Cell, args: &LockArgs) -> Result<()> {
    let Cell {
        members,
        held,
        keys,
        clients,
    } = at;
    let (lockers, etcd, endpoints) = (env.lockers, env.etcd, env.endpoints);
    let etcd_pids: Vec<Option<u32>> = env.pids.iter().map(|p| Some(*p)).collect();
    let mut variants: Vec<Vec<Op>> = (0..VARIANTS.len())
        .map(|_| Vec::with_capacity(clients))
        .collect();
    let mut sessions = Vec::with_capacity(clients);
    let mut leases = Vec::with_capacity(clients);
    for i in 0..clients {
        let seed = 0x9e37_79b9_7f4a_7c15_u64 ^ ((i as u64 + 1) << 17) ^ keys as u64;
        for (v, locker) in [(PALISADE, lockers[0]), (PALISADE_MEM, lockers[1])] {
            let session = Arc::new(
                locker
                    .open_session(
                        SpiffeId::new(format!("spiffe://bench/w{i}"))
                            .map_err(palisade_lock::Error::from)?,
                        Duration::from_secs(30),
                    )
                    .await?,
            );
            sessions.push(Arc::clone(&session));
            variants[v].push(palisade_op(locker.clone(), session, keys, seed));
        }
        let lease = etcd.clone().lease_grant(600, None).await?.id();
        leases.push(lease);
        for v in [V3LOCK, RECIPE, RAW] {
            variants[v].push(etcd_op(v, etcd.clone(), lease, i, keys, seed));
        }
    }
    let mut merged: Vec<Sample> = (0..VARIANTS.len()).map(|_| Sample::new()).collect();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); VARIANTS.len()];
    let mut calls = vec![0u64; VARIANTS.len()];
    let mut etcd_cpu = vec![0u64; VARIANTS.len()];
    let mut own_cpu = vec![0u64; VARIANTS.len()];
    for round in 0..args.rounds {
        for v in 0..VARIANTS.len() {
            let before = unary_calls(endpoints).await?;
            let (e0, o0) = (cpu_us(&etcd_pids), cpu_us(&[None]));
            let (ops, s) = drive(std::mem::take(&mut variants[v]), args.secs).await?;
            let (e1, o1) = (cpu_us(&etcd_pids), cpu_us(&[None]));
            let after = unary_calls(endpoints).await?;
            variants[v] = ops;
            // The two metric scrapes are HTTP, not gRPC: they do not count themselves.
            calls[v] += after.saturating_sub(before);
            etcd_cpu[v] += e1.saturating_sub(e0);
            own_cpu[v] += o1.saturating_sub(o0);
            eprintln!(
                "  round {round} {}: {} cycles, {:.0}/s",
                VARIANTS[v],
                s.ops,
                s.rate()
            );
            rates[v].push(s.rate());
            merged[v].add(&s);
        }
    }
    let median_ratio = |a: usize, b: usize| {
        let mut r: Vec<f64> = rates[a]
            .iter()
            .zip(&rates[b])
            .filter(|(_, y)| **y > 0.0)
            .map(|(x, y)| x / y)
            .collect();
        r.sort_by(|x, y| x.total_cmp(y));
        if r.is_empty() {
            0.0
        } else if r.len() % 2 == 1 {
            r[r.len() / 2]
        } else {
            (r[r.len() / 2 - 1] + r[r.len() / 2]) / 2.0
        }
    };
    for (v, s) in merged.iter().enumerate() {
        let per = |x: u64| {
            if s.ops > 0 {
                x as f64 / s.ops as f64
            } else {
                0.0
            }
        };
        table.row(vec![
            members.to_string(),
            held.to_string(),
            keys.to_string(),
            clients.to_string(),
            VARIANTS[v].to_owned(),
            f(s.rate(), 0),
            f(s.ms(0.5), 2),
            f(s.ms(0.99), 2),
            f(per(calls[v]), 2),
            f(per(etcd_cpu[v]), 0),
            f(per(own_cpu[v]), 0),
            if v == RAW {
                "-".to_owned()
            } else {
                ratio(median_ratio(v, V3LOCK))
            },
            ratio(median_ratio(v, RAW)),
        ]);
    }
    for lease in leases {
        let _ = etcd.clone().lease_revoke(lease).await;
    }
    for s in sessions {
        if let Ok(s) = Arc::try_unwrap(s) {
            let _ = s.close().await;
        }
    }
    Ok(())
}

fn next_key(rng: &mut u64, keys: usize) -> usize {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    (*rng % keys.max(1) as u64) as usize
}

fn palisade_op(locker: Locker, session: Arc<Session>, keys: usize, mut rng: u64) -> Op {
    Box::new(move || {
        let name = LockName::new("bench", "c", format!("k{}", next_key(&mut rng, keys)));
        let (locker, session) = (locker.clone(), Arc::clone(&session));
        Box::pin(async move {
            let hold = locker
                .acquire(
                    &session,
                    &name,
                    Mode::Exclusive,
                    Instant::now() + Duration::from_secs(60),
                )
                .await?;
            if hold.token().is_none() {
                return Err(BenchError::Unexpected("a grant without a token"));
            }
            hold.release().await?;
            Ok(())
        })
    })
}

fn etcd_op(v: usize, client: Client, lease: i64, worker: usize, keys: usize, mut rng: u64) -> Op {
    let client = Arc::new(Mutex::new(client));
    Box::new(move || {
        let k = next_key(&mut rng, keys);
        let client = Arc::clone(&client);
        Box::pin(async move {
            // Each worker has its own clone (one gRPC channel underneath); the mutex is
            // never contended.
            let mut c = client.lock().await;
            match v {
                V3LOCK => v3lock_cycle(&mut c, &format!("/bench/v3lock/k{k}"), lease).await,
                RAW => raw_txn(&mut c, &format!("/bench/raw/w{worker}"), lease).await,
                _ => recipe_cycle(&mut c, &format!("/bench/recipe/k{k}/"), lease).await,
            }
        })
    })
}
