//! The dashboard in real headless Chromium over a seeded database.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use crate::common::migrated_db;
use crate::dashboard::{seed, EVIL};

/// Where screenshots go: `test-artifacts/` in the target directory.
fn artifacts() -> PathBuf {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp
        .parent()
        .expect("the target directory")
        .join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser"] {
        if let Some(path) = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join(name))
                .find(|p| p.is_file())
        }) {
            return path;
        }
    }
    panic!("chromium is not installed: run scripts/test, which installs Debian's chromium package");
}

/// Runs headless Chromium with `args` then `url`, returning stdout.
async fn run_chromium(profile: &std::path::Path, args: &[&str], url: &str) -> String {
    let mut cmd = tokio::process::Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .arg(url)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .expect("chromium finished within 90 s")
        .expect("chromium ran");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn chromium_renders_the_rows_and_the_chart() {
    let (_db, pool) = migrated_db().await;
    let rows = seed(&pool, SystemTime::now()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, palisade_audit::dashboard::router(pool)).await
    });
    let profile = tempfile::tempdir().unwrap();
    let url = format!("http://{addr}/unprotected");

    let dom = run_chromium(profile.path(), &["--dump-dom"], &url).await;
    assert_eq!(
        dom.matches("<tr>").count(),
        rows.len() + 1,
        "a header row and one row per unprotected write"
    );
    assert!(dom.contains("<svg"), "the chart is in the DOM");
    assert_eq!(dom.matches("class=\"bar\"").count(), 25, "a bar per hour");
    assert!(
        !dom.contains(EVIL) && dom.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "rendered as text, not run"
    );
    assert!(dom.contains("/legacy/ledger") && dom.contains("spiffe://td/billing"));

    let shot = artifacts().join("audit-dashboard-unprotected.png");
    let _ = std::fs::remove_file(&shot);
    run_chromium(
        profile.path(),
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1280,900",
        ],
        &url,
    )
    .await;
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(
        png.len() > 10_000 && png.starts_with(b"\x89PNG"),
        "a real PNG, {} bytes",
        png.len()
    );

    let timeline = artifacts().join("audit-dashboard-lock-timeline.png");
    let key_url = format!("http://{addr}/locks?key=%2Fpalisade%2Fshop%2Forders%2F42");
    let dom = run_chromium(profile.path(), &["--dump-dom"], &key_url).await;
    assert!(dom.contains("kind-force") && dom.contains("spiffe://td/lead-bob"));
    run_chromium(
        profile.path(),
        &[
            &format!("--screenshot={}", timeline.display()),
            "--window-size=1280,900",
        ],
        &key_url,
    )
    .await;
    assert!(std::fs::metadata(&timeline).unwrap().len() > 10_000);
    server.abort();
}
