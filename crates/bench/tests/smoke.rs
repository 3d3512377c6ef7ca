//! Every bench subcommand at a tiny size, through the built binary: the tables have the
//! rows they promise and the numbers that must hold at any size do. So the benches
//! cannot rot unnoticed. The lock bench starts etcd, hence `etcd` in its test's name.

use std::process::Command;

/// Runs `palisade-bench <args>` and returns its tables: (title, rows of cells).
fn bench(args: &[&str]) -> Vec<(String, Vec<Vec<String>>)> {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade-bench"))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{args:?} failed:\n{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut tables: Vec<(String, Vec<Vec<String>>)> = Vec::new();
    for line in stdout.lines() {
        if let Some(title) = line.strip_prefix("### ") {
            tables.push((title.to_owned(), Vec::new()));
        } else if line.starts_with("| ") {
            let cells: Vec<String> = line
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect();
            tables
                .last_mut()
                .expect("a row before any title")
                .1
                .push(cells);
        }
    }
    // Drop each table's header row (the separator line starts with "|-", not "| ").
    for t in &mut tables {
        assert!(!t.1.is_empty(), "table {:?} has no header", t.0);
        t.1.remove(0);
    }
    tables
}

fn num(cell: &str) -> f64 {
    cell.trim_end_matches('x')
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {cell:?}"))
}

#[test]
fn pg_bench_prints_every_variant_at_every_client_count_and_writes_per_token() {
    let tables = bench(&[
        "pg",
        "--clients",
        "1,2",
        "--writes-per-token",
        "1,4",
        "--rows",
        "20",
        "--secs",
        "0.1",
        "--rounds",
        "2",
        "--cpu-writes",
        "50",
    ]);
    assert_eq!(tables.len(), 2);
    let rows = &tables[0].1;
    let variants = [
        "plain UPDATE",
        "fenced_transaction",
        "fenced_execute",
        "PreparedFence",
        "FencedUpdate (folded)",
        "PreparedFencedUpdate (folded)",
        "BEGIN + UPDATE + COMMIT (no check)",
        "BEGIN + UPDATE + COMMIT pipelined (no check)",
    ];
    assert_eq!(rows.len(), 2 * 2 * variants.len());
    for (i, r) in rows.iter().enumerate() {
        let cell = i / variants.len();
        assert_eq!(r[0], ["1", "2"][cell % 2], "{r:?}");
        assert_eq!(r[1], ["1", "4"][cell / 2], "{r:?}");
        assert_eq!(r[2], variants[i % variants.len()]);
        assert!(num(&r[3]) > 0.0, "no writes: {r:?}");
        assert!(num(&r[4]) <= num(&r[5]), "p50 above p99: {r:?}");
        if i % variants.len() == 0 {
            assert_eq!(r[6], "1.00x", "plain is its own base");
        }
    }
    // The server-CPU table: every variant and the plain-SQL raise at each writes-per-token,
    // a number each (10 ms ticks: 50 writes may read as 0).
    let cpu = &tables[1].1;
    let names: Vec<(&str, &str)> = cpu.iter().map(|r| (r[0].as_str(), r[1].as_str())).collect();
    let cpu_variants: Vec<&str> = variants
        .iter()
        .copied()
        .chain(["PreparedFence, plain-SQL raise (bench only)"])
        .collect();
    let expected: Vec<(&str, &str)> = ["1", "4"]
        .iter()
        .flat_map(|n| cpu_variants.iter().map(move |v| (*n, *v)))
        .collect();
    assert_eq!(names, expected);
    for r in cpu {
        assert!(num(&r[2]) >= 0.0, "{r:?}");
    }
}

#[test]
fn fence_proxy_bench_prints_the_upstream_nginx_and_both_stores() {
    let tables = bench(&[
        "fence-proxy",
        "--connections",
        "2",
        "--resources",
        "2",
        "--secs",
        "0.1",
        "--rounds",
        "2",
    ]);
    let rows = &tables[0].1;
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        names,
        [
            "upstream, direct",
            "nginx proxy_pass",
            "palisade fence proxy + MemoryStore",
            "palisade fence proxy + PostgresStore"
        ]
    );
    for r in rows {
        // Every variant's writes were answered 200 (a refusal fails the bench).
        assert!(num(&r[1]) > 0.0, "no requests answered 200: {r:?}");
    }
    assert_eq!(
        (rows[1][4].as_str(), rows[1][5].as_str()),
        ("1.00x", "1.00x")
    );
}

