use super::*;

#[test]
fn quota_slots_at_and_above_a_number_are_one_key_range() {
    let r = RootKeys::new("/palisade");
    let end = prefix_end(&r.quota_slots("ns"));
    let (from, nine, ten, last) = (
        r.quota_slot("ns", 10),
        r.quota_slot("ns", 9),
        r.quota_slot("ns", 1000),
        r.quota_slot("ns", u32::MAX),
    );
    assert!(nine < from && from < ten && ten < last);
    assert!(last.as_bytes() < end.as_slice());
    assert!(r.quota_slot("ns2", 0).as_bytes() >= end.as_slice());
    assert_eq!(from, "/palisade/quota/ns/slot/0000000010");
    let lease = LeaseId::new(0xab);
    assert_eq!(
        RootKeys::quota_taker(lease, Some((Mode::Shared, "c", "a/b"))),
        format!("{lease}/s/c/a%2Fb")
    );
    assert_eq!(
        RootKeys::quota_taker(lease, None),
        format!("{lease}/session")
    );
}

#[test]
fn keys_that_are_prefixes_of_each_other_get_disjoint_spaces() {
    let r = RootKeys::new("/palisade");
    let ab = r.lock("ns", "c", "a/b");
    let abc = r.lock("ns", "c", "a/bc");
    assert_eq!(ab.base(), "/palisade/locks/ns/c/a%2Fb/");
    assert!(!abc.base().starts_with(ab.base()) && !ab.base().starts_with(abc.base()));
    // A key that looks like an escape is escaped itself.
    let pct = r.lock("ns", "c", "a%2Fb");
    assert_eq!(pct.base(), "/palisade/locks/ns/c/a%252Fb/");
    assert_ne!(pct.base(), ab.base());
    // A key ending where another's sub-keys begin stays apart.
    let q = r.lock("ns", "c", "a/b/q");
    assert!(!q.queue().starts_with(ab.base()));
}

#[test]
fn the_wait_range_holds_every_hold_and_waiter_key_and_nothing_else_of_the_lock() {
    let r = RootKeys::new("/p/");
    let k = r.lock("n", "c", "k");
    let (start, end) = k.wait_range();
    let inside = |key: &str| key.as_bytes() >= start.as_bytes() && key.as_bytes() < end.as_slice();
    let l = LeaseId::new(i64::MAX);
    for m in [Mode::Exclusive, Mode::Shared] {
        assert!(inside(&k.hold(m, l)) && inside(&k.waiter(m, l)));
        assert!(!inside(&k.grant(m, l)));
    }
    assert!(!inside(&k.cancel_marker(l, 7)));
    // Nor a key of a lock whose escaped key starts with this one's.
    let kq = r.lock("n", "c", "kq");
    assert!(!inside(&kq.hold(Mode::Exclusive, l)) && !inside(&kq.waiter(Mode::Exclusive, l)));
    let k_q = r.lock("n", "c", "k/q");
    assert!(!inside(&k_q.waiter(Mode::Exclusive, l)));
}

#[test]
fn sub_keys() {
    let k = RootKeys::new("/p/").lock("n", "c", "k");
    let l = LeaseId::new(255);
    assert_eq!(
        k.waiter(Mode::Exclusive, l),
        "/p/locks/n/c/k/q/x/00000000000000ff"
    );
    assert_eq!(
        k.hold(Mode::Shared, l),
        "/p/locks/n/c/k/h/s/00000000000000ff"
    );
    assert_eq!(
        k.hold_for_grant(k.grant(Mode::Shared, l).as_bytes())
            .unwrap(),
        k.hold(Mode::Shared, l)
    );
    assert_eq!(
        k.hold_for_waiter(k.waiter(Mode::Shared, l).as_bytes())
            .unwrap(),
        k.hold(Mode::Shared, l)
    );
    assert_eq!(k.hold_for_waiter(k.hold(Mode::Shared, l).as_bytes()), None);
    assert_eq!(
        k.grant_for_hold(k.hold(Mode::Exclusive, l).as_bytes()),
        k.grant(Mode::Exclusive, l).into_bytes()
    );
    assert!(k.waiter(Mode::Shared, l).starts_with(&k.queue()));
    assert!(k
        .hold(Mode::Shared, l)
        .starts_with(&k.holds_of(Mode::Shared)));
}

#[test]
fn a_lease_ends_with_its_marker_or_its_session_record_only() {
    let k = RootKeys::new("/p/");
    let l = LeaseId::new(0x3211a22c6da3b70c);
    assert_eq!(k.lease_marker(l), "/p/leases/3211a22c6da3b70c");
    assert_eq!(k.ended_lease(k.lease_marker(l).as_bytes()), Some(l));
    assert_eq!(k.ended_lease(k.session(l).as_bytes()), Some(l));
    for other in [
        k.session_forced(l, 7),
        k.owner_session("spiffe://t/a", l),
        k.lock("n", "c", "k").hold(Mode::Exclusive, l),
        "/q/leases/3211a22c6da3b70c".to_owned(),
        "/p/leases/3211A22C6DA3B70C".to_owned(),
        "/p/leases/3211a22c6da3b70".to_owned(),
        "/p/leases/".to_owned(),
    ] {
        assert_eq!(k.ended_lease(other.as_bytes()), None, "{other}");
    }
}

