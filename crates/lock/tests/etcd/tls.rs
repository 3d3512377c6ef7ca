//! A locker on an etcd cluster that serves clients only to TLS clients with a certificate
//! (`--client-cert-auth`): with the cluster's CA and a client certificate it grants
//! tokens minted from that cluster's revisions; without the CA, with another CA or
//! without a client certificate it does not start; TLS options with `http://` endpoints
//! are refused.

use std::time::Duration;

use palisade_lock::{ErrorKind, EtcdTls, FileEpochStore, Locker, LockerOptions, Mode};
use palisade_testkit::{EtcdCluster, EtcdTlsFiles};

use crate::support::{configure, lock, secs, session};

fn tls(files: &EtcdTlsFiles, identity: bool) -> EtcdTls {
    let tls = EtcdTls::new(EtcdTlsFiles::read(&files.ca())).unwrap();
    if identity {
        tls.with_identity(
            EtcdTlsFiles::read(&files.client_cert()),
            EtcdTlsFiles::read(&files.client_key()),
        )
        .unwrap()
    } else {
        tls
    }
}

async fn connect(
    endpoints: Vec<String>,
    tls: EtcdTls,
    dir: &tempfile::TempDir,
) -> Result<Locker, palisade_lock::Error> {
    let options = LockerOptions::new(endpoints)
        .with_request_timeout(Duration::from_millis(500))
        .with_tls(tls);
    Locker::connect(options, FileEpochStore::new(dir.path().join("epoch.json"))).await
}

#[tokio::test]
async fn etcd_a_locker_over_tls_grants_tokens_of_that_cluster() {
    let cluster = EtcdCluster::start_tls(3).await;
    let dir = tempfile::tempdir().unwrap();
    let locker = connect(
        cluster.tls_endpoints(),
        tls(cluster.tls_files(), true),
        &dir,
    )
    .await
    .unwrap();
    assert_eq!(locker.epoch().0.cluster_id, cluster.cluster_id().await);
    configure(&locker).await;
    let s = session(&locker, 10).await;
    let first = locker
        .acquire(&s, &lock("k"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let t1 = first.token().unwrap();
    first.release().await.unwrap();
    let second = locker
        .acquire(&s, &lock("k"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let t2 = second.token().unwrap();
    assert!(t2 > t1, "{t2} after {t1}");
    // The token's revision is the TLS cluster's, read back over the kit's plain port: the
    // newest revision any member has applied (a follower may not have applied it yet).
    let mut newest = 0;
    for i in 0..3 {
        newest = newest.max(cluster.status(i).await.revision);
    }
    assert!(
        t2.revision().get() as i64 <= newest,
        "{t2} after revision {newest}"
    );
    second.release().await.unwrap();
}

#[tokio::test]
async fn etcd_a_locker_without_the_clusters_ca_or_client_certificate_does_not_start() {
    let cluster = EtcdCluster::start_tls(1).await;
    let other = EtcdCluster::start_tls(1).await;
    let endpoints = cluster.tls_endpoints();
    let dir = tempfile::tempdir().unwrap();

    // Another CA: the members' certificate is not trusted.
    let e = connect(endpoints.clone(), tls(other.tls_files(), true), &dir)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::QuorumLost, "{e}");
    // The right CA, no client certificate: etcd refuses the handshake.
    let e = connect(endpoints.clone(), tls(cluster.tls_files(), false), &dir)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::QuorumLost, "{e}");
    // Another cluster's client certificate: not chained to this cluster's CA.
    let foreign = EtcdTls::new(EtcdTlsFiles::read(&cluster.tls_files().ca()))
        .unwrap()
        .with_identity(
            EtcdTlsFiles::read(&other.tls_files().client_cert()),
            EtcdTlsFiles::read(&other.tls_files().client_key()),
        )
        .unwrap();
    let e = connect(endpoints, foreign, &dir).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::QuorumLost, "{e}");
    // TLS options with plain endpoints: refused, not sent in clear.
    let e = connect(cluster.endpoints(), tls(cluster.tls_files(), true), &dir)
        .await
        .unwrap_err();
    assert!(
        std::error::Error::source(&e)
            .is_some_and(|s| s.to_string().contains("only supported with HTTPS")),
        "{e}: {:?}",
        std::error::Error::source(&e)
    );
}
