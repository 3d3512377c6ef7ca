//! Recognising history that a restored etcd cluster repeats: the part of the tailer that
//! keeps `audit_history` and compares a cluster's revisions with the audited ones.
//!
//! A snapshot carries etcd's history up to its revision, and a cluster restored from it
//! under a new cluster id serves that history again. Revision `r` of cluster `B` repeats
//! audited cluster `A` when every revision with lock-key changes that `B` has shown from
//! where the tailer started reading it up to `r` has the same digest in `A`'s
//! `audit_history`, `A` has no other such revision in that range, and `A`'s tailer had
//! read past `r`. Identical history up to `r` means the same grants, releases and
//! expiries at the same revisions with the same tokens: they are stored under `A`
//! already, so `B`'s rows for them are left out. The first revision that differs from
//! every candidate ends the repeat for good (`audit_cursor.repeats` becomes empty), so
//! events `B` makes after the restore are stored under `B`, even at revision numbers that
//! `A` used for other events.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sha2::{Digest, Sha256};
use tokio_postgres::GenericClient;

use crate::tailer::Change;
use crate::{AuditError, ClusterId};

/// SHA-256 of each revision's changes, in revision order: `(revision, digest)`.
///
/// Each change contributes its kind (1 byte: 0 put, 1 delete), key and value (each a
/// big-endian `u32` length and the bytes), create revision, mod revision, version and
/// lease (each a big-endian `i64`), in etcd's order within the revision.
pub(crate) fn digests(changes: &[Change]) -> Vec<(i64, Vec<u8>)> {
    changes
        .chunk_by(|a, b| a.revision == b.revision)
        .map(|group| {
            let mut h = Sha256::new();
            for c in group {
                h.update([u8::from(c.delete)]);
                for bytes in [&c.key, &c.value] {
                    h.update((bytes.len() as u32).to_be_bytes());
                    h.update(bytes);
                }
                for n in [c.create_revision, c.revision, c.version, c.lease] {
                    h.update(n.to_be_bytes());
                }
            }
            (group[0].revision, h.finalize().to_vec())
        })
        .collect()
}

/// The outcome of comparing one batch of revisions.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Compared {
    /// Revisions that repeat an audited cluster's history: their events are stored there.
    pub(crate) repeated: BTreeSet<i64>,
    /// The clusters still repeated after the batch (`Some(empty)`: none, for good).
    pub(crate) repeats: Option<Vec<i64>>,
}

