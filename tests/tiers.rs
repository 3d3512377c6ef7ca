//! `palisade serve` in front of two etcd cluster tiers (`--home-tier a --tier b=...`):
//! a namespace rehomed with `palisade namespace rehome`; a resource behind `FenceLayer`
//! and a Postgres table written with `fenced_transaction` that saw tokens of both tiers
//! refuse the old tier's token after the move; a rehome whose service was killed part
//! way refuses on both tiers until it is run again, which completes it; `palisade audit
//! tail --tier` records the grants of both clusters; `palisade lock acquire`, `lock run`
//! and `session open` name only the namespace and land on its tier; opening a session on
//! a tier by name is authorized as by namespace, and the per-identity session limit
//! counts every tier. Real etcd members, a
//! real PostgreSQL database and real `palisade` processes.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use common::service::run;
use http_body_util::Full;
use palisade_api::ProblemKind;
use palisade_client::Client;
use palisade_fence::{fenced_transaction, FenceError, FenceLayer, FencingToken, MemoryStore};
use palisade_testkit::{EtcdCluster, TestDb};
use serde_json::{json, Value};
use tower::{Service, ServiceExt};

const JOB: &str = "spiffe://test/jobs/a";
const ADMIN: &str = "spiffe://test/admin";

struct Tiered {
    a: EtcdCluster,
    b: EtcdCluster,
    dir: tempfile::TempDir,
    addr: SocketAddr,
}