#[test]
fn fence_layer_bench_prints_bare_memory_and_postgres_pooled_single_and_prepared() {
    let tables = bench(&[
        "fence-layer",
        "--connections",
        "2",
        "--resources",
        "2",
        "--secs",
        "0.1",
        "--rounds",
        "2",
    ]);
    let rows = &tables[0].1;
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        names,
        [
            "bare axum",
            "FenceLayer + MemoryStore",
            "FenceLayer + PostgresStore (pool)",
            "FenceLayer + PostgresStore (1 connection)",
            "FenceLayer + PostgresStore (pool, prepared statements)"
        ]
    );
    for r in rows {
        assert!(num(&r[1]) > 0.0, "no requests answered 200: {r:?}");
    }
    assert_eq!(rows[0][4], "1.00x");
    // The Postgres stores' mean batch: at least one raise per batch sent.
    assert_eq!((rows[0][6].as_str(), rows[1][6].as_str()), ("", ""));
    for r in &rows[2..] {
        assert!(num(&r[6]) >= 1.0, "raises per batch: {r:?}");
    }
}

#[test]
fn memory_store_bench_measures_every_structure_and_decides_raises_right() {
    let tables = bench(&["memory-store", "--resources", "2000", "--ops", "1000"]);
    assert_eq!(tables.len(), 2);
    let structures: Vec<&str> = tables[0].1.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        structures,
        [
            "MemoryStore",
            "moka Cache<u64, u64>",
            "HashMap<Box<str>, u64>",
            "HashMap<u64, u64>"
        ]
    );
    for r in &tables[0].1 {
        num(&r[1]);
    }
    let raises = &tables[1].1;
    assert_eq!(raises.len(), 3);
    // Equal and newer tokens are always admitted, older ones never (no eviction here).
    assert_eq!(raises[0][3], "1000/1000");
    assert_eq!(raises[1][3], "1000/1000");
    assert_eq!(raises[2][3], "0/1000");
    assert!(raises.iter().all(|r| num(&r[1]) > 0.0));
}

#[test]
fn lock_bench_on_etcd_counts_the_round_trips_of_each_lock() {
    let tables = bench(&[
        "lock",
        "--members",
        "1,3",
        "--held",
        "0,3",
        "--clients",
        "2",
        "--keys",
        "1,3",
        "--secs",
        "0.2",
        "--rounds",
        "1",
    ]);
    // The title names the etcd release the members ran (`PALISADE_ETCD` or `PATH`).
    let version = palisade_testkit::EtcdBinaries::get().version().to_string();
    assert!(
        tables[0].0.starts_with(&format!(
            "Lock cycle (acquire + release) on etcd {version}, "
        )),
        "{}",
        tables[0].0
    );
    let rows = &tables[0].1;
    let variants = [
        "Palisade core",
        "Palisade core, epoch record in memory (diagnosis)",
        "etcd v3lock",
        "mutex recipe",
        "raw Txn",
    ];
    assert_eq!(
        rows.len(),
        2 * 2 * 2 * variants.len(),
        "members x held x keys x variants"
    );
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[4], variants[i % variants.len()]);
        assert!(num(&r[5]) > 0.0, "no cycles: {r:?}");
        let rpcs = num(&r[8]);
        match r[4].as_str() {
            // etcd counts the calls it served: a raw Txn is one, v3lock is Lock + Unlock.
            "raw Txn" => assert_eq!(rpcs, 1.0, "{r:?}"),
            "etcd v3lock" => assert_eq!(rpcs, 2.0, "{r:?}"),
            // Uncontended: one Txn to grant, one to release; waiting adds reads.
            _ => assert!(rpcs >= 2.0, "{r:?}"),
        }
        // etcd did work for every variant; its CPU per cycle is a number.
        assert!(num(&r[9]) >= 0.0 && num(&r[10]) >= 0.0, "{r:?}");
    }
    for members in ["1", "3"] {
        for held in ["0", "3"] {
            let n = rows
                .iter()
                .filter(|r| r[0] == members && r[1] == held)
                .count();
            assert_eq!(n, 2 * variants.len(), "{members} members, {held} held");
        }
    }
}

#[test]
fn audit_bench_times_every_dashboard_url_and_each_answers_rows() {
    let tables = bench(&["audit", "--events", "5000", "--requests", "3"]);
    let rows = &tables[0].1;
    let urls: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        urls,
        [
            "`/`",
            "`/?range=7d`",
            "`/api/overview`",
            "`/api/overview?range=7d`",
            "`/refused`",
            "`/unprotected`",
            "`/api/unprotected`",
            "`/api/unprotected?service=svc-5`",
            "`/api/unprotected?resource=orders%2F4240`",
            "`/api/unprotected/hourly`"
        ]
    );
    for r in rows {
        assert!(
            num(&r[1]) <= num(&r[2]) && num(&r[2]) <= num(&r[3]),
            "quantiles out of order: {r:?}"
        );
        // Every URL matches unprotected rows: an empty JSON page is `{"rows":[],...}`.
        assert!(num(&r[4]) > 200.0, "{r:?} answered almost nothing");
    }
}

