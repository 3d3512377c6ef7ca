//! The set-up every module shares: a fixture (etcd members, a locker on them, its epoch
//! file, namespaces `ns` and `ns2`, and class `c` of `ns`), sessions and lock names,
//! deadlines, and reads and watches of etcd's keys.

use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use palisade_lock::{
    Error, FencingToken, FileEpochStore, Hold, LockClass, LockName, Locker, LockerOptions, Mode,
    Namespace, Session, SpiffeId,
};
use palisade_testkit::EtcdCluster;
use tokio::time::Instant;

pub(crate) const NS: &str = "ns";
/// A second namespace for classes with their own prefixes (class `c` of `ns` has the
/// empty prefix, which overlaps every other prefix in `ns`).
pub(crate) const NS2: &str = "ns2";
pub(crate) const ROOT: &str = "/palisade/";

pub(crate) struct Fixture {
    pub(crate) cluster: EtcdCluster,
    pub(crate) locker: Locker,
    pub(crate) dir: tempfile::TempDir,
}

pub(crate) fn class(ns: &str, id: &str, prefix: &str) -> LockClass {
    let mut c = LockClass::new(ns, id, prefix);
    c.mode = Mode::Shared;
    c.ttl_min = Duration::from_secs(1);
    c.ttl_max = Duration::from_secs(30);
    c
}

pub(crate) async fn connect(
    endpoints: Vec<String>,
    dir: &tempfile::TempDir,
) -> Result<Locker, Error> {
    connect_window(endpoints, dir, palisade_lock::DEFAULT_EPOCH_WINDOW).await
}

/// [`connect`] with another epoch reservation window.
pub(crate) async fn connect_window(
    endpoints: Vec<String>,
    dir: &tempfile::TempDir,
    window: u64,
) -> Result<Locker, Error> {
    let options = LockerOptions::new(endpoints)
        .with_request_timeout(Duration::from_millis(500))
        .with_epoch_window(window);
    Locker::connect(options, FileEpochStore::new(dir.path().join("epoch.json"))).await
}

/// Namespaces [`NS`] and [`NS2`], and class `c` of [`NS`] (empty prefix).
pub(crate) async fn configure(locker: &Locker) {
    let config = locker.config();
    for ns in [NS, NS2] {
        config
            .put_namespace(&Namespace::new(ns, "tenant"))
            .await
            .unwrap();
    }
    config.put_class(&class(NS, "c", "")).await.unwrap();
}

pub(crate) async fn fixture(members: usize) -> Fixture {
    fixture_window(members, palisade_lock::DEFAULT_EPOCH_WINDOW).await
}

pub(crate) async fn fixture_window(members: usize, window: u64) -> Fixture {
    let cluster = EtcdCluster::start(members).await;
    let dir = tempfile::tempdir().unwrap();
    let locker = connect_window(cluster.endpoints(), &dir, window)
        .await
        .unwrap();
    configure(&locker).await;
    Fixture {
        cluster,
        locker,
        dir,
    }
}

pub(crate) async fn session(locker: &Locker, ttl_secs: u64) -> Session {
    locker
        .open_session(
            SpiffeId::new("spiffe://test/worker").unwrap(),
            Duration::from_secs(ttl_secs),
        )
        .await
        .unwrap()
}

pub(crate) fn lock(key: &str) -> LockName {
    LockName::new(NS, "c", key)
}

pub(crate) fn within(d: Duration) -> Instant {
    Instant::now() + d
}

pub(crate) fn secs(s: u64) -> Instant {
    within(Duration::from_secs(s))
}

pub(crate) fn token(h: &Hold) -> FencingToken {
    h.token().expect("a fenced grant has a token")
}