impl Tiered {
    async fn start() -> Tiered {
        let (a, b) = (EtcdCluster::start(1).await, EtcdCluster::start(1).await);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("authz.toml"),
            format!("admins = [\"{ADMIN}\"]\n[[namespace]]\nid = \"ns\"\n[[namespace.grant]]\nids = [\"spiffe://test/jobs/\"]\nclasses = [\"c\"]\n"),
        )
        .unwrap();
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        Tiered { a, b, dir, addr }
    }

    /// Starts `palisade serve` on both tiers and waits until it listens.
    async fn serve(&self) -> tokio::process::Child {
        self.serve_with(&[]).await
    }

    /// [`Tiered::serve`] with `extra` flags.
    async fn serve_with(&self, extra: &[&str]) -> tokio::process::Child {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["serve", "--etcd", &self.a.endpoints().join(",")])
            .args(["--home-tier", "a"])
            .arg("--tier")
            .arg(format!("b={}", self.b.endpoints().join(",")))
            .args([
                "--listen",
                &self.addr.to_string(),
                "--insecure-dev-identity",
            ])
            .arg("--config")
            .arg(self.dir.path().join("authz.toml"))
            .arg("--epoch-file")
            .arg(self.dir.path().join("epoch.json"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        common::service::wait_listening(self.addr).await;
        child
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn client(&self, id: &str) -> Client {
        Client::new(self.url()).unwrap().with_dev_identity(id)
    }

    /// `palisade ARGS --service URL --dev-identity ADMIN`.
    async fn admin(&self, args: &[&str]) -> common::service::Out {
        let mut all = args.to_vec();
        let url = self.url();
        all.extend(["--service", &url, "--dev-identity", ADMIN]);
        run(all, &[]).await
    }

    /// `palisade ARGS --service URL --dev-identity JOB` (before a `--` of `lock run`).
    async fn job(&self, args: &[&str]) -> common::service::Out {
        let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let url = self.url();
        let mut all = args[..at].to_vec();
        all.extend(["--service", &url, "--dev-identity", JOB]);
        all.extend(&args[at..]);
        run(all, &[]).await
    }

    /// Opens a session (JSON body `open`) and acquires `key` of `ns/c`; the session
    /// view and the hold view.
    async fn hold(
        &self,
        open: Value,
        key: &str,
    ) -> Result<(Value, Value), palisade_client::ClientError> {
        let c = self.client(JOB);
        let session = c.call_json("POST", "/v1/sessions", Some(open)).await?;
        let hold = c
            .call_json(
                "POST",
                "/v1/locks/acquire",
                Some(
                    json!({"session": session["session"], "namespace": "ns", "class": "c",
                    "key": key, "mode": "exclusive", "wait_ms": 2000}),
                ),
            )
            .await?;
        Ok((session, hold))
    }

    async fn release(&self, hold: &Value) {
        self.client(JOB)
            .call_json(
                "POST",
                "/v1/locks/release",
                Some(
                    json!({"session": hold["session"], "namespace": "ns", "class": "c",
                    "key": hold["key"], "mode": "exclusive", "grant_rev": hold["grant_rev"]}),
                ),
            )
            .await
            .unwrap();
    }
}

fn token(hold: &Value) -> FencingToken {
    hold["token"].as_str().unwrap().parse().unwrap()
}

/// A write through `FenceLayer` (resource: the path) with `token`; the status.
async fn fenced_write<S>(svc: &mut S, token: FencingToken) -> u16
where
    S: Service<http::Request<Full<Bytes>>, Response = http::Response<Full<Bytes>>>,
    S::Error: std::fmt::Debug,
{
    let req = http::Request::put("/orders/k")
        .header("fencing-token", token.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    svc.ready()
        .await
        .unwrap()
        .call(req)
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// One `fenced_transaction` on resource `orders/k` that inserts a row with `token`.
async fn pg_write(
    client: &mut tokio_postgres::Client,
    token: FencingToken,
) -> Result<(), FenceError> {
    fenced_transaction(client, "orders/k", token, |tx| {
        Box::pin(async move {
            tx.execute("INSERT INTO tier_writes (token) VALUES ($1)", &[&token])
                .await?;
            Ok::<_, FenceError>(())
        })
    })
    .await
}

#[tokio::test]
async fn etcd_serve_on_two_tiers_rehomes_a_namespace_and_resources_refuse_the_old_tier() {
    let t = Tiered::start().await;
    let mut server = t.serve().await;
    t.admin(&[
        "namespace",
        "create",
        "ns",
        "--tenant",
        "t",
        "--cluster-tier",
        "a",
    ])
    .await
    .ok();
    t.admin(&["class", "create", "ns", "c"]).await.ok();
    // A plain update cannot move it, and a tier must be one of the service's.
    t.admin(&["namespace", "update", "ns", "--cluster-tier", "b"])
        .await
        .fails(2, "move it with a rehome");
    t.admin(&[
        "namespace",
        "create",
        "other",
        "--tenant",
        "t",
        "--cluster-tier",
        "gold",
    ])
    .await
    .fails(2, "unknown cluster tier \"gold\"");
    let quota = t
        .admin(&["namespace", "update", "ns", "--op-rate-quota", "5000"])
        .await
        .ok();
    assert_eq!(quota.json()["cluster_tier"], "a");
    let db = TestDb::create().await;
    let mut pg = db.connect().await;
    palisade_fence::migrate(&mut pg).await.unwrap();
    pg.batch_execute("CREATE TABLE tier_writes (token bigint NOT NULL)")
        .await
        .unwrap();
    let _tailer = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["audit", "tail", "--etcd", &t.a.endpoints().join(",")])
        .arg("--tier")
        .arg(format!("b={}", t.b.endpoints().join(",")))
        .args(["--database", &db.connection_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut resource = tower::ServiceBuilder::new()
        .layer(FenceLayer::new(MemoryStore::new(1_000)))
        .service(tower::service_fn(
            |_req: http::Request<Full<Bytes>>| async {
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
            },
        ));

    // On tier a: a session opened with the namespace lands there.
    let (session, old) = t
        .hold(json!({"ttl_ms": 10000, "namespace": "ns"}), "k")
        .await
        .unwrap();
    assert_eq!(session["tier"], "a");
    assert!(
        !session["session"].as_str().unwrap().contains('.'),
        "{session}"
    );
    let old_token = token(&old);
    assert_eq!(fenced_write(&mut resource, old_token).await, 200);
    pg_write(&mut pg, old_token).await.unwrap();
    // A session on tier b, where the caller is granted no namespace, is refused: a named
    // tier is authorized like `tier_of`.
    let err = t
        .hold(json!({"ttl_ms": 10000, "tier": "b"}), "k")
        .await
        .unwrap_err();
    assert_eq!(err.problem(), Some(ProblemKind::Forbidden));
    assert_eq!(err.status(), Some(403));
    t.release(&old).await;

    // The move.
    let moved = t
        .admin(&["namespace", "rehome", "ns", "--to", "b"])
        .await
        .ok()
        .json();
    assert_eq!(
        (moved["from"].as_str(), moved["to"].as_str()),
        (Some("a"), Some("b"))
    );
    assert_eq!(moved["epoch"]["reason"], "rehome");
    let (session, new) = t
        .hold(json!({"ttl_ms": 10000, "namespace": "ns"}), "k")
        .await
        .unwrap();
    assert_eq!(session["tier"], "b");
    assert!(
        session["session"].as_str().unwrap().starts_with("b."),
        "{session}"
    );
    let new_token = token(&new);
    assert!(new_token > old_token, "{new_token} after {old_token}");
    assert_eq!(
        new_token.epoch().get(),
        moved["epoch"]["epoch"].as_u64().unwrap() as u16
    );
    assert_eq!(fenced_write(&mut resource, new_token).await, 200);
    pg_write(&mut pg, new_token).await.unwrap();
    // The old tier's token is refused by both resources now.
    assert_eq!(fenced_write(&mut resource, old_token).await, 409);
    let stale = pg_write(&mut pg, old_token).await.unwrap_err();
    assert!(stale.is_stale(), "{stale:?}");
    let rows: i64 = pg
        .query_one("SELECT count(*) FROM tier_writes", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 2);
    // A session on tier a is refused with the tier named.
    let err = t.hold(json!({"ttl_ms": 10000}), "k2").await.unwrap_err();
    assert_eq!(err.problem(), Some(ProblemKind::WrongTier));
    assert!(err.detail().contains("tier b"), "{err:?}");

    // Killed part way: the rehome back to a drains behind the hold on b when the
    // service dies.
    let url = t.url();
    let rehome = tokio::spawn(async move {
        run(
            vec![
                "namespace",
                "rehome",
                "ns",
                "--to",
                "a",
                "--drain-ms",
                "20000",
                "--service",
                &url,
                "--dev-identity",
                ADMIN,
            ],
            &[],
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    server.kill().await.unwrap();
    let out = rehome.await.unwrap();
    assert_ne!(out.code, 0, "{out:?}");
    let _server = t.serve().await;
    // Neither tier grants: b is fenced (503 with Retry-After), a is not its tier yet.
    let err = t
        .hold(json!({"ttl_ms": 10000, "namespace": "ns"}), "k3")
        .await
        .unwrap_err();
    assert_eq!(err.problem(), Some(ProblemKind::NamespaceMoving), "{err:?}");
    assert_eq!(err.status(), Some(503));
    let err = t
        .hold(json!({"ttl_ms": 10000, "tier": "a"}), "k3")
        .await
        .unwrap_err();
    assert_eq!(err.problem(), Some(ProblemKind::WrongTier), "{err:?}");
    // The hold ends (released through the new process); the retry completes the move.
    t.release(&new).await;
    let back = t
        .admin(&["namespace", "rehome", "ns", "--to", "a"])
        .await
        .ok()
        .json();
    assert_eq!(back["to"], "a");
    let (session, last) = t
        .hold(json!({"ttl_ms": 10000, "namespace": "ns"}), "k")
        .await
        .unwrap();
    assert_eq!(session["tier"], "a");
    assert!(
        token(&last) > new_token,
        "{} after {new_token}",
        token(&last)
    );
    assert_eq!(fenced_write(&mut resource, token(&last)).await, 200);
    assert_eq!(fenced_write(&mut resource, new_token).await, 409);

    // The audit trail has the namespace's grants of both clusters, with their tokens.
    let (a_id, b_id) = (t.a.cluster_id().await as i64, t.b.cluster_id().await as i64);
    let want = [
        (a_id, old_token.get() as i64),
        (a_id, token(&last).get() as i64),
        (b_id, new_token.get() as i64),
    ];
    common::service::audit_grants(&pg, "ns", |grants| want.iter().all(|w| grants.contains(w)))
        .await;
}

#[tokio::test]
async fn etcd_a_client_acquire_answered_namespace_moving_is_retried_until_the_move_ends() {
    let t = Tiered::start().await;
    let _server = t.serve().await;
    t.admin(&["namespace", "create", "ns", "--tenant", "t"])
        .await
        .ok();
    t.admin(&["class", "create", "ns", "c"]).await.ok();
    let session = t
        .client(JOB)
        .open_session_in("ns", Duration::from_secs(30))
        .await
        .unwrap();
    // A hold the move waits for, and does not get: the rehome rolls back after its drain.
    let (_, held) = t
        .hold(json!({"ttl_ms": 30000, "namespace": "ns"}), "k")
        .await
        .unwrap();
    let url = t.url();
    let rehome = tokio::spawn(async move {
        run(
            vec![
                "namespace",
                "rehome",
                "ns",
                "--to",
                "b",
                "--drain-ms",
                "2000",
                "--service",
                &url,
                "--dev-identity",
                ADMIN,
            ],
            &[],
        )
        .await
    });
    // Once the old tier is fenced, an acquire sent once is answered 503 namespace-moving.
    let raw = |key: &'static str| {
        let (c, id) = (t.client(JOB), session.id().to_owned());
        async move {
            c.call_json(
                "POST",
                "/v1/locks/acquire",
                Some(json!({"session": id, "namespace": "ns", "class": "c",
                    "key": key, "mode": "exclusive", "wait_ms": 0})),
            )
            .await
        }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match raw("probe").await {
            Err(e) if e.problem() == Some(ProblemKind::NamespaceMoving) => break,
            Ok(hold) => t.release(&hold).await,
            Err(e) => panic!("{e:?}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "never fenced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The client's acquire is sent again while the move lasts, and granted on the old
    // tier once the move is rolled back.
    let hold = session
        .acquire(
            "ns",
            "c",
            "k2",
            palisade_client::Mode::Exclusive,
            Duration::from_secs(20),
        )
        .await
        .unwrap_or_else(|e| panic!("not granted after the move ended: {e:?}"));
    let out = rehome.await.unwrap();
    assert_ne!(out.code, 0, "the rehome could not drain: {out:?}");
    assert!(hold.token().is_some());
    let status = t
        .client(JOB)
        .call_json("GET", "/v1/locks/status?namespace=ns&class=c&key=k2", None)
        .await
        .unwrap();
    assert_eq!(status["holders"][0]["session"], session.id());
    hold.release().await.unwrap();
    t.release(&held).await;
}

/// A user who names only the lock gets a session where its namespace lives: after a
/// rehome to tier b, `lock acquire` and `lock run` are granted there under the new
/// epoch, `session open --tier-of` and `--tier` open on b (no quota slot), and the CLI's
/// exit codes tell `wrong-tier` (4) from `namespace-moving` (1).
#[tokio::test]
async fn etcd_cli_lock_acquire_and_run_follow_a_rehomed_namespace_to_its_tier() {
    let t = Tiered::start().await;
    let _server = t.serve().await;
    t.admin(&["namespace", "create", "ns", "--tenant", "t"])
        .await
        .ok();
    t.admin(&["class", "create", "ns", "c"]).await.ok();
    let before = t
        .job(&["lock", "acquire", "ns/c/k", "--ttl", "10"])
        .await
        .ok()
        .json();
    assert!(
        !before["session"].as_str().unwrap().contains('.'),
        "{before}"
    );
    let hold_file = t.dir.path().join("hold.json");
    std::fs::write(&hold_file, serde_json::to_string(&before).unwrap()).unwrap();
    t.job(&["lock", "release", "--hold", hold_file.to_str().unwrap()])
        .await
        .ok();
    let moved = t
        .admin(&["namespace", "rehome", "ns", "--to", "b"])
        .await
        .ok()
        .json();
    let epoch = u16::try_from(moved["epoch"]["epoch"].as_u64().unwrap()).unwrap();
    assert!(epoch > 0, "{moved}");
    // Each tier's epoch record: b's advanced by the rehome, the home tier's untouched.
    let b = t.admin(&["epoch", "show", "--tier", "b"]).await.ok().json();
    assert_eq!(
        (b["epoch"].as_u64(), b["reason"].as_str()),
        (Some(u64::from(epoch)), Some("rehome")),
        "{b}"
    );
    let a = t.admin(&["epoch", "show"]).await.ok().json();
    assert_eq!(a["epoch"], 0, "{a}");
    t.admin(&["epoch", "show", "--tier", "gold"])
        .await
        .fails(2, "unknown cluster tier \"gold\"");

    // lock acquire: a session on tier b, a token of the new epoch.
    let held = t
        .job(&["lock", "acquire", "ns/c/k", "--ttl", "10"])
        .await
        .ok()
        .json();
    assert!(
        held["session"].as_str().unwrap().starts_with("b."),
        "{held}"
    );
    let first = token(&held);
    assert_eq!(first.epoch().get(), epoch, "{held}");
    assert!(first > token(&before));
    std::fs::write(&hold_file, serde_json::to_string(&held).unwrap()).unwrap();
    t.job(&["lock", "release", "--hold", hold_file.to_str().unwrap()])
        .await
        .ok();

    // lock run: the command sees a token of the new epoch.
    let out = t
        .job(&[
            "lock",
            "run",
            "ns/c/k",
            "--ttl",
            "10",
            "--",
            "sh",
            "-c",
            "printf '%s %s' \"$FENCING_TOKEN\" \"$PALISADE_SESSION\"",
        ])
        .await
        .ok();
    let (ran, session) = out.stdout.split_once(' ').unwrap();
    let ran: FencingToken = ran.parse().unwrap();
    assert_eq!(ran.epoch().get(), epoch, "{out:?}");
    assert!(ran > first);
    assert!(session.starts_with("b."), "{out:?}");

    // session open on the namespace's tier, or a named one; neither takes a quota slot.
    let routed = t
        .job(&["session", "open", "--tier-of", "ns"])
        .await
        .ok()
        .json();
    assert_eq!(routed["tier"], "b");
    assert_eq!(routed["namespace"], Value::Null);
    let named = t.job(&["session", "open", "--tier", "b"]).await.ok().json();
    assert_eq!(named["tier"], "b");
    let shared = t
        .job(&[
            "lock",
            "acquire",
            "ns/c/k2",
            "--session",
            routed["session"].as_str().unwrap(),
        ])
        .await
        .ok()
        .json();
    assert_eq!(token(&shared).epoch().get(), epoch);

    // Exit codes: a session of the home tier is refused `wrong-tier` (4), a tier and a
    // namespace that disagree likewise, naming where the namespace lives.
    let home = t.job(&["session", "open"]).await.ok().json();
    assert_eq!(home["tier"], "a");
    t.job(&[
        "lock",
        "acquire",
        "ns/c/k3",
        "--session",
        home["session"].as_str().unwrap(),
    ])
    .await
    .fails(4, "wrong-tier: namespace ns lives on tier b");
    t.job(&["session", "open", "--tier", "a", "--tier-of", "ns"])
        .await
        .fails(4, "namespace ns lives on tier b");
    // A rehome back that cannot drain (k2 is held) is `namespace-moving` (1).
    t.admin(&[
        "namespace",
        "rehome",
        "ns",
        "--to",
        "a",
        "--drain-ms",
        "300",
    ])
    .await
    .fails(1, "namespace-moving");
}

/// `tier` in `POST /v1/sessions` is authorized as `tier_of` is: a caller granted no
/// namespace on tier b may not open a session there by naming it (an admin may, and the
/// home tier is everyone's). The per-identity session limit counts the identity's
/// sessions on every tier, not per tier.
#[tokio::test]
async fn etcd_sessions_on_a_named_tier_are_authorized_and_limited_across_tiers() {
    let t = Tiered::start().await;
    let _server = t.serve_with(&["--max-sessions-per-identity", "2"]).await;
    t.admin(&["namespace", "create", "ns", "--tenant", "t"])
        .await
        .ok();
    // `other` lives on tier b; the authorization config grants JOB only `ns` (tier a).
    t.admin(&[
        "namespace",
        "create",
        "other",
        "--tenant",
        "t",
        "--cluster-tier",
        "b",
    ])
    .await
    .ok();
    let open = |id: &'static str, body: Value| {
        let c = t.client(id);
        async move { c.call_json("POST", "/v1/sessions", Some(body)).await }
    };
    let e = open(JOB, json!({"ttl_ms": 30_000, "tier": "b"}))
        .await
        .unwrap_err();
    assert_eq!(e.problem(), Some(ProblemKind::Forbidden), "{e}");
    assert!(e.detail().contains("open a session on tier b"), "{e}");
    let e = open(JOB, json!({"ttl_ms": 30_000, "tier_of": "other"}))
        .await
        .unwrap_err();
    assert_eq!(e.problem(), Some(ProblemKind::Forbidden), "{e}");
    let admin = open(ADMIN, json!({"ttl_ms": 30_000, "tier": "b"}))
        .await
        .unwrap();
    assert!(
        admin["session"].as_str().unwrap().starts_with("b."),
        "{admin}"
    );

    // The limit (2) across tiers: ADMIN has one session on b; one more on a is its
    // second, and a third is refused on either tier.
    let home = open(ADMIN, json!({"ttl_ms": 30_000, "tier": "a"}))
        .await
        .unwrap();
    assert_eq!(home["tier"], "a", "{home}");
    for tier in ["a", "b"] {
        let e = open(ADMIN, json!({"ttl_ms": 30_000, "tier": tier}))
            .await
            .unwrap_err();
        assert_eq!(e.problem(), Some(ProblemKind::QuotaExceeded), "{tier}: {e}");
        assert!(e.detail().contains("2 open sessions"), "{e}");
    }
    // Closing the one on b frees a place, on any tier.
    let c = t.client(ADMIN);
    let path = format!("/v1/sessions/{}", admin["session"].as_str().unwrap());
    c.call_json("DELETE", &path, None).await.unwrap();
    open(ADMIN, json!({"ttl_ms": 30_000})).await.unwrap();
    // JOB's limit is its own.
    open(JOB, json!({"ttl_ms": 30_000, "tier": "a"}))
        .await
        .unwrap();
}
