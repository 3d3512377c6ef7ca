//! The `palisade` binary, run as a user runs it.

use std::process::Command;

fn palisade(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .output()
        .expect("run palisade");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn token_compose_and_inspect_round_trip() {
    let (code, out, _) = palisade(&["token", "compose", "--epoch", "2", "--revision", "1234"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), (2u64 * (1 << 48) + 1234).to_string());
    let (code, out, _) = palisade(&["token", "inspect", out.trim()]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        format!(
            "token {}\nepoch 2\nrevision 1234\n",
            2u64 * (1 << 48) + 1234
        )
    );
}

#[test]
fn malformed_token_is_a_clear_error_not_a_panic() {
    let (code, out, err) = palisade(&["token", "inspect", "+12"]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert!(err.contains("invalid byte 0x2b at position 0"), "{err}");
    // The flag's own range is the epoch's: 32767 is the last, nothing above parses.
    let (code, out, _) = palisade(&["token", "compose", "--epoch", "32767", "--revision", "1"]);
    assert_eq!(
        (code, out.trim()),
        (0, ((32767u64 << 48) + 1).to_string().as_str())
    );
    for epoch in ["32768", "65535"] {
        let (code, _, err) = palisade(&["token", "compose", "--epoch", epoch, "--revision", "1"]);
        assert_eq!(code, 2);
        assert!(
            err.contains(&format!("{epoch} is not in 0..=32767")),
            "{err}"
        );
    }
}

/// Runs `palisade args` with its stdout a pipe whose reader has already gone.
fn palisade_into_closed_pipe(args: &[&str]) -> (i32, String) {
    // The read end is closed before the child starts, so its first write fails with EPIPE
    // whatever the timing (closing it after spawn raced the child's write).
    let (reader, writer) = nix::unistd::pipe().expect("a pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .stdout(std::process::Stdio::from(writer))
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run palisade");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_stdout_is_an_error_not_a_panic() {
    let (code, err) = palisade_into_closed_pipe(&["token", "inspect", "5"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot write to stdout") && err.contains("Broken pipe"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // Help too: clap's own output goes through the same check.
    let (code, err) = palisade_into_closed_pipe(&["--help"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot write to stdout") && err.contains("Broken pipe"),
        "{err}"
    );
}

#[test]
fn a_ttl_is_checked_in_whole_seconds_before_anything_is_sent() {
    for cmd in [
        &["lock", "run", "ns/c/k", "--ttl", "0", "--", "true"][..],
        &["lock", "acquire", "ns/c/k", "--ttl", "0"][..],
        &["session", "open", "--ttl", "0"][..],
    ] {
        let (code, _, err) = palisade(cmd);
        assert_eq!(code, 2, "{cmd:?}: {err}");
        assert!(
            err.contains("session TTL 0 s is not a whole number of seconds from 1 to 3600 s"),
            "{cmd:?}: {err}"
        );
    }
}

/// `GET path` over HTTP/1.0; the status line and the body.
fn http_get(addr: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the dashboard");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .expect("a complete response");
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

#[test]
fn audit_serve_migrates_and_serves_the_dashboard() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = rt.block_on(palisade_testkit::TestDb::create());
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "audit",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database",
            &db.connection_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run palisade audit serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("palisade audit dashboard on http://")
        .and_then(|rest| rest.strip_suffix('/'))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let (status, body) = http_get(&addr, "/api/force-releases");
    let (page_status, page) = http_get(&addr, "/unprotected");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(status, "HTTP/1.0 200 OK");
    assert_eq!(
        body, r#"{"force_releases":[]}"#,
        "the schema was applied at start"
    );
    assert_eq!(page_status, "HTTP/1.0 200 OK");
    assert!(page.contains("No unprotected writes match."));
}

#[test]
fn audit_serve_with_an_unreachable_database_exits_with_the_reason() {
    let (code, out, err) = palisade(&[
        "audit",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--database",
        "host=127.0.0.1 port=1 user=x connect_timeout=2",
    ]);
    // 1: a failure that is not bad input.
    assert_eq!(code, 1);
    assert!(out.is_empty(), "{out}");
    assert!(err.starts_with("palisade: audit database"), "{err}");
}

/// A lock service that does not answer is named with the cause.
#[test]
fn an_unreachable_service_is_named_in_the_error() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", free.local_addr().unwrap());
    drop(free);
    let (code, out, err) = palisade(&[
        "lock",
        "status",
        "orders/jobs/k",
        "--service",
        &url,
        "--dev-identity",
        "spiffe://acme/ops/alice",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.starts_with(&format!(
            "palisade: no answer from the lock service at {url}: "
        )),
        "{err}"
    );
    assert!(err.contains("refused"), "{err}");
}

/// A `--service` that answers with something other than a problem document (here 404 with
/// an empty body, then an HTML page) is named, with what it sent, instead of an empty
/// "decode" detail.
#[test]
fn a_service_url_that_is_no_lock_service_is_named_with_what_it_sent() {
    use std::io::{Read, Write};
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", server.local_addr().unwrap());
    let bodies = ["", "<html><body>Not Found</body></html>"];
    let answering = std::thread::spawn(move || {
        for body in bodies {
            let (mut conn, _) = server.accept().unwrap();
            let mut request = [0u8; 4096];
            let _ = conn.read(&mut request).unwrap();
            write!(
                conn,
                "HTTP/1.1 404 Not Found\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
        }
    });
    let status = || {
        Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["lock", "status", "orders/jobs/k", "--service", &url])
            .env("PALISADE_DEV_IDENTITY", "spiffe://acme/ops/alice")
            .output()
            .unwrap()
    };
    let empty = status();
    let html = status();
    answering.join().unwrap();
    let empty = String::from_utf8_lossy(&empty.stderr).into_owned();
    let html = String::from_utf8_lossy(&html.stderr).into_owned();
    assert!(
        empty.contains(&format!(
            "answered 404 decode: {url} sent no problem document (an empty body): \
             is it a Palisade lock service?"
        )),
        "{empty}"
    );
    assert!(
        html.contains(r#"It sent "<html><body>Not Found</body></html>""#),
        "{html}"
    );
}

/// A dev identity that is no SPIFFE ID (an empty `PALISADE_DEV_IDENTITY`, say) is bad
/// input, refused before anything is sent.
#[test]
fn an_empty_or_malformed_dev_identity_is_bad_input() {
    for id in ["", "alice"] {
        let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["lock", "status", "orders/jobs/k"])
            .args(["--service", "http://127.0.0.1:1"])
            .env("PALISADE_DEV_IDENTITY", id)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{id:?}: {err}");
        assert!(
            err.starts_with(&format!(
                "palisade: --dev-identity {id:?} (or PALISADE_DEV_IDENTITY) is no SPIFFE ID: "
            )),
            "{id:?}: {err}"
        );
    }
}

/// A `--service` with a path or a query (`.../v1`) is bad input naming the URL, refused
/// before anything is sent; it used to reach `/v1/v1/...` and exit 3 "no such route".
#[test]
fn a_service_url_with_a_path_or_query_is_bad_input() {
    for url in [
        "http://127.0.0.1:1/v1",
        "http://127.0.0.1:1/prefix/",
        "http://127.0.0.1:1?x=1",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["lock", "status", "orders/jobs/k", "--service", url])
            .args(["--dev-identity", "spiffe://acme/a"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {err}");
        assert!(
            err.contains(&format!("lock service URL {url:?} is not a base URL")),
            "{url}: {err}"
        );
    }
    // A trailing `/` alone is a base URL (the connection is refused, exit 1).
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "lock",
            "status",
            "orders/jobs/k",
            "--service",
            "http://127.0.0.1:1/",
        ])
        .args(["--dev-identity", "spiffe://acme/a"])
        .output()
        .unwrap();
    assert_ne!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A dashboard address already taken is named in the error.
#[test]
fn audit_serve_on_a_taken_address_names_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = rt.block_on(palisade_testkit::TestDb::create());
    let (code, out, err) = palisade(&[
        "audit",
        "serve",
        "--listen",
        &addr,
        "--database",
        &db.connection_string(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.starts_with(&format!("palisade: cannot listen on {addr}: ")),
        "{err}"
    );
    assert!(err.contains("in use"), "{err}");
}

/// `palisade serve` in dev mode on `listen`, with an etcd endpoint nothing answers on.
fn serve_on_no_etcd(listen: &str, epoch_file: &std::path::Path) -> (i32, String, String) {
    palisade(&[
        "serve",
        "--etcd",
        "http://127.0.0.1:1",
        "--insecure-dev-identity",
        "--listen",
        listen,
        "--config",
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/authz.toml"),
        "--epoch-file",
        epoch_file.to_str().unwrap(),
    ])
}

/// `serve` on a taken address says so before it contacts etcd (here an endpoint nothing
/// answers on) or writes anything: no epoch file is created.
#[test]
fn serve_on_a_taken_address_names_it_before_contacting_etcd() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let epoch = dir.path().join("epoch.json");
    let (code, _, err) = serve_on_no_etcd(&addr, &epoch);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("cannot listen on {addr}: ")) && err.contains("in use"),
        "{err}"
    );
    assert!(!epoch.exists(), "the epoch file was written");
}

/// An epoch file in a directory that does not exist is bad input, named before etcd is
/// contacted (here an endpoint nothing answers on).
#[test]
fn serve_with_an_epoch_file_in_a_missing_directory_names_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("gone");
    let epoch = missing.join("epoch.json");
    let (code, _, err) = serve_on_no_etcd("127.0.0.1:0", &epoch);
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "palisade: --epoch-file {}: its directory {} does not exist",
            epoch.display(),
            missing.display()
        )
    );
}

#[test]
fn serve_help_shows_the_config_format_and_the_sample_config_loads() {
    let (code, out, _) = palisade(&["serve", "--help"]);
    assert_eq!(code, 0);
    for line in ["[[namespace.grant]]", "classes = [", "examples/authz.toml"] {
        assert!(out.contains(line), "{line}: {out}");
    }
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/authz.toml");
    let authz = palisade_server::Authz::load(sample).expect("examples/authz.toml loads");
    let config = authz.current();
    let id = |s: &str| palisade_api::SpiffeId::new(s).unwrap();
    // What the README's first steps rely on.
    assert!(config.is_admin(&id("spiffe://example.org/ops/alice")));
    assert!(config.may_lock("orders", "jobs", &id("spiffe://example.org/ops/alice")));
    assert!(config.may_lock(
        "orders",
        "invoices",
        &id("spiffe://example.org/orders/nightly")
    ));
    assert!(!config.may_lock("orders", "jobs", &id("spiffe://acme/nightly")));
}
