//! Faults on the run's network and clocks: cuts between hosts (both ways or one way)
//! with iptables in the hosts' own namespaces, latency and loss with `tc netem` on a
//! host's link, and wall-clock jumps with libfaketime.
//!
//! Every rule lives in a namespace the run made, so healing is flushing those hosts'
//! `filter` chains and deleting their `netem` qdisc; the machine's own firewall is
//! never touched.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::host::{Host, NetError, Network};

/// Where Debian's `faketime` package puts the preload library.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Latency and loss on a host's link (both directions of its `eth0` egress).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Netem {
    /// Added delay.
    pub delay: Duration,
    /// Random variation of the delay (uniform, plus or minus).
    pub jitter: Duration,
    /// Packets dropped, in percent (0–100).
    pub loss_percent: u8,
}

impl Network {
    /// Cuts every link between a host of `a` and a host of `b`, both ways: each drops
    /// what it receives from, and what it sends to, the other side.
    ///
    /// # Errors
    ///
    /// [`NetError::Command`] if `iptables` fails (`NetError::Missing` when absent).
    pub fn partition(&self, a: &[&Host], b: &[&Host]) -> Result<(), NetError> {
        if a.is_empty() || b.is_empty() {
            return Ok(());
        }
        for (side, other) in [(a, b), (b, a)] {
            for h in side {
                drop_rule(h, "INPUT", "-s", other)?;
                drop_rule(h, "OUTPUT", "-d", other)?;
            }
        }
        Ok(())
    }

    /// Drops what `from` sends to `to`, and only that: `to`'s packets reach `from`.
    ///
    /// # Errors
    ///
    /// As [`Network::partition`].
    pub fn drop_one_way(&self, from: &Host, to: &Host) -> Result<(), NetError> {
        drop_rule(from, "OUTPUT", "-d", &[to])
    }

    /// Puts `netem` on `host`'s link (replacing any).
    ///
    /// # Errors
    ///
    /// [`NetError::Missing`] when the kernel has no netem qdisc (`sch_netem`);
    /// [`NetError::Command`] if `tc` fails otherwise.
    pub fn netem(&self, host: &Host, n: Netem) -> Result<(), NetError> {
        let delay = format!("{}ms", n.delay.as_millis());
        let jitter = format!("{}ms", n.jitter.as_millis());
        let loss = format!("{}%", n.loss_percent.min(100));
        host.exec(&[
            "tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", &delay, &jitter,
            "loss", &loss,
        ])
        .map_err(|e| match e {
            NetError::Command { stderr, .. } if stderr.contains("qdisc kind is unknown") => {
                NetError::Missing {
                    tool: "sch_netem",
                    package: "a kernel with CONFIG_NET_SCH_NETEM",
                    reason: stderr,
                }
            }
            e => e,
        })
    }

    /// Drops `percent` of what `host` sends, at random (iptables `statistic`; needs no
    /// netem).
    ///
    /// # Errors
    ///
    /// As [`Network::partition`].
    pub fn lossy(&self, host: &Host, percent: u8) -> Result<(), NetError> {
        let p = format!("{:.4}", f64::from(percent.min(100)) / 100.0);
        host.exec(&[
            "iptables",
            "-w",
            "-A",
            "OUTPUT",
            "-o",
            "eth0",
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            &p,
            "-j",
            "DROP",
        ])
    }

    /// Heals every cut and every `netem` of every host.
    ///
    /// # Errors
    ///
    /// [`NetError::Command`] naming the first step that failed (the others are done
    /// anyway).
    pub fn heal(&self) -> Result<(), NetError> {
        let mut first = None;
        for h in self.hosts() {
            for chain in ["INPUT", "OUTPUT"] {
                if let Err(e) = h.exec(&["iptables", "-w", "-F", chain]) {
                    first.get_or_insert(e);
                }
            }
            // No qdisc to delete is fine: it is what healed looks like.
            let _ = h.exec(&["tc", "qdisc", "del", "dev", "eth0", "root"]);
        }
        first.map_or(Ok(()), Err)
    }
}

