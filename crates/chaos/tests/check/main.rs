//! The checker against histories: valid ones pass, and each kind of violation, injected
//! once, is reported as exactly that kind, naming the injected entries.

mod inject;
mod inject_edges;
mod inject_loss;
mod inject_tiers;
mod inject_untold;
mod model;
mod props;
mod reader;
mod scenario;

use std::collections::BTreeSet;

use palisade_chaos::check::{CheckReport, EntryIndex, ViolationKind};

pub(crate) fn kinds(report: &CheckReport) -> BTreeSet<ViolationKind> {
    report.violations.iter().map(|v| v.kind()).collect()
}

/// Every violation is of `kind`, there is at least one, and the violations together name
/// every entry of `named`.
#[track_caller]
pub(crate) fn assert_only(report: &CheckReport, kind: ViolationKind, named: &[usize]) {
    assert!(!report.is_ok(), "expected {kind:?}, got no violation");
    assert_eq!(kinds(report), BTreeSet::from([kind]), "{report}");
    let named_by_report: BTreeSet<EntryIndex> =
        report.violations.iter().flat_map(|v| v.entries()).collect();
    for n in named {
        assert!(
            named_by_report.contains(&EntryIndex(*n)),
            "the report does not name entry {n}:\n{report}"
        );
    }
}
