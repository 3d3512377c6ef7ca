//! The run: start every part, let the workers work while the nemesis injects faults,
//! stop, read etcd's history and the audit trail back, and summarize.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_client::Client;
use palisade_testkit::{EtcdCluster, PgServer};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::audit_rows::{self, Replayed};
use crate::clock::RunClock;
use crate::error::ChaosError;
use crate::etcd_history;
use crate::etcd_history::RevisionSpace;
use crate::history::{self, Entry, Event, LockName, WriteOutcome};
use crate::interrupt::{self, Ended, Interrupts};
use crate::layout::Layout;
use crate::marks::{self, Marked, SpaceCell};
use crate::options::RunOptions;
use crate::procs::{Replicas, Workers};
use crate::resource::{self, ResourceService};
use crate::schedule;
use crate::summary::{RunTallies, Summary};
use crate::worker::{WorkerConfig, CLASS, NAMESPACE};
use palisade_api::keys::RootKeys;

/// The lock service's key space root (its default).
pub(crate) const ROOT: &str = "/palisade/";
/// Lock-service replicas.
pub(crate) const REPLICAS: usize = 2;
/// etcd members of the home tier.
pub(crate) const ETCD_MEMBERS: usize = 3;
/// etcd members of the spare tier.
pub(crate) const SPARE_MEMBERS: usize = 1;
/// The workers' session TTL.
pub(crate) const TTL: Duration = Duration::from_secs(3);
/// The identity that administers the service.
pub(crate) const ADMIN: &str = "spiffe://chaos/admin";
/// The second admin, who approves the first one's force releases.
pub(crate) const ADMIN2: &str = "spiffe://chaos/admin2";
/// The `worker` of entries the runner and the nemesis record.
pub(crate) const RUNNER: u32 = u32::MAX;
/// The home tier's name (`--home-tier`): the three-member etcd, which holds the
/// directory and serves the workers' namespace at the start.
pub(crate) const HOME_TIER: &str = "home";
/// The other tier's name: a one-member etcd the rehome fault moves the namespace to.
pub(crate) const SPARE_TIER: &str = "spare";

/// The tier as the history names it: `None` for the home tier.
pub(crate) fn tier_field(name: &str) -> Option<String> {
    (name != HOME_TIER).then(|| name.to_owned())
}

const AUTHZ: &str = "admins = [\"spiffe://chaos/admin\", \"spiffe://chaos/admin2\"]\n\n[[namespace]]\nid = \"chaos\"\n\n\
    [[namespace.grant]]\nids = [\"spiffe://chaos/workers/\"]\nclasses = [\"cells\"]\n";

/// Everything a run holds while it runs.
pub(crate) struct Run {
    pub(crate) layout: Arc<Layout>,
    pub(crate) clock: RunClock,
    pub(crate) etcd: EtcdCluster,
    /// The spare tier's etcd (one member: the nemesis faults only the home tier's).
    pub(crate) spare: EtcdCluster,
    /// The tier the workers' namespace lives on.
    pub(crate) ns_tier: String,
    /// The home tier's revision space, held by the restore fault while it replaces the
    /// cluster (see `marks`).
    pub(crate) home_space: SpaceCell,
    pub(crate) pg: PgServer,
    pub(crate) replicas: Replicas,
    pub(crate) workers: Option<Workers>,
    pub(crate) entries: mpsc::UnboundedSender<Entry>,
    pub(crate) audit_pool: deadpool_postgres::Pool,
    pub(crate) space: RevisionSpace,
    /// Holds read from revision spaces a restore destroyed.
    pub(crate) holds: Vec<Event>,
    /// Hold ends read that matched no hold of their space (see `etcd_history::Holds`).
    pub(crate) unmatched_ends: u64,
    pub(crate) replayed: Vec<Replayed>,
    pub(crate) snapshot: Option<palisade_testkit::Snapshot>,
    pub(crate) holding: Holding,
}

/// The workers that hold a lock right now, as their entries tell, with the lock and
/// token (so the nemesis can pause a holder, whose next write then carries a token that
/// may have gone stale, or force-release its hold).
/// Also the highest token granted so far for each lock, each worker's last write with a
/// token and the highest token committed on each resource, so the nemesis can tell when a
/// paused holder's lock has gone to another worker and its write has gone stale.
#[derive(Debug, Clone, Default)]
pub(crate) struct Holding(Arc<Mutex<HoldingState>>);

