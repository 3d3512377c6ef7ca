//! The checker on a generated history of about a million entries, in memory and streamed
//! from JSON lines. Run with `cargo bench -p palisade-chaos --bench check`.

// criterion's macros define undocumented public functions.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use palisade_chaos::check::{check, check_reader};
use palisade_chaos::history::write_entry;

#[path = "../tests/check/model.rs"]
mod model;

fn million(c: &mut Criterion) {
    let history = model::random_history(42, 16, 8, 720_000);
    let mut lines = Vec::new();
    for e in &history {
        write_entry(&mut lines, e).unwrap();
    }
    assert!(check(&history).is_ok());
    let mut group = c.benchmark_group("check");
    group.sample_size(10);
    group.throughput(Throughput::Elements(history.len() as u64));
    group.bench_function(format!("in_memory_{}_entries", history.len()), |b| {
        b.iter(|| check(&history))
    });
    group.bench_function(
        format!(
            "streamed_{}_entries_{}_mb",
            history.len(),
            lines.len() >> 20
        ),
        |b| b.iter(|| check_reader(&lines[..]).unwrap()),
    );
    group.finish();
}

criterion_group!(benches, million);
criterion_main!(benches);
