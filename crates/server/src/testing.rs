//! A running lock service for tests and benchmarks (feature `testing`): real etcd
//! members started by `palisade-testkit`, lockers that share one durable epoch record
//! (as replicas share a volume), and the service on a free loopback port.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use std::time::Duration;
//! use palisade_lock::{LockClass, Namespace};
//! use palisade_server::testing::{serve_dev_on_loopback, ServiceFixture};
//! # let options: palisade_server::ServiceOptions = unimplemented!();
//!
//! let f = ServiceFixture::start(1, Duration::from_millis(500)).await?;
//! f.configure(&Namespace::new("ns", "tenant"), &LockClass::new("ns", "c", "")).await?;
//! let replica = serve_dev_on_loopback(f.connect().await?, options).await?;
//! println!("{}", replica.url());
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use palisade_lock::{FileEpochStore, LockClass, Locker, LockerOptions, Namespace};
use palisade_testkit::EtcdCluster;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::{serve_dev, serve_tls, ServiceOptions};

/// etcd members and the lockers of one key space.
#[derive(Debug)]
pub struct ServiceFixture {
    /// The etcd members (kill, pause or restore them to test faults).
    pub cluster: EtcdCluster,
    /// A locker of the key space, for set-up and for checks beside the service.
    pub locker: Locker,
    request_timeout: Duration,
    dir: tempfile::TempDir,
}

impl ServiceFixture {
    /// Starts `members` etcd members (see `EtcdCluster::start`) and connects one locker
    /// whose etcd requests time out after `request_timeout`.
    ///
    /// # Errors
    ///
    /// The temporary directory or the locker's connection failed.
    pub async fn start(
        members: usize,
        request_timeout: Duration,
    ) -> Result<ServiceFixture, Box<dyn std::error::Error + Send + Sync>> {
        let cluster = EtcdCluster::start(members).await;
        let dir = tempfile::tempdir()?;
        Ok(ServiceFixture {
            locker: connect(&cluster, request_timeout, &dir).await?,
            cluster,
            request_timeout,
            dir,
        })
    }

    /// Another locker of the same key space and durable epoch record: what a second
    /// service replica would run.
    ///
    /// # Errors
    ///
    /// What [`Locker::connect`] answers.
    pub async fn connect(&self) -> palisade_lock::Result<Locker> {
        connect(&self.cluster, self.request_timeout, &self.dir).await
    }

    /// A temporary directory that lives as long as the fixture (the epoch record is in
    /// it, as `epoch.json`).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Writes a namespace and one class of it.
    ///
    /// # Errors
    ///
    /// What the config store answers.
    pub async fn configure(&self, ns: &Namespace, class: &LockClass) -> palisade_lock::Result<()> {
        self.locker.config().put_namespace(ns).await?;
        self.locker.config().put_class(class).await
    }
}

async fn connect(
    cluster: &EtcdCluster,
    request_timeout: Duration,
    dir: &tempfile::TempDir,
) -> palisade_lock::Result<Locker> {
    Locker::connect(
        LockerOptions::new(cluster.endpoints()).with_request_timeout(request_timeout),
        FileEpochStore::new(dir.path().join("epoch.json")),
    )
    .await
}

/// A service being served on a loopback port. It runs until [`Served::stop`] or the end
/// of the runtime; dropping this handle does not stop it.
#[derive(Debug)]
pub struct Served {
    /// The address it listens on.
    pub addr: SocketAddr,
    scheme: &'static str,
    task: JoinHandle<()>,
}

impl Served {
    /// `http://127.0.0.1:<port>` (dev mode) or `https://127.0.0.1:<port>` (mTLS).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Stops serving.
    pub fn stop(self) {
        self.task.abort();
    }
}

/// Serves `locker` in dev mode ([`serve_dev`]) on a free port of 127.0.0.1.
///
/// # Errors
///
/// Binding the port failed.
pub async fn serve_dev_on_loopback(
    locker: Locker,
    options: ServiceOptions,
) -> std::io::Result<Served> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = serve_dev(listener, locker, options).await {
            tracing::error!(error = %e, "test service stopped");
        }
    });
    Ok(Served {
        addr,
        scheme: "http",
        task,
    })
}

/// Serves `locker` over mTLS ([`serve_tls`]) on a free port of 127.0.0.1.
///
/// # Errors
///
/// Binding the port failed.
pub async fn serve_tls_on_loopback(
    locker: Locker,
    tls: Arc<ServerConfig>,
    options: ServiceOptions,
) -> std::io::Result<Served> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = serve_tls(listener, tls, locker, options).await {
            tracing::error!(error = %e, "test service stopped");
        }
    });
    Ok(Served {
        addr,
        scheme: "https",
        task,
    })
}