#[test]
fn service_bench_on_etcd_compares_mtls_with_the_core() {
    let tables = bench(&[
        "service",
        "--clients",
        "1,2",
        "--secs",
        "0.2",
        "--rounds",
        "1",
    ]);
    let rows = &tables[0].1;
    let cells: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r[0].as_str(), r[1].as_str()))
        .collect();
    assert_eq!(
        cells,
        [
            ("1", "core in process"),
            ("1", "service over HTTP + mTLS"),
            ("2", "core in process"),
            ("2", "service over HTTP + mTLS"),
        ]
    );
    for r in rows {
        assert!(num(&r[2]) > 0.0, "no cycles: {r:?}");
        assert!(num(&r[3]) > 0.0 && num(&r[3]) <= num(&r[4]), "{r:?}");
    }
    assert_eq!(rows[0][5], "-");
    num(&rows[1][5]);
}

#[test]
fn fence_redis_bench_prints_plain_set_and_each_fenced_set_at_every_client_count() {
    let tables = bench(&[
        "fence-redis",
        "--clients",
        "1,2",
        "--secs",
        "0.1",
        "--rounds",
        "2",
        "--cpu-writes",
        "50",
    ]);
    assert_eq!(tables.len(), 2);
    let rows = &tables[0].1;
    let variants = [
        "plain SET",
        "fenced_set (FCALL), equal token",
        "fenced_set (FCALL), new token each write",
        "fenced_set (EVALSHA fallback), equal token",
    ];
    assert_eq!(rows.len(), 2 * variants.len());
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[0], ["1", "2"][i / variants.len()], "{r:?}");
        assert_eq!(r[1], variants[i % variants.len()], "{r:?}");
        // Every fenced write was admitted (a refusal fails the bench).
        assert!(num(&r[2]) > 0.0, "no writes: {r:?}");
        assert!(num(&r[3]) <= num(&r[4]), "p50 above p99: {r:?}");
        assert!(num(&r[5]) > 0.0, "{r:?}");
    }
    assert_eq!(rows[0][5], "1.00x", "plain SET is its own base");
    assert_eq!(rows[1][6], ">= 0.8x");
    // The server-time table: every variant, the command it sends, a time each.
    let cpu = &tables[1].1;
    let names: Vec<(&str, &str)> = cpu.iter().map(|r| (r[0].as_str(), r[1].as_str())).collect();
    assert_eq!(
        names,
        [
            (variants[0], "SET"),
            (variants[1], "FCALL"),
            (variants[2], "FCALL"),
            (variants[3], "EVALSHA")
        ]
    );
    for r in cpu {
        assert!(num(&r[2]) > 0.0, "{r:?}");
    }
    assert_eq!(cpu[0][3], "1.00x");
}

#[test]
fn fence_mysql_bench_prints_each_variant_against_its_base_at_every_client_count() {
    let tables = bench(&[
        "fence-mysql",
        "--clients",
        "1,2",
        "--rows",
        "20",
        "--secs",
        "0.1",
        "--rounds",
        "2",
    ]);
    assert_eq!(tables.len(), 1);
    let rows = &tables[0].1;
    let variants = [
        ("plain UPDATE", "plain UPDATE"),
        ("FencedUpdate (folded)", "plain UPDATE"),
        (
            "BEGIN + UPDATE + COMMIT (no check)",
            "BEGIN + UPDATE + COMMIT (no check)",
        ),
        (
            "BEGIN + fence_raise + UPDATE + COMMIT",
            "BEGIN + UPDATE + COMMIT (no check)",
        ),
    ];
    assert_eq!(rows.len(), 2 * variants.len());
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[0], ["1", "2"][i / variants.len()], "{r:?}");
        let (variant, base) = variants[i % variants.len()];
        assert_eq!((r[1].as_str(), r[6].as_str()), (variant, base), "{r:?}");
        assert!(num(&r[2]) > 0.0, "no writes: {r:?}");
        assert!(num(&r[3]) <= num(&r[4]), "p50 above p99: {r:?}");
        if variant == base {
            assert_eq!(r[5], "1.00x", "a base is its own base");
        } else {
            assert!(num(&r[5]) > 0.0, "{r:?}");
        }
    }
}
