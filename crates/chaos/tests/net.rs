//! The run's network hosts on real namespaces: hosts reach each other, each fault cuts
//! what it should and no more, a clock jump moves the wall clock only, and nothing is
//! left behind (after a drop, a panic, or a killed run). Needs root, as the harness does.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use palisade_chaos::net::{namespaces, sweep, ClockSkew, Network, PREFIX};

const SHORT: Duration = Duration::from_millis(400);

fn reaches(net: &Network, from: &str, to: &str, port: u16) -> bool {
    let to = SocketAddr::from((net.host(to).unwrap().addr(), port));
    net.host(from).unwrap().connect_tcp(to, SHORT).is_ok()
}

#[test]
fn hosts_reach_each_other_and_a_partition_cuts_only_across_it() {
    let net = Network::create(&["a", "b", "c"]).unwrap();
    let listener = net.host("b").unwrap().bind_tcp(0).unwrap();
    let port = listener.local_addr().unwrap().port();
    assert!(reaches(&net, "a", "b", port));
    assert!(reaches(&net, "c", "b", port));
    let (a, b, c) = (
        net.host("a").unwrap(),
        net.host("b").unwrap(),
        net.host("c").unwrap(),
    );
    net.partition(&[a], &[b, c]).unwrap();
    assert!(!reaches(&net, "a", "b", port), "a is cut off from b");
    assert!(reaches(&net, "c", "b", port), "c and b are on one side");
    // The machine's own namespace has no route into the run's network.
    assert!(
        std::net::TcpStream::connect_timeout(&SocketAddr::from((b.addr(), port)), SHORT).is_err()
    );
    net.heal().unwrap();
    assert!(reaches(&net, "a", "b", port), "healed");
}

#[test]
fn a_one_way_drop_loses_one_direction_only() {
    let net = Network::create(&["a", "b"]).unwrap();
    let (a, b) = (net.host("a").unwrap(), net.host("b").unwrap());
    let sa = a.bind_udp(0).unwrap();
    let sb = b.bind_udp(0).unwrap();
    for s in [&sa, &sb] {
        s.set_read_timeout(Some(SHORT)).unwrap();
    }
    let mut buf = [0_u8; 8];
    net.drop_one_way(a, b).unwrap();
    for _ in 0..3 {
        // A dropped send fails locally (EPERM from the OUTPUT chain).
        let _ = sa.send_to(b"a-to-b", sb.local_addr().unwrap());
    }
    assert!(
        sb.recv_from(&mut buf).is_err(),
        "a's packets to b are dropped"
    );
    sb.send_to(b"b-to-a", sa.local_addr().unwrap()).unwrap();
    let (n, from) = sa.recv_from(&mut buf).unwrap();
    assert_eq!(
        (&buf[..n], from),
        (&b"b-to-a"[..], sb.local_addr().unwrap())
    );
    net.heal().unwrap();
    sa.send_to(b"again", sb.local_addr().unwrap()).unwrap();
    assert!(sb.recv_from(&mut buf).is_ok(), "healed");
}

#[test]
fn random_loss_drops_about_that_share_of_a_hosts_packets() {
    let net = Network::create(&["a", "b"]).unwrap();
    let (a, b) = (net.host("a").unwrap(), net.host("b").unwrap());
    let sa = a.bind_udp(0).unwrap();
    let sb = b.bind_udp(0).unwrap();
    sb.set_read_timeout(Some(SHORT)).unwrap();
    net.lossy(a, 50).unwrap();
    for i in 0..200_u8 {
        // A dropped send fails locally (EPERM from the OUTPUT chain): that is the loss.
        let _ = sa.send_to(&[i], sb.local_addr().unwrap());
    }
    let mut buf = [0_u8; 1];
    let mut got = 0;
    while sb.recv_from(&mut buf).is_ok() {
        got += 1;
    }
    // Binomial(200, 0.5): outside 60..=140 with probability below 1e-8.
    assert!((60..=140).contains(&got), "{got} of 200 arrived");
    net.heal().unwrap();
    sa.send_to(b"x", sb.local_addr().unwrap()).unwrap();
    assert!(sb.recv_from(&mut buf).is_ok(), "healed");
}

