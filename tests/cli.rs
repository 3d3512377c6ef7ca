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
    let (code, _, err) = palisade(&["token", "compose", "--epoch", "32768", "--revision", "1"]);
    assert_eq!(code, 2);
    assert!(err.contains("epoch 32768 is out of range"), "{err}");
}
