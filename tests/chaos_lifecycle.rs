//! `palisade chaos`'s start and stop, with the real binary: without the privilege for
//! network hosts it fails at once naming it; interrupted by SIGINT or SIGTERM once its
//! parts are up on network hosts (the test runs as root, as CI does), it exits 130 or
//! 143, leaves no process, data directory or network namespace of the run behind, and
//! leaves a history of whole lines (those tests start etcd: `etcd` in their names).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use palisade_chaos::history::read_history;

/// Where the kit puts etcd's and PostgreSQL's data directories.
const SHM: &str = "/dev/shm";

/// Every process's parent, from `/proc/PID/stat`.
fn parents() -> BTreeMap<u32, u32> {
    let mut map = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name in parentheses may hold spaces: the fields follow the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok());
        if let Some(ppid) = ppid {
            map.insert(pid, ppid);
        }
    }
    map
}

/// The descendants of `root`.
fn descendants(root: u32) -> BTreeSet<u32> {
    let parents = parents();
    let mut found = BTreeSet::from([root]);
    loop {
        let more: Vec<u32> = parents
            .iter()
            .filter(|(pid, ppid)| found.contains(ppid) && !found.contains(pid))
            .map(|(pid, _)| *pid)
            .collect();
        if more.is_empty() {
            found.remove(&root);
            return found;
        }
        found.extend(more);
    }
}

fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Whether `pid` runs (a zombie has ended; its parent has not reaped it yet).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(str::to_owned))
        })
        .is_some_and(|state| state != "Z")
}

/// The directories the run's processes name on their command lines: each etcd member's
/// (`--data-dir=DIR/data`), PostgreSQL's (`-D DIR/data`) and the run directory (a
/// replica's `--config DIR/authz.toml`).
fn dirs_of(pids: &BTreeSet<u32>) -> BTreeSet<PathBuf> {
    let mut dirs = BTreeSet::new();
    for pid in pids {
        let args = cmdline(*pid);
        for (i, a) in args.iter().enumerate() {
            let named = if let Some(d) = a.strip_prefix("--data-dir=") {
                Some(d.to_owned())
            } else if a == "-D" || a == "--config" {
                args.get(i + 1).cloned()
            } else {
                None
            };
            if let Some(parent) = named.as_deref().map(Path::new).and_then(Path::parent) {
                dirs.insert(parent.to_owned());
            }
        }
    }
    dirs
}

fn listing(dir: &str) -> BTreeSet<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect()
}

fn run_namespaces(pid: u32) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(out.status.success(), "ip netns list failed");
    let prefix = format!("{}{pid}-", palisade_chaos::net::PREFIX);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// The host (the part of its namespace's name after the run's prefix) `pid` runs on:
/// the run's namespace whose `nsfs` inode is that of the process's network namespace.
fn host_of(pid: u32, namespaces: &[String]) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let ino = |p: &str| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let own = ino(&format!("/proc/{pid}/ns/net"))?;
    namespaces
        .iter()
        .find(|ns| ino(&format!("/run/netns/{ns}")) == Some(own))
        .and_then(|ns| ns.rsplit_once('-').map(|(_, host)| host.to_owned()))
}