/// etcd's current revision. Retries: with a member down, the client still sends some
/// requests to it, and those fail at once.
pub(crate) async fn revision(client: &Client) -> i64 {
    for _ in 0..100 {
        if let Ok(resp) = client.clone().get("/", None).await {
            return resp.header().unwrap().revision();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("etcd did not answer");
}

/// Keys (as strings) under a prefix. Retries like [`revision`].
pub(crate) async fn keys_under(client: &Client, prefix: &str) -> Vec<String> {
    for _ in 0..100 {
        if let Ok(resp) = client
            .clone()
            .get(
                prefix,
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
        {
            return resp
                .kvs()
                .iter()
                .map(|kv| kv.key_str().unwrap().to_owned())
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("etcd did not answer");
}

/// The base path of a lock of class `c` of `ns`.
pub(crate) fn base(key: &str) -> String {
    lock_base(&lock(key))
}

fn lock_base(name: &LockName) -> String {
    format!(
        "{ROOT}locks/{}/{}/{}/",
        name.ns,
        name.class,
        name.key.replace('%', "%25").replace('/', "%2F")
    )
}

/// A watch on a prefix from the current revision + 1, started before the action it waits
/// for, so the event cannot be missed.
pub(crate) struct PrefixWatch {
    _watcher: etcd_client::Watcher,
    stream: etcd_client::WatchStream,
}

impl PrefixWatch {
    pub(crate) async fn start(client: &Client, prefix: &str) -> PrefixWatch {
        let from = revision(client).await + 1;
        let (watcher, stream) = client
            .clone()
            .watch(
                prefix,
                Some(WatchOptions::new().with_prefix().with_start_revision(from)),
            )
            .await
            .unwrap();
        PrefixWatch {
            _watcher: watcher,
            stream,
        }
    }

    /// Every event, as (type, key, revision, value), until one matches `last`.
    pub(crate) async fn until(
        &mut self,
        last: impl Fn(EventType, &str) -> bool,
    ) -> Vec<(EventType, String, i64, String)> {
        let mut seen = Vec::new();
        let wait = async {
            loop {
                let resp = self
                    .stream
                    .message()
                    .await
                    .unwrap()
                    .expect("watch stream open");
                for e in resp.events() {
                    let kv = e.kv().unwrap();
                    let key = kv.key_str().unwrap().to_owned();
                    let done = last(e.event_type(), &key);
                    seen.push((
                        e.event_type(),
                        key,
                        kv.mod_revision(),
                        kv.value_str().unwrap().to_owned(),
                    ));
                    if done {
                        return;
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(15), wait)
            .await
            .expect("watch events within 15 s");
        seen
    }

    /// The next event of `kind`, with its key and revision.
    pub(crate) async fn next(&mut self, kind: EventType) -> (String, i64) {
        let wait = async {
            loop {
                let resp = self
                    .stream
                    .message()
                    .await
                    .unwrap()
                    .expect("watch stream open");
                for e in resp.events() {
                    if e.event_type() == kind {
                        let kv = e.kv().unwrap();
                        return (kv.key_str().unwrap().to_owned(), kv.mod_revision());
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(15), wait)
            .await
            .expect("watch event within 15 s")
    }
}

/// Spawns an acquire and returns once its waiter key exists in etcd.
pub(crate) async fn spawn_waiter(
    locker: &Locker,
    session: &Session,
    name: &LockName,
    mode: Mode,
    deadline: Instant,
) -> tokio::task::JoinHandle<Result<Hold, Error>> {
    let queue = format!("{}q/", lock_base(name));
    let mut watch = PrefixWatch::start(locker.client(), &queue).await;
    let (l, s, n) = (locker.clone(), session.clone(), name.clone());
    let task = tokio::spawn(async move { l.acquire(&s, &n, mode, deadline).await });
    let (key, _) = watch.next(EventType::Put).await;
    assert!(
        key.ends_with(&session.lease().to_string()),
        "the waiter key {key} is this session's"
    );
    task
}

/// What [`hand_over`] leaves: C's session and the hold B's release handed it, B's token,
/// and the revision of B's release.
pub(crate) struct HandedOver {
    pub(crate) c: Session,
    pub(crate) hc: Hold,
    pub(crate) tb: FencingToken,
    pub(crate) released_at: i64,
}

/// Three sessions on `name` (hold keys under `base`): A holds while B and C queue; A's
/// release is a plain one (nobody waited when A was granted) and B grants itself; B was
/// granted while C waited, so B's release hands the lock to C, and is the one write
/// after B's grant was seen.
pub(crate) async fn hand_over(locker: &Locker, name: &LockName, base: &str) -> HandedOver {
    let (a, b, c) = (
        session(locker, 10).await,
        session(locker, 10).await,
        session(locker, 10).await,
    );
    let ha = locker
        .acquire(&a, name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let wb = spawn_waiter(locker, &b, name, Mode::Exclusive, secs(30)).await;
    let wc = spawn_waiter(locker, &c, name, Mode::Exclusive, secs(30)).await;
    ha.release().await.unwrap();
    let hb = wb.await.unwrap().unwrap();
    let mut holds = PrefixWatch::start(locker.client(), &format!("{base}h/")).await;
    let before = revision(locker.client()).await;
    let tb = token(&hb);
    hb.release().await.unwrap();
    let (gone, released_at) = holds.next(EventType::Delete).await;
    assert!(gone.ends_with(&b.lease().to_string()), "{gone}");
    let hc = tokio::time::timeout(Duration::from_secs(5), wc)
        .await
        .expect("C granted after B's release")
        .unwrap()
        .unwrap();
    assert_eq!(
        released_at,
        before + 1,
        "the release is the one write after `before`"
    );
    HandedOver {
        c,
        hc,
        tb,
        released_at,
    }
}
