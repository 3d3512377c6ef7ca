//! The monitoring files in `ops/`: the alerting rules pass `promtool` (syntax, and their
//! unit tests: each alert fires on the series that should fire it and no earlier), and
//! the Grafana dashboard graphs only metrics that are exported.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn ops() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ops")
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(ops())
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool did not run ({e}): run scripts/test, which installs Debian's prometheus package")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// The `palisade_*` metric names in `text`, without the `_bucket` of histograms.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, _) in text.match_indices("palisade_") {
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        names.insert(name.trim_end_matches("_bucket").to_owned());
    }
    names
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let checked = promtool(&["check", "rules", "alerts.yml"]);
    assert!(checked.contains("SUCCESS: 7 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "alerts_test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    let rules = std::fs::read_to_string(ops().join("alerts.yml")).unwrap();
    for alert in [
        "PalisadeUnprotectedWritesRising",
        "PalisadeWritesRefused",
        "PalisadeLockWaitP99High",
        "PalisadeHoldsLost",
        "PalisadeAuditTailerBehind",
    ] {
        assert!(rules.contains(&format!("alert: {alert}")), "{alert}");
    }
}

#[test]
fn the_grafana_dashboard_and_the_rules_use_only_exported_metrics() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(ops().join("grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = String::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push_str(target["expr"].as_str().unwrap());
            exprs.push('\n');
        }
    }
    let used = metric_names(&exprs);
    // What the fence layer exports, from the real exposition.
    let mut exported = metric_names(&palisade_fence::FenceMetrics::new().render());
    // The lock service's (crates/server/src/metrics.rs) and the audit dashboard's
    // (crates/audit/src/dashboard/mod.rs) names, as their sources register them.
    for source in [
        include_str!("../crates/server/src/metrics.rs"),
        include_str!("../crates/audit/src/dashboard/mod.rs"),
    ] {
        for name in metric_names(source) {
            if source.contains(&format!("\"{name}\"")) {
                exported.insert(name);
            }
        }
    }
    let unknown: Vec<_> = used.difference(&exported).collect();
    assert!(unknown.is_empty(), "graphed but not exported: {unknown:?}");
    for needed in [
        "palisade_fence_admitted_total",
        "palisade_fence_refused_total",
        "palisade_fence_unprotected_total",
        "palisade_acquire_wait_seconds",
        "palisade_holds_lost_total",
        "palisade_audit_tailer_behind_revisions",
    ] {
        assert!(used.contains(needed), "{needed} is not graphed");
    }
    let rules = std::fs::read_to_string(ops().join("alerts.yml")).unwrap();
    let unknown: Vec<_> = metric_names(&rules)
        .into_iter()
        .filter(|n| !exported.contains(n))
        .collect();
    assert!(
        unknown.is_empty(),
        "alerted on but not exported: {unknown:?}"
    );
}
