//! The Rust client and the CLI against a real `palisade serve` whose etcd is stopped,
//! then started again: an acquire answered 503 `quorum-lost` is sent again within its
//! wait and is granted once etcd is back (every test here starts etcd: `etcd` in each
//! name).

mod common;

use std::time::Duration;

use common::service::{Mode, Service, JOB};
use palisade_client::{Client, Mode as LockMode};
use tokio::time::Instant;

/// How long the service takes to answer an acquire 503 `quorum-lost` while etcd is
/// stopped (one acquire that may not wait, through a raw call: no retry).
async fn time_to_503(client: &Client, session: &str) -> Duration {
    let t = Instant::now();
    let e = client
        .call_json(
            "POST",
            "/v1/locks/acquire",
            Some(
                serde_json::json!({ "session": session, "namespace": "ns", "class": "c",
                                     "key": "probe", "mode": "exclusive", "wait_ms": 0 }),
            ),
        )
        .await
        .expect_err("etcd is stopped");
    assert_eq!(e.status(), Some(503), "{e}");
    assert_eq!(e.kind().slug(), "quorum-lost", "{e}");
    t.elapsed()
}

#[tokio::test]
async fn etcd_a_client_acquire_answered_quorum_lost_is_retried_until_etcd_is_back() {
    let mut svc = Service::start(Mode::Dev, None).await;
    let client = Client::new(svc.url.clone()).unwrap().with_dev_identity(JOB);
    let session = client.open_session(Duration::from_secs(60)).await.unwrap();
    svc.cluster.stop(0).await;
    let unavailable = time_to_503(&client, session.id()).await;
    // Long enough for the first attempt to be answered 503 before etcd is back, and for
    // the service to reconnect after.
    let wait = unavailable * 3 + Duration::from_secs(15);
    let started = Instant::now();
    let acquire = {
        let session = session.clone();
        tokio::spawn(async move {
            session
                .acquire("ns", "c", "k", LockMode::Exclusive, wait)
                .await
        })
    };
    tokio::time::sleep(unavailable * 2 + Duration::from_secs(1)).await;
    assert!(
        !acquire.is_finished(),
        "the acquire gave up while etcd was stopped: {:?}",
        acquire.await
    );
    svc.cluster.restart(0).await;
    let hold = acquire
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("not granted after etcd came back: {e}"));
    assert!(started.elapsed() < wait, "granted within the wait");
    assert!(hold.token().is_some());
    // The grant is real: the lock names this session as its holder.
    let status = client
        .call_json("GET", "/v1/locks/status?namespace=ns&class=c&key=k", None)
        .await
        .unwrap();
    assert_eq!(status["holders"][0]["session"], session.id());
    hold.release().await.unwrap();
    session.close().await.unwrap();
}

#[tokio::test]
async fn etcd_the_cli_acquire_answered_quorum_lost_is_retried_until_etcd_is_back() {
    let mut svc = Service::start(Mode::Dev, None).await;
    let opened = svc
        .dev(JOB, &["session", "open", "--ttl", "60"])
        .await
        .ok()
        .json();
    let session = opened["session"].as_str().unwrap().to_owned();
    let client = Client::new(svc.url.clone()).unwrap().with_dev_identity(JOB);
    svc.cluster.stop(0).await;
    let unavailable = time_to_503(&client, &session).await;
    let wait = unavailable * 3 + Duration::from_secs(15);
    let wait_ms = wait.as_millis().to_string();
    let started = Instant::now();
    let cli = {
        let (url, session) = (svc.url.clone(), session.clone());
        tokio::spawn(async move {
            common::service::run(
                vec![
                    "lock",
                    "acquire",
                    "ns/c/k",
                    "--session",
                    &session,
                    "--wait-ms",
                    &wait_ms,
                    "--service",
                    &url,
                    "--dev-identity",
                    JOB,
                ],
                &[],
            )
            .await
        })
    };
    tokio::time::sleep(unavailable * 2 + Duration::from_secs(1)).await;
    assert!(
        !cli.is_finished(),
        "lock acquire gave up while etcd was stopped: {:?}",
        cli.await
    );
    svc.cluster.restart(0).await;
    let out = cli.await.unwrap().ok();
    assert!(started.elapsed() < wait, "granted within the wait");
    let hold = out.json();
    assert_eq!(hold["session"], session.as_str());
    assert!(hold["token"].as_str().is_some(), "{hold}");
    let status = client
        .call_json("GET", "/v1/locks/status?namespace=ns&class=c&key=k", None)
        .await
        .unwrap();
    assert_eq!(status["holders"][0]["grant_rev"], hold["grant_rev"]);
}

