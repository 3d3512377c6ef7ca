//! schemathesis against the service's own OpenAPI document: generated requests (valid
//! and invalid by the schemas) to every route of a dev-mode replica on real etcd, with
//! force release on a real PostgreSQL, from a caller that administers everything, so
//! they reach the handlers. No answer may be a 5xx, and every answer must be what the
//! document says (status, content type, headers, body schema), and a request the schemas
//! refuse must be refused (negative data rejection). The phases are examples, coverage
//! (the schemas' boundaries), fuzzing and stateful (request sequences along the links
//! schemathesis infers from the document). The run takes about a minute on two idle
//! cores.
//!
//! To look further, run it with another seed or more examples:
//! `PALISADE_SCHEMATHESIS_SEED=7 PALISADE_SCHEMATHESIS_MAX_EXAMPLES=500 cargo nextest run
//! -p palisade-server --all-features --test service etcd_schemathesis --no-capture`.
//!
//! schemathesis is installed by `scripts/lib/setup.sh` into a virtual environment
//! outside the clone; `PALISADE_SCHEMATHESIS` names its command. The test fails, and
//! says how to install it, when it is missing.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_server::{Authz, AuthzConfig, ForceReleases, ServiceOptions, DEV_IDENTITY_HEADER};
use palisade_testkit::TestDb;
use serde_json::Value;

use super::{fixture_with_timeout, pool_of, start_replica, Recorded};

/// The version `scripts/lib/setup.sh` installs (`PALISADE_SCHEMATHESIS_VERSION`).
const VERSION: &str = "4.32.5";

/// Test cases per operation and phase (15 operations; the document itself is not
/// tested); `PALISADE_SCHEMATHESIS_MAX_EXAMPLES` picks another count.
const MAX_EXAMPLES: &str = "250";

/// Fixed, so that a run is repeatable; `PALISADE_SCHEMATHESIS_SEED` picks another.
const SEED: &str = "18";

/// Everything the document says about answers, on top of "no 5xx".
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
response_headers_conformance,response_schema_conformance,negative_data_rejection";

/// The caller of every generated request: a service admin, so also an admin of every
/// namespace, and granted every class of `ns`.
const CALLER: &str = "spiffe://test/ops";

const AUTHZ: &str = r#"
admins = ["spiffe://test/ops"]
[[namespace]]
id = "ns"
[[namespace.grant]]
ids = ["spiffe://test/"]
classes = ["*"]
"#;

/// The schemathesis command: `PALISADE_SCHEMATHESIS`, else where `scripts/lib/setup.sh`
/// puts it.
fn command() -> PathBuf {
    if let Some(p) = std::env::var_os("PALISADE_SCHEMATHESIS") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME is set");
    cache.join("palisade-venv/bin/schemathesis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_schemathesis_finds_no_5xx_and_answers_match_the_document() {
    let st = command();
    let version = std::process::Command::new(&st).arg("--version").output();
    let version = match version {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        other => panic!(
            "schemathesis {VERSION} is needed at {} ({other:?}): run scripts/test, or \
             `. scripts/lib/setup.sh && palisade_install_schemathesis`",
            st.display()
        ),
    };
    assert!(
        version.contains(VERSION),
        "schemathesis {VERSION} is needed, {} is {version}: run scripts/test, or \
         `. scripts/lib/setup.sh && palisade_install_schemathesis`",
        st.display()
    );

    // A generous etcd request timeout: the run is about input, not about a loaded
    // machine's slow fsync running out an operation's time budget.
    let f = fixture_with_timeout(0, Duration::from_secs(5)).await;
    let db = TestDb::create().await;
    let force = ForceReleases::new(pool_of(&db), Arc::new(Recorded::default()));
    force.migrate().await.unwrap();
    let options = ServiceOptions::new(Authz::fixed(AuthzConfig::from_toml(AUTHZ).unwrap()))
        .insecure_dev_identity()
        .with_force_releases(force);
    let addr = start_replica(f.connect().await.unwrap(), options)
        .await
        .addr;

    let reports = tempfile::tempdir().unwrap();
    let har = reports.path().join("run.har");
    let seed = std::env::var("PALISADE_SCHEMATHESIS_SEED").unwrap_or_else(|_| SEED.to_owned());
    let max_examples = std::env::var("PALISADE_SCHEMATHESIS_MAX_EXAMPLES")
        .unwrap_or_else(|_| MAX_EXAMPLES.to_owned());
    let started = Instant::now();
    let child = tokio::process::Command::new(&st)
        .arg("run")
        .arg(format!("http://{addr}/v1/openapi.json"))
        .args(["--header", &format!("{DEV_IDENTITY_HEADER}: {CALLER}")])
        .args(["--generation-with-security-parameters", "false"])
        .args(["--checks", CHECKS])
        .args(["--max-examples", &max_examples])
        .args(["--seed", &seed])
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        // One worker: schemathesis's generators (hypothesis) parse Python source with
        // `ast.parse`, and CPython 3.11 (Debian 12's) fails that now and then with
        // "SystemError: AST constructor recursion depth mismatch" when two threads do
        // it at once, which the run reports as an error.
        .args(["--workers", "1"])
        .args(["--request-timeout", "90"])
        .args(["--generation-database", "none"])
        .args(["--report", "har"])
        .arg("--report-har-path")
        .arg(&har)
        .arg("--no-color")
        .current_dir(reports.path())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), child)
        .await
        .expect("schemathesis ran for over 10 minutes")
        .unwrap();
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("schemathesis (seed {seed}) ran for {elapsed:?}:\n{stdout}\n{stderr}");

    // Every answer it got, from its HAR record.
    let har: Value = serde_json::from_slice(&std::fs::read(&har).unwrap()).unwrap();
    let entries = har["log"]["entries"].as_array().unwrap();
    let mut server_errors = Vec::new();
    for e in entries {
        let status = e["response"]["status"].as_u64().unwrap();
        let method = e["request"]["method"].as_str().unwrap();
        let url = e["request"]["url"].as_str().unwrap();
        if status >= 500 {
            server_errors.push(format!("{status} {method} {url}"));
        }
    }
    assert!(
        server_errors.is_empty(),
        "5xx answers: {server_errors:#?}\n{stdout}"
    );
    assert!(
        out.status.success(),
        "schemathesis failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        entries.len() >= 16 * 20,
        "only {} requests were sent:\n{stdout}",
        entries.len()
    );
}