#[test]
fn lease_ranges_hold_lease_keys_only() {
    let k = RootKeys::new("/p/").lock("n", "c", "k");
    let l = LeaseId::new(0x3211a22c6da3b70c);
    for m in [Mode::Exclusive, Mode::Shared] {
        for key in [k.waiter(m, l), k.hold(m, l), k.grant(m, l)] {
            assert!(k.in_lease_ranges(key.as_bytes()) && k.is_lease_key(key.as_bytes()));
        }
    }
    for stray in [
        "q/x/junk",
        "q/junk",
        "h/",
        "g/x/",
        "q/y/0000000000000000",
        "h/x/fffffffffffffffff0",
    ] {
        let key = format!("{}{stray}", k.base());
        assert!(!k.in_lease_ranges(key.as_bytes()), "{stray}");
    }
    // Inside a range, but not a lease key: reported by lock_state.
    let odd = format!("{}q/x/1", k.base());
    assert!(k.in_lease_ranges(odd.as_bytes()) && !k.is_lease_key(odd.as_bytes()));
    let c = k.cancel_marker(l, 7);
    assert!(!k.in_lease_ranges(c.as_bytes()));
    // The bounds themselves: the smallest and, inclusive, the largest lease id.
    let (start, end) = k.lease_range('g', Mode::Shared);
    assert_eq!(start, "/p/locks/n/c/k/g/s/0000000000000000");
    assert_eq!(end, b"/p/locks/n/c/k/g/s/ffffffffffffffff\0");
}

/// The keys built by hand are the formatted forms, and the range check answers as
/// the ranges do, for lease ids at the edges (negative ids print as their two's
/// complement, as `{:016x}` does).
#[test]
fn hand_built_keys_match_their_formatted_forms() {
    let r = RootKeys::new("/p");
    let k = r.lock("n", "c", "a/b c%");
    assert_eq!(k.base(), "/p/locks/n/c/a%2Fb%20c%25/");
    assert_eq!(r.epoch(), "/p/config/epoch");
    for raw in [0, 1, 0x3211a22c6da3b70c, i64::MAX, -1, i64::MIN] {
        let l = LeaseId::new(raw);
        for m in [Mode::Exclusive, Mode::Shared] {
            let s = m.segment();
            let b = k.base();
            assert_eq!(k.waiter(m, l), format!("{b}q/{s}/{raw:016x}"));
            assert_eq!(k.hold(m, l), format!("{b}h/{s}/{raw:016x}"));
            assert_eq!(k.grant(m, l), format!("{b}g/{s}/{raw:016x}"));
            assert_eq!(k.queue_of(m), format!("{b}q/{s}/"));
            assert_eq!(k.holds_of(m), format!("{b}h/{s}/"));
            assert_eq!(k.grants_of(m), format!("{b}g/{s}/"));
        }
        for attempt in [0, 7, 10, u64::MAX] {
            assert_eq!(
                k.cancel_marker(l, attempt),
                format!("{}c/{raw:016x}/{attempt}", k.base())
            );
        }
    }
    let in_ranges = |key: &[u8]| {
        ['q', 'h', 'g'].into_iter().any(|sub| {
            [Mode::Exclusive, Mode::Shared].into_iter().any(|m| {
                let (start, end) = k.lease_range(sub, m);
                key >= start.as_bytes() && key < end.as_slice()
            })
        })
    };
    let b = k.base();
    for rest in [
        "h/x/0000000000000000",
        "h/x/000000000000000",
        "h/x/ffffffffffffffff",
        "h/x/ffffffffffffffff\0",
        "h/x/ffffffffffffffff\0a",
        "h/x/fffffffffffffffg",
        "g/s/1",
        "q/x/",
        "q/x",
        "c/x/0000000000000000",
        "h/t/0000000000000000",
        "",
    ] {
        let key = format!("{b}{rest}");
        assert_eq!(
            k.in_lease_ranges(key.as_bytes()),
            in_ranges(key.as_bytes()),
            "{rest:?}"
        );
    }
    assert!(!k.in_lease_ranges(b"/p/locks/n/c/other/h/x/0000000000000000"));
}

#[test]
fn prefix_ends() {
    assert_eq!(prefix_end("a/"), b"a0".to_vec());
    assert_eq!(prefix_end("\u{7f}"), vec![0x80]);
}