#[derive(Debug, Default)]
struct HoldingState {
    holders: BTreeMap<u32, (LockName, u64)>,
    highest: BTreeMap<LockName, u64>,
    /// Per worker: when (`at_ns`) it recorded its last write with a token, the resource
    /// and the token.
    writes: BTreeMap<u32, (u64, String, u64)>,
    /// Per resource: the highest token a committed write carried.
    committed: BTreeMap<String, u64>,
}

impl Holding {
    fn observe(&self, entry: &Entry) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match &entry.event {
            Event::Granted { lock, token, .. } => {
                s.holders.insert(entry.worker, (lock.clone(), *token));
                let highest = s.highest.entry(lock.clone()).or_default();
                *highest = (*highest).max(*token);
            }
            // By token: a worker's second task racing on its session ends its own hold,
            // not the one the worker goes on with.
            Event::Released { token, .. }
            | Event::Lost { token, .. }
            | Event::ReleaseUnknown { token, .. }
                if s.holders
                    .get(&entry.worker)
                    .is_some_and(|(_, t)| t == token) =>
            {
                s.holders.remove(&entry.worker);
            }
            Event::WriteInvoked {
                resource,
                token: Some(token),
                ..
            } => {
                s.writes
                    .insert(entry.worker, (entry.at_ns, resource.clone(), *token));
            }
            Event::WriteCompleted {
                resource,
                token: Some(token),
                outcome: WriteOutcome::Committed { .. },
                ..
            } => {
                let highest = s.committed.entry(resource.clone()).or_default();
                *highest = (*highest).max(*token);
            }
            _ => {}
        }
    }

    /// Whether `lock` was granted with a token above `token` since.
    pub(crate) fn granted_above(&self, lock: &LockName, token: u64) -> bool {
        let s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.highest.get(lock).is_some_and(|t| *t > token)
    }

    /// The resource and token of the last write with a token that `worker` recorded at
    /// or after `since_ns`.
    pub(crate) fn write_since(&self, worker: u32, since_ns: u64) -> Option<(String, u64)> {
        let s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.writes
            .get(&worker)
            .filter(|(at, _, _)| *at >= since_ns)
            .map(|(_, resource, token)| (resource.clone(), *token))
    }

    /// Whether a write carrying a token above `token` has committed on `resource`.
    pub(crate) fn committed_above(&self, resource: &str, token: u64) -> bool {
        let s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.committed.get(resource).is_some_and(|t| *t > token)
    }

    /// Worker number `pick % holders` among the holders, if any, with its lock and token.
    pub(crate) fn pick(&self, pick: u32) -> Option<(u32, LockName, u64)> {
        let s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = u32::try_from(s.holders.len()).ok().filter(|n| *n > 0)?;
        s.holders
            .iter()
            .nth((pick % n) as usize)
            .map(|(w, (lock, token))| (*w, lock.clone(), *token))
    }
}

impl Run {
    /// Records a runner entry.
    pub(crate) fn record(&self, event: Event) {
        let _ = self.entries.send(Entry {
            at_ns: self.clock.at_ns(),
            worker: RUNNER,
            event,
        });
    }

    /// The admin client of replica `i`.
    pub(crate) fn admin(&self, i: usize) -> Result<Client, ChaosError> {
        self.admin_as(i, ADMIN)
    }

    /// A client of replica `i` with the identity `admin`.
    pub(crate) fn admin_as(&self, i: usize, admin: &str) -> Result<Client, ChaosError> {
        let url = self.replicas.urls()[i].clone();
        Client::new(url)
            .map(|c| c.with_dev_identity(admin))
            .map_err(ChaosError::service("building the admin client"))
    }

    /// The epoch replica `i` serves, and whether it refuses grants.
    pub(crate) async fn epoch_of(&self, i: usize) -> Result<(u16, bool), ChaosError> {
        let v = self
            .admin(i)?
            .call_json("GET", "/v1/epoch", None)
            .await
            .map_err(ChaosError::service("reading the epoch"))?;
        Ok((epoch_field(&v), !v["grants_refused"].is_null()))
    }
}

