//! The dashboard in real headless Chromium over a seeded database.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use crate::common::migrated_db;
use crate::dashboard::{seed, EVIL, KEY};

/// Where screenshots go: `$PALISADE_TEST_ARTIFACTS` when set, else `test-artifacts/` in
/// the target directory. The path is printed.
fn artifacts() -> PathBuf {
    let dir = match std::env::var_os("PALISADE_TEST_ARTIFACTS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .expect("the target directory")
            .join("test-artifacts"),
    };
    std::fs::create_dir_all(&dir).unwrap();
    println!("screenshots in {}", dir.display());
    dir
}

/// Takes a 1280x900 screenshot of `url` into `name` under [`artifacts`].
async fn screenshot(profile: &std::path::Path, url: &str, name: &str) {
    let shot = artifacts().join(name);
    let _ = std::fs::remove_file(&shot);
    run_chromium(
        profile,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1280,900",
        ],
        url,
    )
    .await;
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(
        png.len() > 10_000 && png.starts_with(b"\x89PNG"),
        "a real PNG, {} bytes",
        png.len()
    );
    println!("screenshot {}", shot.display());
}

/// The text of the element with `id` in a dumped DOM (its first text run).
fn text_of(dom: &str, id: &str) -> String {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element {id}"));
    let rest = &dom[at..];
    let start = rest.find('>').unwrap() + 1;
    let rest = &rest[start..];
    let rest = rest
        .strip_prefix("<a ")
        .map_or(rest, |r| &r[r.find('>').unwrap() + 1..]);
    rest[..rest.find('<').unwrap()].to_owned()
}

/// The number in the tile `id`.
fn tile(dom: &str, id: &str) -> i64 {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no tile {id}"));
    let value = &dom[at..];
    let marker = "class=\"value\">";
    let value = &value[value.find(marker).unwrap() + marker.len()..];
    let value = value
        .strip_prefix("<a ")
        .map_or(value, |r| &r[r.find('>').unwrap() + 1..]);
    value[..value.find('<').unwrap()]
        .parse()
        .unwrap_or_else(|e| panic!("{id}: {e}: {value:.80}"))
}

async fn one(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn chromium_renders_the_overview_refused_writes_and_timeline_with_the_databases_numbers() {
    let (db, pool) = migrated_db().await;
    let now = SystemTime::now();
    seed(&pool, now).await;
    crate::overview::seed_overview(&pool, now).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = palisade_audit::dashboard::router(pool);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let profile = tempfile::tempdir().unwrap();

    let url = format!("http://{addr}/");
    let dom = run_chromium(profile.path(), &["--dump-dom"], &url).await;
    // What the database says, asked independently of the dashboard's queries.
    let pg = db.connect().await;
    let day = "at >= now() - interval '24 hours'";
    let expect = [
        (
            "tile-unprotected",
            one(&pg, &format!("SELECT count(*) FROM write_event WHERE outcome = 'unprotected' AND {day}")).await,
        ),
        (
            "tile-week",
            one(&pg, "SELECT count(*) FROM write_event WHERE outcome = 'unprotected' AND at >= now() - interval '7 days'").await,
        ),
        (
            "tile-refused",
            one(&pg, &format!("SELECT count(*) FROM write_event WHERE outcome = 'rejected' AND {day}")).await,
        ),
        ("tile-gaps", one(&pg, "SELECT count(*) FROM audit_event WHERE type = 'gap'").await),
        (
            "tile-dropped",
            one(&pg, &format!("SELECT coalesce(sum(dropped), 0)::bigint FROM write_event WHERE outcome = 'dropped' AND {day}")).await,
        ),
    ];
    for (id, n) in expect {
        assert_eq!(tile(&dom, id), n, "{id}");
    }
    assert_eq!(
        text_of(&dom, "unprotected-24h").parse::<i64>().unwrap(),
        expect[0].1
    );
    let stale: i64 = one(&pg, &format!("SELECT count(*) FROM write_event WHERE outcome = 'rejected' AND finding = 'stale' AND {day}")).await;
    assert_eq!(
        text_of(&dom, "refused-stale"),
        format!("stale token: {stale}")
    );
    let top: (Option<String>, i64) = {
        let r = pg
            .query_one(
                &format!("SELECT caller, count(*) FROM write_event WHERE outcome = 'unprotected' AND {day} \
                 GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 1"),
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    let first_caller = &dom[dom.find("id=\"top-callers\"").unwrap()..];
    let first_caller = &first_caller[first_caller.find("<tbody>").unwrap()..];
    let cell = match &top.0 {
        Some(caller) => format!(
            "<tbody><tr><td class=\"mono\"><a href=\"/unprotected?caller={}",
            palisade_encode(caller)
        ),
        None => "<tbody><tr><td class=\"mono\"><span class=\"muted\">(unknown)".to_owned(),
    };
    assert!(
        first_caller.starts_with(&cell),
        "the top caller first: {first_caller:.300}"
    );
    assert!(first_caller.contains(&format!("<td class=\"n\">{}</td>", top.1)));
    assert!(
        dom.contains("class=\"seg seg-"),
        "the stacked chart is drawn"
    );
    screenshot(profile.path(), &url, "audit-dashboard-overview.png").await;

    let url = format!("http://{addr}/refused?range=7d");
    let dom = run_chromium(profile.path(), &["--dump-dom"], &url).await;
    let refused = one(&pg, "SELECT count(*) FROM write_event WHERE outcome = 'rejected' AND at >= now() - interval '7 days'").await;
    assert_eq!(
        dom.matches("<td class=\"reason\">").count() as i64,
        refused,
        "one row per refused write of the week"
    );
    screenshot(profile.path(), &url, "audit-dashboard-refused.png").await;

    let url = format!("http://{addr}/locks?key=shop%2Forders%2F%2Fpalisade%2Fshop%2Forders%2F42");
    let dom = run_chromium(profile.path(), &["--dump-dom"], &url).await;
    let events = one(
        &pg,
        &format!("SELECT count(*) FROM audit_event WHERE lock_key = '{KEY}'"),
    )
    .await;
    let gaps = one(
        &pg,
        "SELECT count(*) FROM audit_event WHERE type = 'gap' AND cluster_id = -8170086329776576179",
    )
    .await;
    assert_eq!(dom.matches("<td class=\"tier\">").count() as i64, events);
    assert_eq!(dom.matches("<tr class=\"gap\">").count() as i64, gaps);
    screenshot(profile.path(), &url, "audit-dashboard-timeline.png").await;
    server.abort();
}

fn palisade_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
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