#[test]
fn a_clock_jump_moves_the_wall_clock_and_not_the_monotonic_one() {
    let dir = tempfile::tempdir().unwrap();
    let net = Network::create(&["a"]).unwrap();
    let skew = ClockSkew::new(&dir.path().join("offset")).unwrap();
    let pids = std::cell::RefCell::new(Vec::new());
    let read = || {
        let mut c = net.host("a").unwrap().command("/usr/bin/python3");
        c.args(["-c", "import time; print(time.time(), time.monotonic())"]);
        skew.apply(&mut c);
        let child = c
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        skew.started(child.id());
        pids.borrow_mut().push(child.id());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let v: Vec<f64> = text
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let mono = palisade_chaos::clock::monotonic_ns() as f64 / 1e9;
        (v[0] - now, v[1] - mono)
    };
    for jump in [3600_i64, -7200, 0] {
        skew.jump(jump).unwrap();
        let (wall, mono) = read();
        assert!(
            (wall - jump as f64).abs() < 30.0,
            "jump {jump}: wall clock off by {wall} s"
        );
        assert!(
            mono.abs() < 30.0,
            "jump {jump}: monotonic clock off by {mono} s"
        );
    }
    // libfaketime 0.9.10 leaves a shared memory file per process; the skew removes them.
    let removed = skew.remove_leftovers();
    assert!(
        removed.iter().all(|p| p.starts_with("/dev/shm")),
        "{removed:?}"
    );
    for pid in pids.borrow().iter() {
        for name in [
            format!("faketime_shm_{pid}"),
            format!("sem.faketime_sem_{pid}"),
        ] {
            assert!(!std::path::Path::new("/dev/shm").join(name).exists());
        }
    }
}

#[test]
fn nothing_is_left_behind_after_a_drop_a_panic_or_a_failed_create() {
    let net = Network::create(&["x", "y"]).unwrap();
    let run = format!("{}-", net.run_name());
    assert_eq!(namespaces(&run).unwrap().len(), 3, "a switch and two hosts");
    drop(net);
    assert_eq!(namespaces(&run).unwrap(), Vec::<String>::new());

    // A failure while the network is up.
    let run = std::thread::spawn(|| {
        let net = Network::create(&["x"]).unwrap();
        let run = format!("{}-", net.run_name());
        assert!(!namespaces(&run).unwrap().is_empty());
        std::panic::panic_any(run);
    })
    .join()
    .unwrap_err();
    let run = run.downcast::<String>().unwrap();
    assert_eq!(namespaces(&run).unwrap(), Vec::<String>::new());

    // A create refused for its names makes nothing.
    let before = namespaces(PREFIX).unwrap().len();
    assert!(Network::create(&["ok", "Not-OK"]).is_err());
    assert!(Network::create(&["same", "same"]).is_err());
    assert_eq!(namespaces(PREFIX).unwrap().len(), before);
}

#[test]
fn the_sweep_removes_a_killed_runs_namespaces_and_not_a_live_ones() {
    // A process that is gone: its pid names the leftovers, as a SIGKILLed run leaves them.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let leftover = format!("{PREFIX}{dead}-0-sw");
    let live = format!("{PREFIX}{}-999-sw", std::process::id());
    for ns in [&leftover, &live] {
        assert!(Command::new("ip")
            .args(["netns", "add", ns])
            .status()
            .unwrap()
            .success());
    }
    let removed = sweep().unwrap();
    let listed = namespaces(PREFIX).unwrap();
    let _ = Command::new("ip").args(["netns", "delete", &live]).status();
    assert!(removed.contains(&leftover), "{removed:?}");
    assert!(!listed.contains(&leftover));
    assert!(listed.contains(&live), "a live run's namespaces stay");
}