pub(crate) fn epoch_field(v: &Value) -> u16 {
    v["epoch"]
        .as_u64()
        .and_then(|e| u16::try_from(e).ok())
        .unwrap_or(0)
}

/// Calls `f` until it succeeds or `limit` passes; returns the last error.
pub(crate) async fn retry<T, F, Fut>(limit: Duration, mut f: F) -> Result<T, ChaosError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ChaosError>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Runs the harness once; see the crate docs for what it starts and checks.
///
/// On network hosts unless `options.loopback`. A SIGINT or SIGTERM stops the run: every
/// process, directory and network host of it is removed, the history keeps whole lines,
/// and the result is [`ChaosError::Interrupted`] (see [`crate::Interrupt`]); further
/// signals meanwhile are ignored. Call it at most once at a time per process: it catches
/// both signals for the rest of the process's life.
///
/// # Errors
///
/// [`ChaosError`] when a part cannot be started, driven or read back, when network hosts
/// cannot be made ([`ChaosError::Net`]; without the privilege it names the missing
/// capability and suggests `--loopback`), or when interrupted. Safety violations are
/// not errors: they are in the returned summary.
pub async fn run(options: RunOptions) -> Result<Summary, ChaosError> {
    if options.workers == 0 || options.keys == 0 {
        return Err(ChaosError::InvalidOptions(
            "--workers and --keys must be at least 1",
        ));
    }
    let races = crate::options::races_from_env()?;
    let mut interrupts = Interrupts::listen()?;
    // Hosts first: without the privilege, the run fails before it makes anything.
    let layout = Arc::new(if options.loopback {
        Layout::loopback()
    } else {
        Layout::hosts(options.workers)?
    });
    let dir = tempfile::Builder::new()
        .prefix("palisade-chaos-")
        .tempdir()
        .map_err(ChaosError::io("creating the run directory"))?;
    let file = std::fs::File::create(&options.history).map_err(ChaosError::io(format!(
        "creating {}",
        options.history.display()
    )))?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Entry>();
    let holding = Holding::default();
    let seen = holding.clone();
    let writer = tokio::spawn(async move {
        let mut out = std::io::BufWriter::new(file);
        while let Some(entry) = rx.recv().await {
            seen.observe(&entry);
            history::write_entry(&mut out, &entry)?;
        }
        out.flush()
    });
    let clock = RunClock::start();
    let ended = {
        let (options, path, layout) = (options.clone(), dir.path().to_owned(), layout.clone());
        let runner = layout.runner();
        interrupt::on_own_thread(&mut interrupts, runner, move || async move {
            drive(&options, races, path, clock, tx, holding, layout).await
        })
        .await
    };
    // Every sender is gone with the run's thread: the writer ends after the last whole
    // entry.
    let written = writer
        .await
        .map_err(|e| ChaosError::NotReady(format!("the history writer ({e})")))?;
    written.map_err(ChaosError::io(format!(
        "writing {}",
        options.history.display()
    )))?;
    let extra = match ended {
        Ok(Ended::Done(Ok(extra))) => extra,
        Ok(Ended::Interrupted(signal)) => {
            drop(dir);
            drop(layout);
            return Err(ChaosError::Interrupted {
                signal,
                history: options.history.clone(),
            });
        }
        Ok(Ended::Done(Err(e))) | Err(e) => {
            keep_logs(dir);
            return Err(e);
        }
    };
    drop(layout);
    let file = std::fs::File::open(&options.history).map_err(ChaosError::io(format!(
        "reading {}",
        options.history.display()
    )))?;
    let entries = history::read_history(std::io::BufReader::new(file))?;
    let report = crate::check::check(&entries);
    let mut summary = Summary::of(&options, &entries, extra);
    summary.violations = Some(report.violations.iter().map(ToString::to_string).collect());
    summary.audit_lost_with_cluster = report.counts.audit_lost_with_cluster;
    Ok(summary)
}