#[tokio::test]
async fn etcd_the_cli_acquire_opening_its_own_session_is_retried_until_etcd_is_back() {
    let mut svc = Service::start(Mode::Dev, None).await;
    let client = Client::new(svc.url.clone()).unwrap().with_dev_identity(JOB);
    let probe = client.open_session(Duration::from_secs(60)).await.unwrap();
    svc.cluster.stop(0).await;
    let unavailable = time_to_503(&client, probe.id()).await;
    let wait = unavailable * 3 + Duration::from_secs(15);
    let wait_ms = wait.as_millis().to_string();
    let started = Instant::now();
    // No --session: the CLI opens one first, and that call is answered 503 too.
    let cli = {
        let url = svc.url.clone();
        tokio::spawn(async move {
            common::service::run(
                vec![
                    "lock",
                    "acquire",
                    "ns/c/own",
                    "--ttl",
                    "30",
                    "--wait-ms",
                    &wait_ms,
                    "--service",
                    &url,
                    "--dev-identity",
                    JOB,
                ],
                &[],
            )
            .await
        })
    };
    tokio::time::sleep(unavailable * 2 + Duration::from_secs(1)).await;
    assert!(
        !cli.is_finished(),
        "lock acquire gave up opening its session while etcd was stopped: {:?}",
        cli.await
    );
    svc.cluster.restart(0).await;
    let out = cli.await.unwrap().ok();
    assert!(started.elapsed() < wait, "granted within the wait");
    let hold = out.json();
    assert!(hold["token"].as_str().is_some(), "{hold}");
    let status = client
        .call_json("GET", "/v1/locks/status?namespace=ns&class=c&key=own", None)
        .await
        .unwrap();
    assert_eq!(status["holders"][0]["grant_rev"], hold["grant_rev"]);
    assert_eq!(status["holders"][0]["session"], hold["session"]);
}

#[tokio::test]
async fn etcd_a_client_session_open_answered_quorum_lost_is_retried_until_etcd_is_back() {
    let mut svc = Service::start(Mode::Dev, None).await;
    let client = Client::new(svc.url.clone()).unwrap().with_dev_identity(JOB);
    let probe = client.open_session(Duration::from_secs(60)).await.unwrap();
    svc.cluster.stop(0).await;
    let unavailable = time_to_503(&client, probe.id()).await;
    // With no wait, the open is sent once and its 503 is the answer.
    let e = client
        .clone()
        .with_unavailable_wait(Duration::ZERO)
        .open_session(Duration::from_secs(30))
        .await
        .expect_err("etcd is stopped");
    assert_eq!(
        (e.status(), e.kind().slug()),
        (Some(503), "quorum-lost"),
        "{e}"
    );
    let wait = unavailable * 3 + Duration::from_secs(15);
    let started = Instant::now();
    let open = {
        let client = client.clone().with_unavailable_wait(wait);
        tokio::spawn(async move { client.open_session(Duration::from_secs(30)).await })
    };
    tokio::time::sleep(unavailable * 2 + Duration::from_secs(1)).await;
    assert!(
        !open.is_finished(),
        "the session open gave up while etcd was stopped: {:?}",
        open.await
    );
    svc.cluster.restart(0).await;
    let session = open
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("no session after etcd came back: {e}"));
    assert!(started.elapsed() < wait, "opened within the wait");
    // The session is real and kept alive: it acquires, and the lock names it.
    let hold = session
        .acquire(
            "ns",
            "c",
            "opened",
            LockMode::Exclusive,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let status = client
        .call_json(
            "GET",
            "/v1/locks/status?namespace=ns&class=c&key=opened",
            None,
        )
        .await
        .unwrap();
    assert_eq!(status["holders"][0]["session"], session.id());
    hold.release().await.unwrap();
    session.close().await.unwrap();
}