/// Compares `digests` (revisions `after + 1 ..` of `cluster`, ascending) with the audited
/// history of the candidates: `repeats`, or every other audited cluster while `repeats`
/// is `None` (nothing compared yet).
pub(crate) async fn compare<C: GenericClient>(
    client: &C,
    cluster: ClusterId,
    after: i64,
    repeats: Option<&[i64]>,
    digests: &[(i64, Vec<u8>)],
) -> Result<Compared, AuditError> {
    let Some(&(last, _)) = digests.last() else {
        return Ok(Compared {
            repeated: BTreeSet::new(),
            repeats: repeats.map(<[i64]>::to_vec),
        });
    };
    if repeats.is_some_and(|r| r.is_empty()) {
        return Ok(Compared {
            repeated: BTreeSet::new(),
            repeats: Some(Vec::new()),
        });
    }
    let candidates: Vec<i64> = match repeats {
        Some(r) => r.to_vec(),
        None => client
            .query(
                "SELECT cluster_id FROM audit_cursor WHERE cluster_id <> $1",
                &[&cluster.to_sql()],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect(),
    };
    // How far each candidate was read, and its digests over this batch's range.
    let read_to: HashMap<i64, i64> = client
        .query(
            "SELECT cluster_id, revision FROM audit_cursor WHERE cluster_id = ANY($1)",
            &[&candidates],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut history: HashMap<i64, BTreeMap<i64, Vec<u8>>> = HashMap::new();
    for r in client
        .query(
            "SELECT cluster_id, revision, digest FROM audit_history \
             WHERE cluster_id = ANY($1) AND revision > $2 AND revision <= $3",
            &[&candidates, &after, &last],
        )
        .await?
    {
        history
            .entry(r.get(0))
            .or_default()
            .insert(r.get(1), r.get(2));
    }
    Ok(walk(candidates, &read_to, &history, after, digests))
}

/// The comparison itself, revision by revision (see [`compare`]).
fn walk(
    mut alive: Vec<i64>,
    read_to: &HashMap<i64, i64>,
    history: &HashMap<i64, BTreeMap<i64, Vec<u8>>>,
    after: i64,
    digests: &[(i64, Vec<u8>)],
) -> Compared {
    let empty = BTreeMap::new();
    let mut repeated = BTreeSet::new();
    let mut prev = after;
    for (rev, digest) in digests {
        alive.retain(|x| {
            let h = history.get(x).unwrap_or(&empty);
            read_to.get(x).is_some_and(|to| to >= rev)
                && h.range(prev + 1..*rev).next().is_none()
                && h.get(rev) == Some(digest)
        });
        if alive.is_empty() {
            break;
        }
        repeated.insert(*rev);
        prev = *rev;
    }
    Compared {
        repeated,
        repeats: Some(alive),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(b: u8) -> Vec<u8> {
        vec![b; 32]
    }

    #[test]
    fn a_repeat_ends_at_the_first_difference_and_never_resumes() {
        let read_to = HashMap::from([(1, 100), (2, 100)]);
        let history = HashMap::from([
            (
                1,
                BTreeMap::from([(3, d(3)), (5, d(5)), (8, d(8)), (9, d(9))]),
            ),
            (2, BTreeMap::from([(3, d(3)), (5, d(0))])),
        ]);
        // Cluster 2 differs at 5, cluster 1 (a revision 7 it lacks) at 7; 9 matches again
        // but the repeat is over.
        let got = walk(
            vec![1, 2],
            &read_to,
            &history,
            0,
            &[(3, d(3)), (5, d(5)), (7, d(7)), (9, d(9))],
        );
        assert_eq!(
            got,
            Compared {
                repeated: BTreeSet::from([3, 5]),
                repeats: Some(vec![])
            }
        );
    }

    #[test]
    fn a_revision_the_candidate_has_and_the_new_cluster_skipped_ends_it() {
        let read_to = HashMap::from([(1, 100)]);
        let history = HashMap::from([(1, BTreeMap::from([(3, d(3)), (4, d(4)), (6, d(6))]))]);
        let got = walk(vec![1], &read_to, &history, 0, &[(3, d(3)), (6, d(6))]);
        assert_eq!(
            got,
            Compared {
                repeated: BTreeSet::from([3]),
                repeats: Some(vec![])
            }
        );
        // From a later position (after a compaction, say), only the range after it counts.
        let got = walk(vec![1], &read_to, &history, 4, &[(6, d(6))]);
        assert_eq!(
            got,
            Compared {
                repeated: BTreeSet::from([6]),
                repeats: Some(vec![1])
            }
        );
    }

    #[test]
    fn history_the_candidate_never_read_is_not_a_repeat() {
        let read_to = HashMap::from([(1, 5)]);
        let history = HashMap::from([(1, BTreeMap::from([(3, d(3)), (5, d(5))]))]);
        let got = walk(
            vec![1],
            &read_to,
            &history,
            0,
            &[(3, d(3)), (5, d(5)), (6, d(6))],
        );
        assert_eq!(
            got,
            Compared {
                repeated: BTreeSet::from([3, 5]),
                repeats: Some(vec![])
            }
        );
    }

    #[test]
    fn digests_cover_every_field_of_a_change() {
        let c = Change {
            revision: 4,
            delete: false,
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            version: 1,
            create_revision: 4,
            lease: 7,
            prev: None,
        };
        let base = digests(std::slice::from_ref(&c));
        assert_eq!(base.len(), 1);
        let variants = [
            Change {
                delete: true,
                ..c.clone()
            },
            Change {
                key: b"k2".to_vec(),
                ..c.clone()
            },
            Change {
                value: b"v2".to_vec(),
                ..c.clone()
            },
            Change {
                version: 2,
                ..c.clone()
            },
            Change {
                create_revision: 3,
                ..c.clone()
            },
            Change {
                lease: 8,
                ..c.clone()
            },
            // Bytes moved from key to value.
            Change {
                key: b"kv".to_vec(),
                value: vec![],
                ..c.clone()
            },
        ];
        for v in variants {
            assert_ne!(digests(std::slice::from_ref(&v)), base, "{v:?}");
        }
        assert_eq!(digests(std::slice::from_ref(&c)), base);
        // Two revisions, two digests; two changes of one revision, one.
        let next = Change {
            revision: 5,
            ..c.clone()
        };
        assert_eq!(
            digests(&[c.clone(), next.clone()])
                .iter()
                .map(|x| x.0)
                .collect::<Vec<_>>(),
            [4, 5]
        );
        assert_eq!(digests(&[c.clone(), c]).len(), 1);
    }
}
