//! A real `palisade serve` process on loopback in front of real etcd, and the
//! `palisade` binary run against it.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use palisade_lock::{FileEpochStore, LockClass, Locker, LockerOptions, Namespace};
use palisade_testkit::EtcdCluster;

use super::pki::{Pki, SvidFiles};

pub const JOB: &str = "spiffe://test/jobs/a";
pub const JOB2: &str = "spiffe://test/jobs/b";
pub const ADMIN: &str = "spiffe://test/admin";
pub const ADMIN2: &str = "spiffe://test/admin2";
pub const NOBODY: &str = "spiffe://test/nobody";

/// How the service is started.
pub enum Mode {
    /// `--insecure-dev-identity`, plain HTTP.
    Dev,
    /// `--tls-cert/--tls-key/--client-ca` with a fresh CA.
    Mtls,
}

pub struct Service {
    pub cluster: EtcdCluster,
    pub locker: Locker,
    pub url: String,
    pub dir: tempfile::TempDir,
    /// The CA of the service and its clients (mTLS mode).
    pub pki: Option<Pki>,
    _server: tokio::process::Child,
}

/// The output of one `palisade` run.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    #[track_caller]
    pub fn ok(self) -> Out {
        assert_eq!(self.code, 0, "{self:?}");
        self
    }

    #[track_caller]
    pub fn fails(self, code: i32, stderr_has: &str) -> Out {
        assert_eq!(self.code, code, "{self:?}");
        assert!(self.stdout.is_empty(), "{self:?}");
        assert!(self.stderr.contains(stderr_has), "{self:?}");
        self
    }
}

impl Service {
    /// etcd, namespace `ns` with classes `c` (exclusive, prefix "") and the service.
    /// Authorization: ADMIN and ADMIN2 are service admins; JOB and JOB2 (the
    /// `spiffe://test/jobs/` prefix) may lock class `c`. With `database`, force release
    /// is on.
    pub async fn start(mode: Mode, database: Option<String>) -> Service {
        let cluster = EtcdCluster::start(1).await;
        let dir = tempfile::tempdir().unwrap();
        let epoch_file = dir.path().join("epoch.json");
        let locker = Locker::connect(
            LockerOptions::new(cluster.endpoints()),
            FileEpochStore::new(&epoch_file),
        )
        .await
        .unwrap();
        locker
            .config()
            .put_namespace(&Namespace::new("ns", "t"))
            .await
            .unwrap();
        locker
            .config()
            .put_class(&LockClass::new("ns", "c", ""))
            .await
            .unwrap();
        let config = dir.path().join("authz.toml");
        std::fs::write(
            &config,
            format!("admins = [\"{ADMIN}\", \"{ADMIN2}\"]\n[[namespace]]\nid = \"ns\"\n[[namespace.grant]]\nids = [\"spiffe://test/jobs/\"]\nclasses = [\"c\"]\n"),
        )
        .unwrap();
        let addr: SocketAddr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"));
        cmd.args(["serve", "--etcd", &cluster.endpoints().join(",")])
            .args(["--listen", &addr.to_string()])
            .arg("--config")
            .arg(&config)
            .arg("--epoch-file")
            .arg(&epoch_file);
        if let Some(db) = database {
            cmd.args(["--database", &db]);
        }
        let (pki, url) = match mode {
            Mode::Dev => {
                cmd.arg("--insecure-dev-identity");
                (None, format!("http://{addr}"))
            }
            Mode::Mtls => {
                let pki = Pki::new("test CA");
                let server = pki.server().files(dir.path(), "server");
                cmd.arg("--tls-cert")
                    .arg(&server.cert)
                    .arg("--tls-key")
                    .arg(&server.key)
                    .arg("--client-ca")
                    .arg(pki.ca_file(dir.path()));
                (Some(pki), format!("https://127.0.0.1:{}", addr.port()))
            }
        };
        let server = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        wait_listening(addr).await;
        Service {
            cluster,
            locker,
            url,
            dir,
            pki,
            _server: server,
        }
    }

    /// The pid of the `palisade serve` process.
    pub fn server_pid(&self) -> u32 {
        self._server.id().expect("palisade serve is running")
    }

    /// PEM files of an SVID for `uris` from the service's CA (mTLS mode).
    pub fn svid(&self, name: &str, uris: &[&str]) -> SvidFiles {
        self.pki
            .as_ref()
            .expect("an mTLS service")
            .client(uris)
            .files(self.dir.path(), name)
    }

    /// The CA file (mTLS mode).
    pub fn ca(&self) -> std::path::PathBuf {
        self.pki
            .as_ref()
            .expect("an mTLS service")
            .ca_file(self.dir.path())
    }

    /// `palisade ARGS --service URL --dev-identity ID` (dev mode).
    pub async fn dev(&self, id: &str, args: &[&str]) -> Out {
        let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let mut all: Vec<&str> = args[..at].to_vec();
        all.extend(["--service", &self.url, "--dev-identity", id]);
        all.extend(&args[at..]);
        run(all, &[]).await
    }

    /// `palisade ARGS --service URL --cert --key --ca` with `svid` (mTLS mode).
    pub async fn tls(&self, svid: &SvidFiles, args: &[&str]) -> Out {
        let ca = self.ca();
        // Before a `--` that starts the command of `lock run`.
        let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let mut all: Vec<&OsStr> = args[..at].iter().map(OsStr::new).collect();
        all.extend([OsStr::new("--service"), OsStr::new(&self.url)]);
        all.extend([OsStr::new("--cert"), svid.cert.as_os_str()]);
        all.extend([OsStr::new("--key"), svid.key.as_os_str()]);
        all.extend([OsStr::new("--ca"), ca.as_os_str()]);
        all.extend(args[at..].iter().map(OsStr::new));
        run(all, &[]).await
    }
}

/// Waits up to 20 s until something accepts connections at `addr` (a `palisade serve`
/// just started).
pub async fn wait_listening(addr: SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "palisade serve did not start listening on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits up to 15 s until the audit trail's grants in namespace `ns`, as
/// `(cluster_id, token)`, satisfy `done`; returns them. Panics with them otherwise.
pub async fn audit_grants(
    pg: &tokio_postgres::Client,
    ns: &str,
    done: impl Fn(&[(i64, i64)]) -> bool,
) -> Vec<(i64, i64)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let rows = pg
            .query(
                "SELECT cluster_id, token FROM audit_event WHERE type = 'grant' \
                 AND namespace = $1 ORDER BY token",
                &[&ns],
            )
            .await
            .unwrap_or_default();
        let grants: Vec<(i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        if done(&grants) {
            return grants;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "audit grants (cluster id, token) in {ns}: {grants:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `palisade` with `args` and extra environment variables (and none of the
/// PALISADE_* ones inherited).
pub async fn run<S: AsRef<OsStr>>(args: Vec<S>, env: &[(&str, &OsStr)]) -> Out {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"));
    for var in [
        "PALISADE_SERVICE",
        "PALISADE_CERT",
        "PALISADE_KEY",
        "PALISADE_CA",
        "PALISADE_DEV_IDENTITY",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run palisade");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
