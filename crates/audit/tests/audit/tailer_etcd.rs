//! The lock-event tailer against real etcd and PostgreSQL. Every test here starts etcd
//! (the module name carries `etcd`, so nextest runs them one at a time).

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use deadpool_postgres::Pool;
use etcd_client::{CompactionOptions, EventType, GetOptions, WatchOptions};
use palisade_audit::{insert_force_release, tailer_position, ClusterId, ForceRelease, Tailer};
use palisade_lock::{
    EpochReason, FencingToken, FileEpochStore, ForceMarker, Hold, LockClass, LockName, Locker,
    LockerOptions, Mode, Namespace, Session, SpiffeId,
};
use palisade_testkit::{EtcdCluster, Snapshot, TestDb};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::common::{admin, bring_up, eventually, migrated_db, take_down};

pub(crate) const NS: &str = "orders";
pub(crate) const CLASS: &str = "rows";
pub(crate) const ROOT: &str = "/palisade/";

pub(crate) struct Fixture {
    pub(crate) etcd: EtcdCluster,
    pub(crate) locker: Locker,
    dir: tempfile::TempDir,
    pub(crate) db: Arc<TestDb>,
    pub(crate) pool: Pool,
    pub(crate) cluster: ClusterId,
}

pub(crate) async fn fixture() -> Fixture {
    let etcd = EtcdCluster::single().await;
    let dir = tempfile::tempdir().unwrap();
    let options = LockerOptions::new(etcd.endpoints()).with_request_timeout(Duration::from_secs(2));
    let locker = Locker::connect(options, FileEpochStore::new(dir.path().join("epoch.json")))
        .await
        .unwrap();
    locker
        .config()
        .put_namespace(&Namespace::new(NS, "acme"))
        .await
        .unwrap();
    let mut class = LockClass::new(NS, CLASS, "");
    class.ttl_min = Duration::from_secs(1);
    class.ttl_max = Duration::from_secs(30);
    locker.config().put_class(&class).await.unwrap();
    let (db, pool) = migrated_db().await;
    let cluster = ClusterId(etcd.cluster_id().await);
    Fixture {
        etcd,
        locker,
        dir,
        db: Arc::new(db),
        pool,
        cluster,
    }
}

