//! What the MySQL/MariaDB fence takes as a resource and as a token: any bytes as a
//! resource (named in hex when not printable), only canonical decimals as a token.

use mysql_async::prelude::Queryable;
use palisade_fence::mysql::{read_mark, MysqlFenceError, MysqlFenceErrorKind};
use palisade_fence::FencingToken;

use crate::mysql_helper::{fresh_mysql, raw};

/// A resource is bytes: one that is not valid UTF-8 is named in hex in the messages, and
/// its stale signal is still the stale signal, with the right mark. A resource that
/// looks like the message's own separators does not confuse the parse either.
#[tokio::test]
async fn mysql_a_resource_that_is_not_utf8_or_looks_like_the_message_is_still_refused_as_stale() {
    let (_db, mut conn) = fresh_mysql().await;
    let odd: Vec<u8> = vec![0xFF, 0x41, 0xFE];
    conn.exec_drop("CALL fence_raise(?, ?)", (odd.clone(), 10_i64))
        .await
        .unwrap();
    let e: MysqlFenceError = conn
        .exec_drop("CALL fence_raise(?, ?)", (odd.clone(), 5_i64))
        .await
        .unwrap_err()
        .into();
    assert_eq!(e.kind(), MysqlFenceErrorKind::Stale, "{e:?}");
    assert_eq!((e.token(), e.highest()), (Some(raw(5)), Some(raw(10))));
    let source = std::error::Error::source(&e).unwrap().to_string();
    assert!(source.contains("resource 0xFF41FE"), "{source}");

    let long_odd: Vec<u8> = (0..3000).map(|i| (i % 251) as u8 | 0x80).collect();
    let looks_like = "x, mark 99, resource y, mark 1".repeat(50);
    for name in [long_odd, looks_like.into_bytes(), "é/1".as_bytes().to_vec()] {
        conn.exec_drop("CALL fence_raise(?, ?)", (name.clone(), 20_i64))
            .await
            .unwrap();
        let e: MysqlFenceError = conn
            .exec_drop("CALL fence_raise(?, ?)", (name, 3_i64))
            .await
            .unwrap_err()
            .into();
        assert_eq!(e.kind(), MysqlFenceErrorKind::Stale, "{e:?}");
        assert_eq!((e.token(), e.highest()), (Some(raw(3)), Some(raw(20))));
    }

    // fence_reset's refusals name such a resource safely too.
    let e: MysqlFenceError = conn
        .exec_drop(
            "CALL fence_reset(?, ?, ?, NULL, NULL)",
            (odd.clone(), 2_i64, " "),
        )
        .await
        .unwrap_err()
        .into();
    assert_eq!(e.kind(), MysqlFenceErrorKind::BadReset, "{e:?}");
    assert!(e.to_string().contains("0xFF41FE"), "{e}");
    for (to, kind) in [
        (-1_i64, MysqlFenceErrorKind::BadReset),
        (11, MysqlFenceErrorKind::BadReset),
    ] {
        let e: MysqlFenceError = conn
            .exec_drop(
                "CALL fence_reset(?, ?, ?, NULL, NULL)",
                (odd.clone(), to, "why"),
            )
            .await
            .unwrap_err()
            .into();
        assert_eq!(e.kind(), kind, "{to}: {e:?}");
    }
    let e: MysqlFenceError = conn
        .exec_drop(
            "CALL fence_reset(?, ?, ?, ?, ?)",
            (odd.clone(), 2_i64, "why", "lock", 5_i64),
        )
        .await
        .unwrap_err()
        .into();
    assert_eq!(e.kind(), MysqlFenceErrorKind::BadReset, "{e:?}");
    let e: MysqlFenceError = conn
        .exec_drop(
            "CALL fence_reset(?, ?, ?, NULL, NULL)",
            (vec![0xFE_u8, 0x00], 2_i64, "why"),
        )
        .await
        .unwrap_err()
        .into();
    assert_eq!(e.kind(), MysqlFenceErrorKind::NoMark, "{e:?}");
}

/// `fence_raise` takes only a token written as an integer: a fraction, an exponent,
/// spaces, a sign, leading zeros or a binary string are refused (22003), not rounded or
/// converted; integer parameters, literals and prepared statements are admitted.
#[tokio::test]
async fn mysql_fence_raise_refuses_a_token_that_is_not_an_integer() {
    use mysql_async::Value;
    let (_db, mut conn) = fresh_mysql().await;
    for arg in [
        "1.5",
        "'1e3'",
        "'  7'",
        "'+7'",
        "'007'",
        "0x10",
        "''",
        "'9223372036854775808'",
        "18446744073709551615",
        "1.0",
    ] {
        let e: MysqlFenceError = conn
            .query_drop(format!("CALL fence_raise('r', {arg})"))
            .await
            .unwrap_err()
            .into();
        assert_eq!(
            (e.kind(), e.sql_state()),
            (MysqlFenceErrorKind::BadArgument, Some("22003")),
            "{arg}: {e:?}"
        );
    }
    for arg in [
        Value::Double(1.5),
        Value::Bytes(b"1e3".to_vec()),
        Value::Bytes(b" 7".to_vec()),
    ] {
        let e: MysqlFenceError = conn
            .exec_drop("CALL fence_raise(?, ?)", (b"r".to_vec(), arg.clone()))
            .await
            .unwrap_err()
            .into();
        assert_eq!(e.kind(), MysqlFenceErrorKind::BadArgument, "{arg:?}: {e:?}");
    }
    assert_eq!(read_mark(&mut conn, "r").await.unwrap(), None);

    conn.query_drop("CALL fence_raise('r', 0)").await.unwrap();
    conn.query_drop("CALL fence_raise('r', 7)").await.unwrap();
    conn.query_drop("CALL fence_raise('r', '8')").await.unwrap();
    conn.exec_drop("CALL fence_raise(?, ?)", ("r", 9_i64))
        .await
        .unwrap();
    conn.exec_drop("CALL fence_raise(?, ?)", ("r", 10_u64))
        .await
        .unwrap();
    conn.exec_drop("CALL fence_raise(?, ?)", ("r", i64::MAX))
        .await
        .unwrap();
    assert_eq!(
        read_mark(&mut conn, "r").await.unwrap().unwrap().token,
        FencingToken::MAX
    );
}
