//! An etcd tier reached over TLS with client-certificate auth: `palisade serve --tier
//! NAME=https://... --tier-ca/--tier-cert/--tier-key NAME=FILE` grants in a namespace on
//! that tier, `palisade audit tail` records the grant from that cluster, and a service
//! given no CA, another cluster's CA or no client certificate does not start, naming the
//! tier. Real etcd members (the TLS one started with `--client-cert-auth`), a real
//! PostgreSQL database and real `palisade` processes.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::service::{audit_grants, run, wait_listening, ADMIN, JOB};
use palisade_client::Client;
use palisade_testkit::{EtcdCluster, TestDb};
use serde_json::json;

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `palisade serve` on home tier `home` (plain) and tier `secure` (`secure`'s TLS
/// endpoints) with the TLS flags `tls`.
fn serve(
    home: &EtcdCluster,
    secure: &EtcdCluster,
    dir: &Path,
    addr: SocketAddr,
    tls: &[String],
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"));
    command
        .args(["serve", "--etcd", &home.endpoints().join(",")])
        .args(["--home-tier", "home", "--tier"])
        .arg(format!("secure={}", secure.tls_endpoints().join(",")))
        .args(tls)
        .args(["--listen", &addr.to_string(), "--insecure-dev-identity"])
        .arg("--config")
        .arg(dir.join("authz.toml"))
        .arg("--epoch-file")
        .arg(dir.join("epoch.json"))
        .kill_on_drop(true);
    command
}

/// `--tier-ca`, `--tier-cert` and `--tier-key` for tier `secure`.
fn tier_tls(ca: &Path, identity: Option<(&Path, &Path)>) -> Vec<String> {
    let mut flags = vec![format!("--tier-ca=secure={}", ca.display())];
    if let Some((cert, key)) = identity {
        flags.push(format!("--tier-cert=secure={}", cert.display()));
        flags.push(format!("--tier-key=secure={}", key.display()));
    }
    flags
}

fn authz(dir: &Path) {
    std::fs::write(
        dir.join("authz.toml"),
        format!("admins = [\"{ADMIN}\"]\n[[namespace]]\nid = \"ns\"\n[[namespace.grant]]\nids = [\"spiffe://test/jobs/\"]\nclasses = [\"c\"]\n"),
    )
    .unwrap();
}

#[tokio::test]
async fn etcd_serve_and_audit_tail_reach_a_tier_over_tls_with_a_client_certificate() {
    let (home, secure) = (EtcdCluster::start(1).await, EtcdCluster::start_tls(1).await);
    let dir = tempfile::tempdir().unwrap();
    authz(dir.path());
    let addr = free_addr();
    let files = secure.tls_files();
    let flags = tier_tls(
        &files.ca(),
        Some((&files.client_cert(), &files.client_key())),
    );
    let mut server = serve(&home, &secure, dir.path(), addr, &flags)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(addr).await;
    assert!(
        server.try_wait().unwrap().is_none(),
        "palisade serve exited"
    );
    let url = format!("http://{addr}");
    let admin = |args: &[&str]| {
        let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        all.extend([
            "--service".into(),
            url.clone(),
            "--dev-identity".into(),
            ADMIN.into(),
        ]);
        run(all, &[])
    };
    admin(&[
        "namespace",
        "create",
        "ns",
        "--tenant",
        "t",
        "--cluster-tier",
        "secure",
    ])
    .await
    .ok();
    admin(&["class", "create", "ns", "c"]).await.ok();
    // The tier's epoch record is bound to the TLS cluster.
    let epoch = admin(&["epoch", "show", "--tier", "secure"])
        .await
        .ok()
        .json();
    let secure_id = secure.cluster_id().await;
    assert_eq!(epoch["cluster_id"], json!(secure_id), "{epoch}");

    let db = TestDb::create().await;
    let _tailer = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["audit", "tail", "--etcd", &home.endpoints().join(",")])
        .arg("--tier")
        .arg(format!("secure={}", secure.tls_endpoints().join(",")))
        .args(&flags)
        .args(["--database", &db.connection_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let client = Client::new(url.clone()).unwrap().with_dev_identity(JOB);
    let session = client
        .call_json(
            "POST",
            "/v1/sessions",
            Some(json!({"ttl_ms": 10000, "namespace": "ns"})),
        )
        .await
        .unwrap();
    assert_eq!(session["tier"], "secure", "{session}");
    let hold = client
        .call_json(
            "POST",
            "/v1/locks/acquire",
            Some(
                json!({"session": session["session"], "namespace": "ns", "class": "c",
                "key": "k", "mode": "exclusive", "wait_ms": 2000}),
            ),
        )
        .await
        .unwrap();
    // The grant revision is the TLS cluster's: its revision moved past it, the home
    // cluster's (a handful of writes) did not reach it.
    let grant_rev = hold["grant_rev"].as_i64().unwrap();
    assert!(grant_rev <= secure.status(0).await.revision, "{hold}");

    // The tailer, also over TLS, records the grant under the TLS cluster's id.
    let pg = db.connect().await;
    let token: i64 = hold["token"].as_str().unwrap().parse().unwrap();
    let grants = audit_grants(&pg, "ns", |g| !g.is_empty()).await;
    assert_eq!(grants, [(secure_id as i64, token)]);
}

/// Runs `palisade serve` (or `audit tail`) that must exit on its own with `code`; its stderr.
async fn refused(mut command: tokio::process::Command, code: i32) -> String {
    let out = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .expect("palisade serve kept running")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    stderr
}

#[tokio::test]
async fn etcd_serve_does_not_start_a_tls_tier_without_its_ca_or_client_certificate() {
    let (home, secure) = (EtcdCluster::start(1).await, EtcdCluster::start_tls(1).await);
    let other = EtcdCluster::start_tls(1).await;
    let db = TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    authz(dir.path());
    let files = secure.tls_files();
    let identity = Some((files.client_cert(), files.client_key()));
    let identity = identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));

    // No CA: refused before connecting, naming the flag to add.
    let stderr = refused(serve(&home, &secure, dir.path(), free_addr(), &[]), 2).await;
    assert!(stderr.contains("--tier-ca secure=FILE"), "{stderr}");

    // Another cluster's CA: the members' certificate is not trusted.
    let wrong_ca = tier_tls(&other.tls_files().ca(), identity);
    let stderr = refused(serve(&home, &secure, dir.path(), free_addr(), &wrong_ca), 1).await;
    assert!(
        stderr.contains("cannot start tier secure on etcd https://"),
        "{stderr}"
    );
    assert!(stderr.contains("invalid peer certificate"), "{stderr}");
    assert!(
        stderr.contains("(TLS: the members' certificates must chain to --tier-ca secure=FILE"),
        "{stderr}"
    );
    // `palisade audit tail` with the same flags does not start either, naming the tier.
    let mut tail = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"));
    tail.args(["audit", "tail", "--etcd", &home.endpoints().join(",")])
        .arg("--tier")
        .arg(format!("secure={}", secure.tls_endpoints().join(",")))
        .args(&wrong_ca)
        .args(["--database", &db.connection_string()])
        .kill_on_drop(true);
    let stderr = refused(tail, 1).await;
    assert!(
        stderr.contains("cannot start tier secure on etcd https://"),
        "{stderr}"
    );
    assert!(stderr.contains("invalid peer certificate"), "{stderr}");

    // The right CA but no client certificate: etcd's --client-cert-auth refuses it.
    let no_cert = tier_tls(&files.ca(), None);
    let stderr = refused(serve(&home, &secure, dir.path(), free_addr(), &no_cert), 1).await;
    assert!(
        stderr.contains("cannot start tier secure on etcd https://"),
        "{stderr}"
    );
    // (What follows, etcd's TLS alert or the connection closed, depends on timing.)

    // Another cluster's client certificate: not chained to this cluster's CA.
    let (other_cert, other_key) = (
        other.tls_files().client_cert(),
        other.tls_files().client_key(),
    );
    let foreign = tier_tls(&files.ca(), Some((&other_cert, &other_key)));
    let stderr = refused(serve(&home, &secure, dir.path(), free_addr(), &foreign), 1).await;
    assert!(
        stderr.contains("cannot start tier secure on etcd https://"),
        "{stderr}"
    );

    // A CA file that is not PEM: refused naming the file.
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let stderr = refused(
        serve(
            &home,
            &secure,
            dir.path(),
            free_addr(),
            &tier_tls(&junk, None),
        ),
        2,
    )
    .await;
    assert!(
        stderr.contains("--tier-ca secure=...: the etcd CA file ")
            && stderr.contains("junk.pem holds no certificate"),
        "{stderr}"
    );
}