/// Waits for `child` to exit within `limit`; kills it and fails otherwise.
fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("palisade chaos did not exit within {limit:?} of the signal");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts a run, waits until its workers run, sends `signal` (and the same signal again
/// once it says it is cleaning up), and checks what is left.
fn interrupted_run_leaves_nothing(signal: Signal, code: i32) {
    let dir = tempfile::tempdir().unwrap();
    // The run's own directory and etcd snapshots go to the temp directory: a private one.
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let history = dir.path().join("history.jsonl");
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let shm_before = listing(SHM);
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "chaos",
            "--seed",
            "7",
            "--duration",
            "60s",
            "--workers",
            "2",
            "--keys",
            "2",
            "--history",
        ])
        .arg(&history)
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();

    // Up: both workers run (they start last), then a few seconds of work.
    let deadline = Instant::now() + Duration::from_secs(120);
    let workers = |pids: &BTreeSet<u32>| {
        pids.iter()
            .filter(|p| {
                cmdline(**p)
                    .windows(2)
                    .any(|w| w[0] == "chaos" && w[1] == "worker")
            })
            .count()
    };
    while workers(&descendants(pid)) < 2 {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "palisade chaos exited before its workers ran ({status}): {}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the workers did not start in 120 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3));
    let pids = descendants(pid);
    let dirs = dirs_of(&pids);
    let namespaces = run_namespaces(pid);
    // Four etcd members (three of the home tier, one of the spare tier), PostgreSQL and
    // the run directory; a switch and 10 hosts.
    assert!(dirs.len() >= 6, "the run's directories: {dirs:?}");
    assert_eq!(namespaces.len(), 11, "{namespaces:?}");
    // Each etcd member on a host of its own, the spare tier's on `spare0`.
    let etcd_hosts: BTreeSet<String> = pids
        .iter()
        .filter(|p| cmdline(**p).iter().any(|a| a.starts_with("--data-dir=")))
        .filter_map(|p| host_of(*p, &namespaces))
        .collect();
    let expected: BTreeSet<String> = ["etcd0", "etcd1", "etcd2", "spare0"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(etcd_hosts, expected, "the etcd members' hosts");

    kill(Pid::from_raw(pid as i32), signal).unwrap();
    // The same signal again while it cleans up: ignored.
    let said = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&err)
        .unwrap_or_default()
        .contains("stopping the run")
        && Instant::now() < said
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = kill(Pid::from_raw(pid as i32), signal);
    let status = wait_exit(&mut child, Duration::from_secs(90));
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert_eq!(status.code(), Some(code), "{stderr}");

    // Every leftover is noted, then removed (so a failing run does not fill the
    // machine), then reported.
    let mut leftovers = Vec::new();
    let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    for p in &left {
        let _ = kill(Pid::from_raw(*p as i32), Signal::SIGKILL);
    }
    leftovers.extend(left.iter().map(|p| format!("process {p}")));
    // libfaketime's files are named after the process's pid.
    let faked = |p: &Path| {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        name.contains("faketime")
            && name
                .rsplit_once('_')
                .and_then(|(_, pid)| pid.parse::<u32>().ok())
                .is_some_and(|pid| pids.contains(&pid))
    };
    let new_in_shm: BTreeSet<PathBuf> = listing(SHM).difference(&shm_before).cloned().collect();
    let paths = dirs
        .iter()
        .chain(new_in_shm.iter().filter(|p| faked(p)))
        .chain(&listing(tmp.to_str().unwrap()))
        .filter(|d| d.exists())
        .cloned()
        .collect::<BTreeSet<PathBuf>>();
    for d in &paths {
        let _ = std::fs::remove_dir_all(d).or_else(|_| std::fs::remove_file(d));
        leftovers.push(d.display().to_string());
    }
    for ns in run_namespaces(pid) {
        let _ = Command::new("ip").args(["netns", "delete", &ns]).status();
        leftovers.push(format!("namespace {ns}"));
    }
    assert_eq!(leftovers, Vec::<String>::new(), "left behind by the run");

    let text = std::fs::read_to_string(&history).unwrap();
    assert!(text.ends_with('\n'), "the history ends with a whole line");
    let entries = read_history(std::io::BufReader::new(text.as_bytes())).unwrap();
    assert!(!entries.is_empty(), "the workers recorded entries");
    assert!(
        stderr.contains(&format!("interrupted by {signal}")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&history.display().to_string()),
        "the history's path is printed: {stderr}"
    );
}

#[test]
fn chaos_etcd_sigint_removes_every_part_of_the_run_and_exits_130() {
    interrupted_run_leaves_nothing(Signal::SIGINT, 130);
}

#[test]
fn chaos_etcd_sigterm_removes_every_part_of_the_run_and_exits_143() {
    interrupted_run_leaves_nothing(Signal::SIGTERM, 143);
}

#[test]
fn chaos_without_the_privilege_fails_at_once_naming_it_and_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");
    // As user nobody: no capabilities at all.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_palisade"))
        .args(["chaos", "--seed", "1", "--duration", "1s", "--history"])
        .arg(&history)
        .env("TMPDIR", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for needed in ["CAP_NET_ADMIN", "CAP_SYS_ADMIN", "--loopback"] {
        assert!(stderr.contains(needed), "{needed} in {stderr}");
    }
    // Before anything was made: no history, no run directory.
    assert!(!history.exists());
    assert_eq!(listing(dir.path().to_str().unwrap()), BTreeSet::new());
}

/// `chaos check` on a history with no entries (an empty file, or blank lines) says there
/// is nothing to check, exit 2, rather than reporting no violations.
#[test]
fn chaos_check_refuses_a_history_without_entries() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [("empty.jsonl", ""), ("blank.jsonl", "\n\n")] {
        let history = dir.path().join(name);
        std::fs::write(&history, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["chaos", "check"])
            .arg(&history)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert_eq!(
            stderr,
            format!(
                "palisade: {} holds no history entries: nothing to check\n",
                history.display()
            )
        );
        assert!(out.stdout.is_empty(), "{name}");
    }
}
