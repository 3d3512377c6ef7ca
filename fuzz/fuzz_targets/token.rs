//! The fencing token's parsers: `FencingToken::parse_bytes`, `FromStr` and the JSON form.
//!
//! Never panics; what parses round-trips through `Display` and JSON, and is exactly the
//! documented grammar: one or more ASCII digits, value below 2^63.

#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade_fence::{Epoch, FencingToken, ParseTokenError};

fuzz_target!(|data: &[u8]| {
    let parsed = FencingToken::parse_bytes(data);

    // The grammar, computed independently: digits only, at least one, below 2^63. The
    // parser reads left to right, so digits that overflow before a bad byte are reported
    // as out of range.
    let first_bad = data.iter().position(|b| !b.is_ascii_digit());
    let digits = &data[..first_bad.unwrap_or(data.len())];
    let value = digits.iter().try_fold(0u64, |v, &d| {
        v.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    });
    match (&parsed, first_bad, value) {
        (Err(ParseTokenError::Empty), _, _) => assert!(data.is_empty()),
        (Err(ParseTokenError::OutOfRange), _, None) => {}
        (Err(ParseTokenError::OutOfRange), None, Some(v)) => assert!(v > i64::MAX as u64),
        (Err(ParseTokenError::InvalidByte { position, byte }), Some(bad), Some(_)) => {
            assert_eq!((*position, *byte), (bad, data[bad]));
        }
        (Ok(t), None, Some(v)) => {
            assert!(!data.is_empty());
            assert_eq!(t.get(), v);
        }
        (other, bad, value) => {
            panic!("{data:?}: parsed {other:?}; first bad byte {bad:?}, value {value:?}")
        }
    }

    // `FromStr` agrees with `parse_bytes` on text.
    if let Ok(text) = std::str::from_utf8(data) {
        assert_eq!(text.parse::<FencingToken>(), parsed);
    }

    if let Ok(token) = parsed {
        // Display is the canonical form: the input without leading zeros.
        let shown = token.to_string();
        let canonical = match data.iter().position(|&b| b != b'0') {
            Some(first) => &data[first..],
            None => b"0",
        };
        assert_eq!(shown.as_bytes(), canonical);
        assert_eq!(FencingToken::parse_bytes(shown.as_bytes()), Ok(token));
        // Parts compose back to the token.
        let epoch = Epoch::new(token.epoch().get()).expect("a token's epoch is in range");
        assert_eq!(FencingToken::from_parts(epoch, token.revision()), Ok(token));
        // JSON: a string, read back from the string or from the bare number.
        let json = serde_json::to_string(&token).unwrap();
        assert_eq!(json, format!("\"{shown}\""));
        assert_eq!(serde_json::from_str::<FencingToken>(&json).unwrap(), token);
        assert_eq!(serde_json::from_str::<FencingToken>(&shown).unwrap(), token);
    }

    // Arbitrary JSON: never panics; what it accepts round-trips.
    if let Ok(token) = serde_json::from_slice::<FencingToken>(data) {
        let json = serde_json::to_string(&token).unwrap();
        assert_eq!(serde_json::from_str::<FencingToken>(&json).unwrap(), token);
    }
});
