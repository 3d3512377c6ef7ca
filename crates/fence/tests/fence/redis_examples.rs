//! The documented Redis examples, run as they are: crates/fence/examples/redis/fence.sh
//! with the real `redis-cli`, and fence.py with the `redis` package in PALISADE_VENV_PYTHON
//! (scripts/test makes that virtual environment).

use std::path::PathBuf;
use std::process::Command;

use palisade_testkit::TestRedis;
use redis::AsyncCommands;

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/redis")
        .join(name)
}

/// Runs `command` against the shared Redis with the test's prefix and `resource`;
/// returns stdout.
fn run(mut command: Command, redis: &TestRedis, resource: &str) -> String {
    let out = command
        .env("REDIS_URL", redis.url())
        .env("PREFIX", redis.prefix())
        .env("RESOURCE", resource)
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{command:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Deletes the example's data keys (outside the prefix: `{<resource>}:...`).
async fn clean(redis: &TestRedis, keys: &[String]) {
    let _: () = redis.manager().await.del(keys).await.unwrap();
}

#[tokio::test]
async fn redis_cli_example_refuses_the_stale_write_and_keeps_the_holders_data() {
    let redis = TestRedis::create().await;
    let resource = format!("{}orders:17", redis.prefix());
    let mut sh = Command::new("sh");
    sh.arg(example("fence.sh"));
    let out = run(sh, &redis, &resource);
    let mark = format!("{}{{{resource}}}:mark", redis.prefix());
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..8],
        [
            "\"palisade_fence\"".to_owned(),
            "OK".to_owned(),
            format!("(error) FENCESTALE mark=281474976710700 token=281474976710699 key={mark}"),
            "(integer) 1".to_owned(),
            format!("(error) FENCESTALE mark=9007199254740993 token=9007199254740992 key={mark}"),
            format!(
                "(error) FENCETOKEN malformed fencing token \"0281474976710700\": expected a \
                 decimal integer in 0..9223372036854775807 with no sign and no leading zeros; \
                 nothing was written key={mark}"
            ),
            "\"paid\"".to_owned(),
            "1) \"9007199254740993\"".to_owned(),
        ],
        "{out}"
    );
    assert!(lines[8].starts_with("2) \""), "{out}");
    assert_eq!(lines.len(), 9, "{out}");
    clean(
        &redis,
        &[
            format!("{{{resource}}}:status"),
            format!("{{{resource}}}:count"),
        ],
    )
    .await;
}

#[tokio::test]
async fn redis_python_example_parses_the_stale_mark_above_2_pow_53() {
    let python = std::env::var("PALISADE_VENV_PYTHON").unwrap_or_else(|_| {
        panic!(
            "PALISADE_VENV_PYTHON is unset: run the tests with scripts/test, which makes a virtual \
             environment with the redis package and sets it"
        )
    });
    let redis = TestRedis::create().await;
    let resource = format!("{}orders:18", redis.prefix());
    let mut py = Command::new(python);
    py.arg(example("fence.py"));
    let out = run(py, &redis, &resource);
    let new = (40u64 << 48) + 1001;
    assert_eq!(
        out,
        format!(
            "admitted, fields added: 2\nrefused: {old} below {new}\nrow: paid holder 1001\n\
             fenced_call replies: [1, 3]\nmark: {new}\n",
            old = new - 1
        )
    );
    clean(&redis, &[format!("{{{resource}}}:row")]).await;
}