/// Keeps the logs of a run that failed.
fn keep_logs(dir: tempfile::TempDir) {
    let kept: &Path = &dir.keep();
    tracing::error!(logs = %kept.display(), "the run failed; its logs are kept");
    eprintln!("chaos: the run's logs are in {}", kept.display());
}

async fn drive(
    options: &RunOptions,
    races: bool,
    dir: PathBuf,
    clock: RunClock,
    entries: mpsc::UnboundedSender<Entry>,
    holding: Holding,
    layout: Arc<Layout>,
) -> Result<RunTallies, ChaosError> {
    // PostgreSQL of its own, so the nemesis may restart it.
    let pg = PgServer::start_placed(layout.pg()).await?;
    let admin_pool = palisade_audit::pool(&pg.connection_string("postgres"), 1)?;
    admin_pool
        .get()
        .await
        .map_err(|e| ChaosError::NotReady(format!("the private PostgreSQL ({e})")))?
        .batch_execute("CREATE DATABASE chaos")
        .await
        .map_err(ChaosError::pg("creating the run's database"))?;
    drop(admin_pool);
    let database = pg.connection_string("chaos");
    let pool = palisade_audit::pool(&database, 16)?;
    resource::prepare(&pool, options.keys).await?;

    let placements: Vec<_> = (0..ETCD_MEMBERS).map(|i| layout.etcd(i)).collect();
    let etcd = EtcdCluster::start_placed(&placements).await;
    let placements: Vec<_> = (0..SPARE_MEMBERS).map(|i| layout.spare_etcd(i)).collect();
    let spare = EtcdCluster::start_placed(&placements).await;
    std::fs::write(dir.join("authz.toml"), AUTHZ).map_err(ChaosError::io("writing authz.toml"))?;
    let mut replicas = Replicas::new(
        options.exe.clone(),
        dir.clone(),
        &etcd.endpoints(),
        &spare.endpoints(),
        &database,
        (0..REPLICAS).map(|i| layout.replica(i)).collect(),
    )?;
    for i in 0..REPLICAS {
        replicas.start(i).await?;
    }
    let mut run = Run {
        layout: layout.clone(),
        clock,
        etcd,
        spare,
        ns_tier: HOME_TIER.to_owned(),
        home_space: SpaceCell::default(),
        pg,
        replicas,
        workers: None,
        entries,
        audit_pool: pool.clone(),
        space: RevisionSpace {
            epoch: 0,
            from: 1,
            number: 0,
        },
        holds: Vec::new(),
        unmatched_ends: 0,
        replayed: Vec::new(),
        snapshot: None,
        holding,
    };
    let admin = run.admin(0)?;
    retry(Duration::from_secs(30), || async {
        admin
            .call_json(
                "PUT",
                &format!("/v1/namespaces/{NAMESPACE}"),
                Some(json!({ "tenant_id": "chaos" })),
            )
            .await
            .map_err(ChaosError::service("creating the namespace"))?;
        admin
            .call_json(
                "PUT",
                &format!("/v1/namespaces/{NAMESPACE}/classes/{CLASS}"),
                Some(json!({ "key_prefix": "", "ttl_min_ms": 1000, "ttl_max_ms": 60000 })),
            )
            .await
            .map_err(ChaosError::service("creating the lock class"))
    })
    .await?;
    run.space.epoch = run.epoch_of(0).await?.0;

    // The audit tailer of each tier, in this process, into the private PostgreSQL.
    let mut tailers = Vec::new();
    for endpoints in [run.etcd.endpoints(), run.spare.endpoints()] {
        let tailer = palisade_audit::Tailer::connect(&endpoints, None, pool.clone())
            .await?
            .with_root(ROOT);
        tailers.push(tokio::spawn(async move {
            let never = tailer.run().await;
            match never {}
        }));
    }
    let marker = marks::spawn(
        vec![
            Marked {
                tier: None,
                endpoints: run.etcd.endpoints(),
                space: run.home_space.clone(),
            },
            Marked {
                tier: tier_field(SPARE_TIER),
                endpoints: run.spare.endpoints(),
                space: SpaceCell::default(),
            },
        ],
        ROOT.to_owned(),
        clock,
        run.entries.clone(),
    );
    let service = ResourceService::start(
        pool.clone(),
        dir.join("audit-spool.jsonl"),
        layout.resource_addr(),
    )
    .await?;

    let configs = (0..options.workers)
        .map(|id| WorkerConfig {
            id,
            seed: options.seed,
            start_ns: clock.start_ns(),
            services: run.replicas.urls(),
            resource_url: service.url.clone(),
            database: database.clone(),
            keys: options.keys,
            ttl_ms: TTL.as_millis() as u64,
            races,
        })
        .collect();
    let places: Vec<_> = (0..options.workers as usize)
        .map(|i| layout.worker(i))
        .collect();
    run.workers = Some(Workers::spawn(
        &options.exe,
        &dir,
        configs,
        &places,
        &run.entries,
    )?);

    // Faults until the time is up; the first round (one of each kind) always completes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut kinds = schedule::ALL_KINDS.to_vec();
    if layout.network().is_some() {
        kinds.extend(schedule::NET_KINDS);
        if layout.netem.is_ok() {
            kinds.push(crate::history::FaultKind::NetemLatency);
        }
    }
    let plan = schedule::plan(options.seed, 10_000, &kinds);
    for (n, fault) in plan.iter().enumerate() {
        let left = options
            .duration
            .saturating_sub(Duration::from_nanos(run.clock.at_ns()));
        if n >= kinds.len() && left < fault.gap + fault.hold + TTL * 2 {
            break;
        }
        run.inject(fault, plan.get(n + 1)).await?;
    }
    let left = options
        .duration
        .saturating_sub(Duration::from_nanos(run.clock.at_ns()));
    tokio::time::sleep(left).await;

    // Stop the writers, then the replicas; wait until every session's lease is gone.
    let mut workers_failed = Vec::new();
    if let Some(workers) = run.workers.take() {
        workers_failed = workers.stop(Duration::from_secs(15)).await?;
    }
    run.replicas.stop_all().await;
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    drop(marker);
    let sink_dropped = service.stop().await;

    // etcd's history of the last revision space.
    // The whole root: a hold's end is told by its lease's marker too.
    let prefix = RootKeys::new(ROOT).root().to_owned();
    let read = etcd_history::read(
        &run.etcd.endpoints(),
        &prefix,
        run.space.from,
        etcd_history::Head::Linearizable,
        true,
    )
    .await?;
    let mut holds = std::mem::take(&mut run.holds);
    let found = etcd_history::holds(&RootKeys::new(ROOT), &read, run.space, None);
    holds.extend(found.holds);
    let mut unmatched_ends = run.unmatched_ends + found.unmatched_ends;
    // The spare tier's, one revision space (the nemesis never restores it).
    let spare_read = etcd_history::read(
        &run.spare.endpoints(),
        &prefix,
        1,
        etcd_history::Head::Linearizable,
        false,
    )
    .await?;
    let spare_space = RevisionSpace {
        epoch: 0,
        from: 1,
        number: 0,
    };
    let found = etcd_history::holds(
        &RootKeys::new(ROOT),
        &spare_read,
        spare_space,
        Some(SPARE_TIER),
    );
    holds.extend(found.holds);
    unmatched_ends += found.unmatched_ends;
    let mut caught_up = true;
    for r in [&read, &spare_read] {
        let last_lock_rev = r.last_lock_revision(&RootKeys::new(ROOT));
        if last_lock_rev > 0 {
            let limit = Duration::from_secs(60);
            caught_up &=
                audit_rows::wait_for_tailer(&pool, r.cluster_id, last_lock_rev, limit).await?;
        }
    }
    for tailer in tailers {
        tailer.abort();
    }
    let audit = audit_rows::read(&pool, &run.replayed).await?;
    for e in holds.into_iter().chain(audit.rows) {
        run.record(e);
    }
    Ok(RunTallies {
        audit_replayed: audit.replayed,
        unmatched_ends,
        audit_gaps: audit.gaps,
        sink_dropped,
        tailer_caught_up: caught_up,
        workers_failed,
        kinds,
        notes: {
            let mut notes = layout.notes();
            if races {
                notes.push(format!(
                    "session races on ({}=on): acquires sent again after a reset, two tasks on one session",
                    crate::options::RACES_ENV
                ));
            }
            notes
        },
    })
}