impl Fixture {
    /// A new cluster restored from `snapshot` (a new cluster id), audited into the same
    /// database, with a locker that has advanced the epoch as an operator would.
    async fn restored(&self, snapshot: &Snapshot) -> Fixture {
        let etcd = EtcdCluster::restore(snapshot, 1).await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            self.dir.path().join("epoch.json"),
            dir.path().join("epoch.json"),
        )
        .unwrap();
        let options =
            LockerOptions::new(etcd.endpoints()).with_request_timeout(Duration::from_secs(2));
        let locker = Locker::connect(options, FileEpochStore::new(dir.path().join("epoch.json")))
            .await
            .unwrap();
        locker.advance_epoch(EpochReason::Restore).await.unwrap();
        let cluster = ClusterId(etcd.cluster_id().await);
        Fixture {
            etcd,
            locker,
            dir,
            db: self.db.clone(),
            pool: self.pool.clone(),
            cluster,
        }
    }

    pub(crate) fn start_tailer(&self) -> JoinHandle<Infallible> {
        let tailer = Tailer::new(self.locker.client().clone(), self.pool.clone())
            .with_root(ROOT)
            .with_backoff(Duration::from_millis(10), Duration::from_millis(200));
        tokio::spawn(tailer.run())
    }

    pub(crate) async fn session(&self, who: &str, ttl: Duration) -> Session {
        self.locker
            .open_session(SpiffeId::new(format!("spiffe://acme/{who}")).unwrap(), ttl)
            .await
            .unwrap()
    }

    pub(crate) async fn acquire(&self, session: &Session, key: &str) -> Hold {
        let deadline = Instant::now() + Duration::from_secs(10);
        self.locker
            .acquire(
                session,
                &LockName::new(NS, CLASS, key),
                Mode::Exclusive,
                deadline,
            )
            .await
            .unwrap()
    }

    /// Writes a key the tailer must ignore and waits until the tailer's position reaches
    /// it: everything before it has been stored.
    pub(crate) async fn wait_caught_up(&self) {
        let mut client = self.locker.client().clone();
        let rev = client
            .put(format!("{ROOT}locks/zz-sentinel"), "x", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        // A connection of its own: the pool may hold connections a test's outage ended.
        let db = Arc::new(self.db.connect().await);
        let cluster = self.cluster;
        eventually("the tailer to catch up", || {
            let db = db.clone();
            async move {
                matches!(tailer_position(&*db, cluster).await, Ok(Some(p)) if p.as_i64() >= rev)
            }
        })
        .await;
    }

    async fn rows(&self) -> Vec<Row> {
        let client = self.db.connect().await;
        client
            .query(
                "SELECT revision, seq, type, lock_key, spiffe_id, token, gap_from, gap_to FROM audit_event \
                 WHERE cluster_id = $1 ORDER BY revision, seq",
                &[&self.cluster.to_sql()],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| Row {
                revision: r.get(0),
                seq: r.get(1),
                kind: r.get(2),
                lock_key: r.get(3),
                spiffe_id: r.get(4),
                token: r.get::<_, Option<i64>>(5).map(|t| t as u64),
                gap: r.get::<_, Option<i64>>(6).zip(r.get::<_, Option<i64>>(7)),
            })
            .collect()
    }

    pub(crate) async fn revision(&self) -> i64 {
        let mut client = self.locker.client().clone();
        client
            .get("x", Some(GetOptions::new().with_count_only()))
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision()
    }

    /// `n` grant-and-release cycles on one session; the tokens granted.
    pub(crate) async fn cycles(&self, who: &str, key: &str, n: usize) -> Vec<u64> {
        let session = self.session(who, Duration::from_secs(10)).await;
        let mut tokens = Vec::new();
        for _ in 0..n {
            let hold = self.acquire(&session, key).await;
            tokens.push(hold.token().unwrap().get());
            hold.release().await.unwrap();
        }
        session.close().await.unwrap();
        tokens
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    revision: i64,
    seq: i32,
    kind: String,
    lock_key: Option<String>,
    spiffe_id: Option<String>,
    token: Option<u64>,
    gap: Option<(i64, i64)>,
}

/// xorshift64*, seeded from the clock (the seed is printed so a failure can be rerun).
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        println!("rng seed {seed}");
        Rng(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// The revisions at which hold keys were created and deleted, read straight from etcd
/// history, up to `through`.
async fn hold_history(locker: &Locker, through: i64) -> (BTreeSet<i64>, BTreeSet<i64>) {
    let mut client = locker.client().clone();
    let options = WatchOptions::new().with_prefix().with_start_revision(1);
    let (_w, mut stream) = client
        .watch(format!("{ROOT}locks/"), Some(options))
        .await
        .unwrap();
    let (mut created, mut deleted) = (BTreeSet::new(), BTreeSet::new());
    loop {
        let resp = stream.message().await.unwrap().unwrap();
        let mut last = 0;
        for e in resp.events() {
            let kv = e.kv().unwrap();
            last = kv.mod_revision();
            if !kv.key_str().unwrap().contains("/h/") {
                continue;
            }
            match e.event_type() {
                EventType::Put if kv.version() == 1 => {
                    created.insert(kv.mod_revision());
                }
                EventType::Delete => {
                    deleted.insert(kv.mod_revision());
                }
                EventType::Put => {}
            }
        }
        if last >= through {
            return (created, deleted);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_tailer_killed_three_times_during_1000_cycles_loses_and_repeats_nothing() {
    const CYCLES: usize = 1000;
    const WORKERS: usize = 8;
    let fx = Arc::new(fixture().await);
    let mut rng = Rng::new();
    let tailer = Arc::new(Mutex::new(fx.start_tailer()));
    let next = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(Mutex::new(Vec::new()));
    let started = std::time::Instant::now();
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (fx, next, granted) = (fx.clone(), next.clone(), granted.clone());
        workers.push(tokio::spawn(async move {
            let who = format!("w{w}");
            let session = fx.session(&who, Duration::from_secs(10)).await;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= CYCLES {
                    break;
                }
                let key = format!("acct/{}", i % 4);
                let hold = fx.acquire(&session, &key).await;
                let token = hold.token().unwrap();
                granted
                    .lock()
                    .unwrap()
                    .push((key, token, format!("spiffe://acme/{who}")));
                hold.release().await.unwrap();
            }
            session.close().await.unwrap();
        }));
    }
    // Three kills spread over the cycles. The second is mid-batch for certain: another
    // transaction locks the cursor table, so the tailer has inserted a batch's rows and
    // waits to move its position when it is aborted.
    let blocker = fx.db.connect().await;
    let watcher = fx.db.connect().await;
    let targets = [
        150 + rng.below(250) as usize,
        400 + rng.below(100) as usize,
        650 + rng.below(250) as usize,
    ];
    let mut kills = 0;
    for (n, target) in targets.into_iter().enumerate() {
        while next.load(Ordering::Relaxed) < target {
            tokio::time::sleep(Duration::from_millis(2 + rng.below(5))).await;
        }
        let mid_batch = n == 1;
        if mid_batch {
            blocker
                .batch_execute("BEGIN; LOCK TABLE audit_cursor IN EXCLUSIVE MODE")
                .await
                .unwrap();
            let (watcher, name) = (&watcher, fx.db.name().to_owned());
            eventually("the tailer to wait inside its transaction", || {
                let name = name.clone();
                async move {
                    let n: i64 = watcher
                        .query_one(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
                            &[&name],
                        )
                        .await
                        .unwrap()
                        .get(0);
                    n > 0
                }
            })
            .await;
        }
        let done = next.load(Ordering::Relaxed);
        let handle = std::mem::replace(&mut *tailer.lock().unwrap(), fx.start_tailer());
        handle.abort();
        assert!(handle.await.unwrap_err().is_cancelled());
        if mid_batch {
            blocker.batch_execute("COMMIT").await.unwrap();
        }
        kills += 1;
        println!(
            "killed the tailer at cycle {done}{}",
            if mid_batch {
                ", inside its transaction"
            } else {
                ""
            }
        );
    }
    for w in workers {
        w.await.unwrap();
    }
    println!("{CYCLES} cycles in {:?}", started.elapsed());
    assert!(next.load(Ordering::Relaxed) >= CYCLES);
    assert_eq!(kills, 3);
    fx.wait_caught_up().await;
    tailer.lock().unwrap().abort();

    let rows = fx.rows().await;
    let granted = granted.lock().unwrap().clone();
    assert_eq!(granted.len(), CYCLES);
    // Grants: exactly the holds handed out, each with its token and holder.
    let expected: BTreeSet<(String, u64, String)> = granted
        .iter()
        .map(|(k, t, who)| (k.clone(), t.get(), who.clone()))
        .collect();
    assert_eq!(expected.len(), CYCLES, "tokens are unique");
    let grants: Vec<&Row> = rows.iter().filter(|r| r.kind == "grant").collect();
    let got: BTreeSet<(String, u64, String)> = grants
        .iter()
        .map(|r| {
            (
                r.lock_key.clone().unwrap(),
                r.token.unwrap(),
                r.spiffe_id.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(grants.len(), CYCLES, "one grant row per hold");
    assert_eq!(got, expected);
    for r in &grants {
        assert_eq!(
            FencingToken::from_u64(r.token.unwrap())
                .unwrap()
                .revision()
                .as_i64(),
            r.revision
        );
    }
    // Releases: one per hold, with the hold's token, after its grant.
    let grant_rev: BTreeMap<u64, i64> = grants
        .iter()
        .map(|r| (r.token.unwrap(), r.revision))
        .collect();
    let releases: Vec<&Row> = rows.iter().filter(|r| r.kind == "release").collect();
    assert_eq!(releases.len(), CYCLES, "one release row per hold");
    let released: BTreeSet<u64> = releases.iter().map(|r| r.token.unwrap()).collect();
    assert_eq!(released.len(), CYCLES);
    for r in &releases {
        assert!(r.revision > grant_rev[&r.token.unwrap()]);
    }
    assert_eq!(
        rows.len(),
        2 * CYCLES,
        "nothing but grants and releases: {:?}",
        rows.iter()
            .find(|r| r.kind != "grant" && r.kind != "release")
    );
    // And the rows sit exactly at the revisions where etcd history creates and deletes holds.
    let last = rows.iter().map(|r| r.revision).max().unwrap();
    let (created, deleted) = hold_history(&fx.locker, last).await;
    assert_eq!(
        grants.iter().map(|r| r.revision).collect::<BTreeSet<_>>(),
        created
    );
    assert_eq!(
        releases.iter().map(|r| r.revision).collect::<BTreeSet<_>>(),
        deleted
    );
}

#[tokio::test]
async fn etcd_tailer_records_one_expire_when_keepalive_stops() {
    let fx = fixture().await;
    let tailer = fx.start_tailer();
    let session = fx.session("frozen", Duration::from_secs(1)).await;
    let hold = fx.acquire(&session, "exp/1").await;
    let token = hold.token().unwrap().get();
    session.stop_keepalive();
    let (pool, cluster) = (fx.pool.clone(), fx.cluster.to_sql());
    eventually("an expire row", || {
        let pool = pool.clone();
        async move {
            let Ok(client) = pool.get().await else {
                return false;
            };
            let n: i64 = client
                .query_one(
                    "SELECT count(*) FROM audit_event WHERE cluster_id = $1 AND type = 'expire'",
                    &[&cluster],
                )
                .await
                .unwrap()
                .get(0);
            n > 0
        }
    })
    .await;
    fx.wait_caught_up().await;
    tailer.abort();
    drop(hold);
    let rows = fx.rows().await;
    let kinds: Vec<&str> = rows.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["grant", "expire"]);
    assert_eq!(rows[1].token, Some(token));
    assert_eq!(rows[1].lock_key.as_deref(), Some("exp/1"));
    assert_eq!(rows[1].spiffe_id.as_deref(), Some("spiffe://acme/frozen"));
}

#[tokio::test]
async fn etcd_tailer_records_a_force_that_joins_its_force_release_row() {
    let fx = fixture().await;
    let tailer = fx.start_tailer();
    let session = fx.session("holder", Duration::from_secs(10)).await;
    let hold = fx.acquire(&session, "frc/1").await;
    let token = hold.token().unwrap().get();
    let marker = ForceMarker {
        request_id: "req-1".into(),
        requester: "spiffe://acme/alice".into(),
        reason: "stuck".into(),
    };
    let name = LockName::new(NS, CLASS, "frc/1");
    let rev = fx
        .locker
        .force_release(&name, session.lease(), Mode::Exclusive, &marker)
        .await
        .unwrap();
    let record = ForceRelease::new(
        "req-1",
        fx.cluster,
        rev,
        "frc/1",
        "spiffe://acme/alice",
        "spiffe://acme/bob",
        "stuck",
        true,
        SystemTime::now(),
    );
    insert_force_release(&**fx.pool.get().await.unwrap(), &record)
        .await
        .unwrap();
    assert!(hold.release().await.unwrap_err().is_not_held());
    session.close().await.unwrap();
    fx.wait_caught_up().await;
    tailer.abort();

    let rows = fx.rows().await;
    let kinds: Vec<&str> = rows.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["grant", "force"], "{rows:?}");
    assert_eq!(rows[1].revision, rev.as_i64());
    assert_eq!(rows[1].token, Some(token));
    let client = fx.db.connect().await;
    let joined = client
        .query(
            "SELECT e.type, e.token, f.reason, f.approver FROM audit_event e JOIN force_release f \
             ON f.cluster_id = e.cluster_id AND f.revision = e.revision AND f.lock_key = e.lock_key",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(joined.len(), 1);
    assert_eq!(joined[0].get::<_, String>(0), "force");
    assert_eq!(joined[0].get::<_, i64>(1) as u64, token);
    assert_eq!(joined[0].get::<_, String>(2), "stuck");
    assert_eq!(joined[0].get::<_, String>(3), "spiffe://acme/bob");
}

#[tokio::test]
async fn etcd_tailer_records_a_gap_when_history_was_compacted() {
    let fx = fixture().await;
    let tailer = fx.start_tailer();
    let before = fx.cycles("a", "cmp/1", 5).await;
    fx.wait_caught_up().await;
    tailer.abort();
    let _ = tailer.await;
    let position = tailer_position(&**fx.pool.get().await.unwrap(), fx.cluster)
        .await
        .unwrap()
        .unwrap()
        .as_i64();
    let lost = fx.cycles("b", "cmp/1", 5).await;
    let compacted = fx.revision().await;
    let mut client = fx.locker.client().clone();
    client
        .compact(compacted, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    let after = fx.cycles("c", "cmp/1", 5).await;
    let tailer = fx.start_tailer();
    fx.wait_caught_up().await;
    tailer.abort();

    let rows = fx.rows().await;
    let gaps: Vec<&Row> = rows.iter().filter(|r| r.kind == "gap").collect();
    assert_eq!(gaps.len(), 1, "{rows:?}");
    // The compaction revision is part of the gap: compaction drops its deletions.
    assert_eq!(gaps[0].gap, Some((position + 1, compacted)));
    assert_eq!(gaps[0].revision, position + 1);
    let grants: Vec<u64> = rows
        .iter()
        .filter(|r| r.kind == "grant")
        .map(|r| r.token.unwrap())
        .collect();
    assert_eq!(
        grants,
        [before.clone(), after.clone()].concat(),
        "grants before the gap and after it"
    );
    for t in &lost {
        assert!(!grants.contains(t));
    }
    assert!(rows
        .iter()
        .all(|r| r.kind == "gap" || r.revision <= position || r.revision > compacted));
}

#[tokio::test]
async fn etcd_tailer_ignores_stray_and_cancel_marker_keys() {
    let fx = fixture().await;
    let tailer = fx.start_tailer();
    let mut client = fx.locker.client().clone();
    let lease = client.lease_grant(30, None).await.unwrap().id();
    let lease_hex = format!("{lease:016x}");
    let meta = r#"{"spiffe_id":"spiffe://acme/x","class":"rows","mode":"exclusive","epoch":0,"attempt":1}"#;
    let strays = [
        format!("{ROOT}locks/{NS}/{CLASS}/k/c/{lease_hex}/1"),
        format!("{ROOT}locks/{NS}/{CLASS}/k/h/x/{lease_hex}/extra"),
        format!("{ROOT}locks/{NS}/{CLASS}/k/h/q/{lease_hex}"),
        format!("{ROOT}locks/{NS}/{CLASS}/k/h/x/not-a-lease"),
        format!("{ROOT}locks/{NS}/{CLASS}/k%zz/h/x/{lease_hex}"),
        format!("{ROOT}locks/garbage"),
        format!("{ROOT}locks/{NS}/{CLASS}"),
    ];
    for k in &strays {
        client.put(k.as_str(), meta, None).await.unwrap();
    }
    for k in &strays[1..] {
        client.delete(k.as_str(), None).await.unwrap();
    }
    let not_utf8 = [
        ROOT.as_bytes(),
        b"locks/\xff/rows/k/h/x/",
        lease_hex.as_bytes(),
    ]
    .concat();
    client.put(not_utf8.clone(), meta, None).await.unwrap();
    client.delete(not_utf8, None).await.unwrap();
    // A cancel marker on a lease that ends: deleted by the revoke, as the lock core's are.
    client
        .put(
            format!("{ROOT}locks/{NS}/{CLASS}/k/c/{lease_hex}/2"),
            "",
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await
        .unwrap();
    client.lease_revoke(lease).await.unwrap();
    fx.wait_caught_up().await;
    assert_eq!(fx.rows().await, [], "stray keys make no rows");
    // The tailer is still alive and reading.
    let tokens = fx.cycles("after", "k", 1).await;
    fx.wait_caught_up().await;
    tailer.abort();
    let rows = fx.rows().await;
    let kinds: Vec<&str> = rows.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["grant", "release"]);
    assert_eq!(rows[0].token, Some(tokens[0]));
}

#[tokio::test]
async fn etcd_tailer_catches_up_after_a_database_outage_that_never_blocks_locks() {
    let fx = fixture().await;
    let tailer = fx.start_tailer();
    let first = fx.cycles("a", "db/1", 3).await;
    fx.wait_caught_up().await;
    let admin = admin().await;
    take_down(&admin, &fx.db).await;
    let started = Instant::now();
    let during = fx.cycles("b", "db/1", 20).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "locks went on while the database was down"
    );
    bring_up(&admin, &fx.db).await;
    fx.wait_caught_up().await;
    tailer.abort();
    let rows = fx.rows().await;
    let grants: Vec<u64> = rows
        .iter()
        .filter(|r| r.kind == "grant")
        .map(|r| r.token.unwrap())
        .collect();
    assert_eq!(grants, [first, during].concat());
    assert_eq!(rows.iter().filter(|r| r.kind == "release").count(), 23);
    assert_eq!(rows.len(), 46);
}

/// Cluster B restored from a snapshot of cluster A (new cluster id) serves A's history up
/// to the snapshot again: the tailer stores none of it under B, stores every event B
/// makes afterwards (at the very revision numbers A used for its own events after the
/// snapshot), and still writes a gap where B's history was compacted before it was read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_tailer_stores_history_a_restored_cluster_repeats_once() {
    let a = fixture().await;
    let tailer_a = a.start_tailer();
    let before = a.cycles("a", "rst/1", 3).await;
    let snapshot = a.etcd.snapshot().await;
    let b = a.restored(&snapshot).await;
    assert_ne!(b.cluster, a.cluster);
    // Both clusters go on from the same revision with the same steps, so their events
    // after the snapshot take the same revision numbers.
    let start = b.revision().await;
    let mut client = a.locker.client().clone();
    while a.revision().await < start {
        client.put("/elsewhere/pad", "x", None).await.unwrap();
    }
    assert_eq!(a.revision().await, start);
    let after_a = a.cycles("a2", "rst/1", 3).await;
    let new_b = b.cycles("b", "rst/1", 3).await;
    a.wait_caught_up().await;
    tailer_a.abort();
    let _ = tailer_a.await;

    let tailer_b = b.start_tailer();
    b.wait_caught_up().await;
    tailer_b.abort();
    let _ = tailer_b.await;
    let rows_a = a.rows().await;
    let rows_b = b.rows().await;
    let grants = |rows: &[Row]| {
        rows.iter()
            .filter(|r| r.kind == "grant")
            .map(|r| r.token.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(grants(&rows_a), [before.clone(), after_a.clone()].concat());
    assert_eq!(rows_a.len(), 12, "{rows_a:?}");
    assert_eq!(
        grants(&rows_b),
        new_b,
        "B's own grants, none of A's history: {rows_b:?}"
    );
    assert_eq!(rows_b.iter().filter(|r| r.kind == "release").count(), 3);
    assert_eq!(rows_b.len(), 6, "{rows_b:?}");
    assert!(rows_b.iter().all(|r| r.revision > snapshot.revision()));
    for r in &rows_b {
        assert_eq!(r.spiffe_id.as_deref(), Some("spiffe://acme/b"));
        assert_eq!(
            FencingToken::from_u64(r.token.unwrap())
                .unwrap()
                .epoch()
                .get(),
            1
        );
    }
    let revisions = |rows: &[Row], above: i64| {
        rows.iter()
            .map(|r| r.revision)
            .filter(|r| *r > above)
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(
        revisions(&rows_b, 0),
        revisions(&rows_a, snapshot.revision()),
        "B's events at A's revision numbers"
    );
    // B serves A's epoch record again (A's bootstrap, naming A): stored once, under A.
    let client = a.db.connect().await;
    let epochs: Vec<(i64, i32, String, i64)> = client
        .query(
            "SELECT cluster_id, epoch, reason, epoch_cluster_id FROM epoch_event \
             ORDER BY epoch, cluster_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let (a_id, b_id) = (a.cluster.to_sql(), b.cluster.to_sql());
    assert_eq!(
        epochs,
        [
            (a_id, 0, "bootstrap".to_owned(), a_id),
            (b_id, 1, "restore".to_owned(), b_id)
        ]
    );

    // B's history read in part, then compacted: a gap, and B's later events.
    let position = tailer_position(&**b.pool.get().await.unwrap(), b.cluster)
        .await
        .unwrap()
        .unwrap()
        .as_i64();
    let lost = b.cycles("b2", "rst/1", 2).await;
    let compacted = b.revision().await;
    let mut client = b.locker.client().clone();
    client
        .compact(compacted, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    let later = b.cycles("b3", "rst/1", 2).await;
    let tailer_b = b.start_tailer();
    b.wait_caught_up().await;
    tailer_b.abort();
    let rows_b = b.rows().await;
    let gaps: Vec<&Row> = rows_b.iter().filter(|r| r.kind == "gap").collect();
    assert_eq!(gaps.len(), 1, "{rows_b:?}");
    assert_eq!(gaps[0].gap, Some((position + 1, compacted)));
    assert_eq!(grants(&rows_b), [new_b, later].concat());
    assert!(lost.iter().all(|t| !grants(&rows_b).contains(t)));
    assert_eq!(a.rows().await, rows_a, "A's rows are untouched");

    // Across both clusters, each grant and each release once.
    let client = a.db.connect().await;
    let dup: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT type, lock_key, token FROM audit_event WHERE type <> 'gap' \
             GROUP BY 1, 2, 3 HAVING count(*) > 1) d",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(dup, 0);
}

/// A restored cluster whose history was compacted inside the restored part: the tailer
/// starts after the gap, recognises the rest of the restored history and stores none of
/// it, then stores the new events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_tailer_recognises_restored_history_after_a_compaction() {
    let a = fixture().await;
    let tailer_a = a.start_tailer();
    let early = a.cycles("a", "rst/2", 3).await;
    let middle = a.revision().await;
    let late = a.cycles("a", "rst/2", 3).await;
    a.wait_caught_up().await;
    tailer_a.abort();
    let _ = tailer_a.await;
    let snapshot = a.etcd.snapshot().await;
    let b = a.restored(&snapshot).await;
    let mut client = b.locker.client().clone();
    client
        .compact(middle, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    let new_b = b.cycles("b", "rst/2", 2).await;
    let tailer_b = b.start_tailer();
    b.wait_caught_up().await;
    tailer_b.abort();
    let rows_b = b.rows().await;
    let kinds: Vec<&str> = rows_b.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["gap", "grant", "release", "grant", "release"],
        "{rows_b:?}"
    );
    assert_eq!(rows_b[0].gap, Some((1, middle)));
    assert_eq!(
        rows_b
            .iter()
            .filter(|r| r.kind == "grant")
            .map(|r| r.token.unwrap())
            .collect::<Vec<_>>(),
        new_b
    );
    let rows_a = a.rows().await;
    assert_eq!(
        rows_a
            .iter()
            .filter(|r| r.kind == "grant")
            .map(|r| r.token.unwrap())
            .collect::<Vec<_>>(),
        [early, late].concat()
    );
}
