//! Which hosts each kind of cut separates, from the run's roles and a seeded pick: the
//! nemesis's side of a network fault, kept apart from how the cut is made.

use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::host::Host;

/// One kind of cut between hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cut {
    /// Every host into one of two random halves.
    Halves,
    /// The etcd leader from everything else.
    IsolateLeader,
    /// etcd split into a majority and a minority, one service replica on each side,
    /// workers spread over both; the resource, PostgreSQL and the spare tier's etcd stay
    /// with the majority.
    MajorityMinority,
    /// One worker from etcd (both tiers) and the lock service, but not from the resource
    /// or PostgreSQL: the stale writer.
    WorkerFromLockService,
}

/// The hosts of a run, by role.
#[derive(Debug, Clone, Copy)]
pub struct Roles<'a> {
    /// etcd members of the home tier, by member index.
    pub etcd: &'a [Host],
    /// etcd members of the spare tier (the other cluster a namespace can be rehomed to).
    pub spare: &'a [Host],
    /// Lock-service replicas, by index.
    pub replicas: &'a [Host],
    /// Workers, by number.
    pub workers: &'a [Host],
    /// The resource service and PostgreSQL.
    pub resources: &'a [Host],
}

impl<'a> Roles<'a> {
    fn all(&self) -> Vec<&'a Host> {
        [
            self.etcd,
            self.spare,
            self.replicas,
            self.workers,
            self.resources,
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The two sides `cut` separates, for `pick` (the planned fault's) and the etcd member
/// that leads. Every host is on one side at most; both sides are non-empty when the
/// roles have the hosts the kind needs (at least two etcd members and two replicas for
/// a majority/minority split, one worker for the stale writer).
pub fn sides<'a>(
    cut: Cut,
    roles: &Roles<'a>,
    pick: u32,
    leader: usize,
) -> (Vec<&'a Host>, Vec<&'a Host>) {
    match cut {
        Cut::Halves => {
            let mut all = roles.all();
            all.shuffle(&mut rand::rngs::StdRng::seed_from_u64(u64::from(pick)));
            let half = all.len() / 2;
            let b = all.split_off(half.max(1));
            (all, b)
        }
        Cut::IsolateLeader => {
            let Some(l) = roles.etcd.get(leader) else {
                return (Vec::new(), Vec::new());
            };
            let rest = roles
                .all()
                .into_iter()
                .filter(|h| h.netns() != l.netns())
                .collect();
            (vec![l], rest)
        }
        Cut::MajorityMinority => {
            let n = roles.etcd.len();
            if n < 2 {
                return (Vec::new(), Vec::new());
            }
            let minority_at = pick as usize % n;
            let minority_size = (n - 1) / 2;
            let (mut major, mut minor) = (Vec::new(), Vec::new());
            for (i, h) in roles.etcd.iter().enumerate() {
                // The minority: `minority_size` members from `minority_at` on, round.
                if (i + n - minority_at) % n < minority_size {
                    minor.push(h);
                } else {
                    major.push(h);
                }
            }
            for (i, h) in roles.replicas.iter().enumerate() {
                if (i + (pick >> 8) as usize) % 2 == 0 {
                    major.push(h);
                } else {
                    minor.push(h);
                }
            }
            for (i, h) in roles.workers.iter().enumerate() {
                if (pick >> (16 + i % 16)) & 1 == 0 {
                    major.push(h);
                } else {
                    minor.push(h);
                }
            }
            major.extend(roles.resources);
            major.extend(roles.spare);
            (major, minor)
        }
        Cut::WorkerFromLockService => {
            if roles.workers.is_empty() {
                return (Vec::new(), Vec::new());
            }
            let w = &roles.workers[pick as usize % roles.workers.len()];
            let service = roles
                .etcd
                .iter()
                .chain(roles.spare)
                .chain(roles.replicas)
                .collect();
            (vec![w], service)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::Ipv4Addr;

    use super::*;

    fn hosts(prefix: &str, n: u8) -> Vec<Host> {
        (0..n)
            .map(|i| {
                let name = format!("{prefix}{i}");
                Host::new(&name, format!("t-{name}"), Ipv4Addr::new(10, 0, 0, i))
            })
            .collect()
    }

    fn names(side: &[&Host]) -> BTreeSet<String> {
        side.iter().map(|h| h.name().to_owned()).collect()
    }

    #[test]
    fn each_cut_separates_what_it_names_and_nothing_is_on_both_sides() {
        let (etcd, spare, replicas, workers, resources) = (
            hosts("etcd", 3),
            hosts("spare", 1),
            hosts("svc", 2),
            hosts("worker", 4),
            vec![hosts("resource", 1).remove(0), hosts("pg", 1).remove(0)],
        );
        let roles = Roles {
            etcd: &etcd,
            spare: &spare,
            replicas: &replicas,
            workers: &workers,
            resources: &resources,
        };
        for pick in [0_u32, 1, 7, 0xdead_beef, u32::MAX] {
            for cut in [
                Cut::Halves,
                Cut::IsolateLeader,
                Cut::MajorityMinority,
                Cut::WorkerFromLockService,
            ] {
                let (a, b) = sides(cut, &roles, pick, 1);
                let (a, b) = (names(&a), names(&b));
                assert!(!a.is_empty() && !b.is_empty(), "{cut:?} {pick}");
                assert!(a.is_disjoint(&b), "{cut:?} {pick}: {a:?} {b:?}");
                match cut {
                    Cut::Halves => assert_eq!(a.len() + b.len(), 12),
                    Cut::IsolateLeader => {
                        assert_eq!(a, BTreeSet::from(["etcd1".to_owned()]));
                        assert_eq!(b.len(), 11);
                    }
                    Cut::MajorityMinority => {
                        let count = |s: &BTreeSet<String>, p: &str| {
                            s.iter().filter(|n| n.starts_with(p)).count()
                        };
                        assert_eq!((count(&a, "etcd"), count(&b, "etcd")), (2, 1));
                        assert_eq!((count(&a, "svc"), count(&b, "svc")), (1, 1));
                        assert!(a.contains("resource0") && a.contains("pg0"));
                        assert!(a.contains("spare0"), "the spare tier with the majority");
                        assert_eq!(a.len() + b.len(), 12);
                    }
                    Cut::WorkerFromLockService => {
                        let w = format!("worker{}", pick % 4);
                        assert_eq!(a, BTreeSet::from([w]));
                        let service: BTreeSet<String> = names(
                            &etcd
                                .iter()
                                .chain(&spare)
                                .chain(&replicas)
                                .collect::<Vec<_>>(),
                        );
                        assert_eq!(b, service, "not the resource, not PostgreSQL");
                    }
                }
            }
        }
    }
}