/// One `iptables` call on `h`: drop in `chain` what comes from (`-s`) or goes to (`-d`)
/// any of `others` (a comma list makes one rule per address).
fn drop_rule(h: &Host, chain: &str, dir: &str, others: &[&Host]) -> Result<(), NetError> {
    let addrs = others
        .iter()
        .map(|o| o.addr().to_string())
        .collect::<Vec<_>>()
        .join(",");
    h.exec(&["iptables", "-w", "-A", chain, dir, &addrs, "-j", "DROP"])
        .map_err(|e| match e {
            NetError::Command { stderr, .. } if stderr.contains("No such file") => {
                NetError::Missing {
                    tool: "iptables",
                    package: "iptables",
                    reason: stderr,
                }
            }
            e => e,
        })
}

/// A wall clock that can jump: processes started with [`ClockSkew::apply`] read the
/// real time plus the offset in a file, read again on every call, so
/// [`ClockSkew::jump`] moves their wall clock at once. Their monotonic clocks stay true
/// (`FAKETIME_DONT_FAKE_MONOTONIC`).
///
/// libfaketime before 0.9.11 (Debian 12's 0.9.10) makes a shared memory file per
/// process, `/dev/shm/faketime_shm_<pid>` (and a semaphore, `sem.faketime_sem_<pid>`),
/// and removes it only when the process exits normally; later releases make none under
/// `FAKETIME_DISABLE_SHM`, which [`ClockSkew::apply`] sets too. Tell the skew the pid of
/// each process started with it ([`ClockSkew::started`]); [`ClockSkew::remove_leftovers`]
/// removes what those left once they are gone.
#[derive(Debug, Clone)]
pub struct ClockSkew {
    file: PathBuf,
    pids: Arc<Mutex<Vec<u32>>>,
}

impl ClockSkew {
    /// A skew of zero, kept in `file`.
    ///
    /// # Errors
    ///
    /// [`NetError::Missing`] without Debian's `faketime` package; [`NetError::Io`] if the
    /// file cannot be written.
    pub fn new(file: &Path) -> Result<ClockSkew, NetError> {
        if !Path::new(LIBFAKETIME).exists() {
            return Err(NetError::Missing {
                tool: "libfaketime",
                package: "faketime",
                reason: format!("{LIBFAKETIME} does not exist"),
            });
        }
        let skew = ClockSkew {
            file: file.to_owned(),
            pids: Arc::default(),
        };
        skew.jump(0)?;
        Ok(skew)
    }

    /// Sets the offset from the real wall clock to `seconds` (negative: back).
    ///
    /// # Errors
    ///
    /// [`NetError::Io`] if the file cannot be written.
    pub fn jump(&self, seconds: i64) -> Result<(), NetError> {
        // Written whole and renamed into place, so a reader never sees half of it.
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("{seconds:+}s\n"))
            .and_then(|()| std::fs::rename(&tmp, &self.file))
            .map_err(|source| NetError::Io {
                host: "clock".into(),
                what: "writing the clock offset",
                source,
            })
    }

    /// Notes that process `pid` was started with this skew (shared by its clones).
    pub fn started(&self, pid: u32) {
        self.pids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(pid);
    }

    /// Removes the shared memory files libfaketime left for the processes started with
    /// this skew; call it once they are gone. Returns the files removed.
    pub fn remove_leftovers(&self) -> Vec<PathBuf> {
        let pids = std::mem::take(&mut *self.pids.lock().unwrap_or_else(|e| e.into_inner()));
        let mut removed = Vec::new();
        for pid in pids {
            for name in [
                format!("faketime_shm_{pid}"),
                format!("sem.faketime_sem_{pid}"),
            ] {
                let path = Path::new("/dev/shm").join(name);
                if std::fs::remove_file(&path).is_ok() {
                    removed.push(path);
                }
            }
        }
        removed
    }

    /// Makes `command` run with this skew.
    pub fn apply(&self, command: &mut Command) {
        command
            .env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME_TIMESTAMP_FILE", &self.file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env("FAKETIME_DISABLE_SHM", "1");
    }
}
