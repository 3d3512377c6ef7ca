//! `scripts/lib/setup.sh`'s `palisade_install_etcd35`: fetches Debian unstable's etcd 3.5
//! packages with a private apt configuration, checks their sha256, unpacks them into the
//! cache, and leaves the system's apt configuration and package state as they were.
//! Real apt, real Debian mirror.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::SystemTime;

/// What a system apt change would show in: configuration, lists, caches, dpkg's state.
const SYSTEM_DIRS: [&str; 4] = [
    "/etc/apt",
    "/var/lib/apt",
    "/var/cache/apt",
    "/var/lib/dpkg",
];

fn setup_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lib/setup.sh")
}

/// Every file and directory under `dirs`: its size, modification time and content.
fn tree(dirs: &[&str]) -> BTreeMap<PathBuf, (u64, SystemTime, Vec<u8>)> {
    fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, (u64, SystemTime, Vec<u8>)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let content = if meta.is_file() {
                std::fs::read(&path).unwrap_or_default()
            } else {
                Vec::new()
            };
            out.insert(path.clone(), (meta.len(), modified, content));
            if meta.is_dir() {
                walk(&path, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    for dir in dirs {
        walk(Path::new(dir), &mut out);
    }
    out
}

/// Runs `script` in bash after sourcing setup.sh, with `cache` as XDG_CACHE_HOME.
fn run(cache: &Path, script: &str) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -euo pipefail; . '{}'; {script}",
            setup_sh().display()
        ))
        .env("XDG_CACHE_HOME", cache)
        .output()
        .expect("bash runs")
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn setup_fetches_release_3_5_into_the_cache_leaving_system_apt_unchanged() {
    let cache = tempfile::tempdir().unwrap();
    let before = tree(&SYSTEM_DIRS);
    assert!(
        before.keys().any(|p| p.starts_with("/etc/apt")),
        "no /etc/apt to compare"
    );

    let out = run(
        cache.path(),
        "palisade_install_etcd35; echo \"PALISADE_ETCD35=$PALISADE_ETCD35\"",
    );
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("fetching etcd 3.5.30-2"), "{}", text(&out));
    let root = cache.path().join("palisade-etcd/3.5.30-2");
    let etcd = root.join("usr/bin/etcd");
    assert!(
        stdout.contains(&format!("PALISADE_ETCD35={}", etcd.display())),
        "{}",
        text(&out)
    );
    // The private apt directory is gone; only the unpacked release stays.
    let left: Vec<_> = std::fs::read_dir(cache.path().join("palisade-etcd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["3.5.30-2"]);

    let after = tree(&SYSTEM_DIRS);
    let changed: Vec<_> = before
        .keys()
        .chain(after.keys())
        .filter(|p| before.get(*p) != after.get(*p))
        .collect();
    assert!(
        changed.is_empty(),
        "the system's apt state changed: {changed:?}"
    );

    // The unpacked binaries run here and are the pinned release.
    for (tool, args, expect) in [
        ("etcd", ["--version"], "etcd Version: 3.5.30\n"),
        ("etcdctl", ["version"], "etcdctl version: 3.5.30\n"),
        ("etcdutl", ["version"], "etcdutl version: 3.5.30\n"),
    ] {
        let out = Command::new(root.join("usr/bin").join(tool))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{tool}: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.starts_with(expect), "{tool}: {stdout}");
    }
    let sums = std::fs::read_to_string(root.join("SHA256SUMS")).unwrap();
    assert!(
        sums.contains(
            "etcd-server 3.5.30-2 11a4f7e350c5020b83edff5160a6063d4e56ac9cd014d21ce8916378bf96de79"
        ),
        "{sums}"
    );

    // A second run finds the release in the cache and fetches nothing.
    let out = run(cache.path(), "palisade_install_etcd35");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("fetching"),
        "{}",
        text(&out)
    );
}

#[test]
fn setup_refuses_a_package_whose_sha256_differs() {
    let cache = tempfile::tempdir().unwrap();
    let wrong = "0".repeat(64);
    let out = run(
        cache.path(),
        &format!("PALISADE_ETCD35_SHA256_SERVER={wrong}; palisade_install_etcd35"),
    );
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "etcd-server_3.5.30-2_amd64.deb: sha256 11a4f7e350c5020b83edff5160a6063d4e56ac9cd014d21ce8916378bf96de79, expected {wrong}"
        )),
        "{}",
        text(&out)
    );
    assert!(
        !cache
            .path()
            .join("palisade-etcd/3.5.30-2/usr/bin/etcd")
            .exists(),
        "a package with the wrong sum was unpacked"
    );
}
