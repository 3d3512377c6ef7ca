//! Names and lock keys: what the key layout and the API accept.
//!
//! Names (namespaces, classes) are one key segment and one URL path segment, so their
//! alphabet is small. Lock keys are free text with a few exclusions; the key layout
//! escapes them into one segment ([`crate::keys`]).

use crate::InvalidInput;

/// Longest lock key accepted, in bytes (before escaping).
pub const MAX_KEY_LEN: usize = 512;

/// Longest namespace or class name, in bytes.
pub const MAX_NAME_LEN: usize = 63;

/// The pattern of a namespace or class name, as the OpenAPI document states it.
pub const NAME_PATTERN: &str = "^[a-z0-9][a-z0-9_-]{0,62}$";

/// Whether `name` is `[a-z0-9][a-z0-9_-]{0,62}`.
pub fn is_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
}

/// Checks a namespace or class name: `[a-z0-9][a-z0-9_-]{0,62}`, so it is safe as one
/// key segment and in URLs.
///
/// # Errors
///
/// [`InvalidInput::BadName`], naming it.
pub fn validate_name(name: &str) -> Result<(), InvalidInput> {
    if is_name(name) {
        Ok(())
    } else {
        Err(InvalidInput::BadName(name.to_owned()))
    }
}

/// Whether `c` is one of Unicode's bidirectional formatting characters (UAX #9: the
/// embeddings, overrides and isolates U+202A–U+202E and U+2066–U+2069, and the marks
/// U+200E, U+200F and U+061C). In a key they make it display as another key (in logs,
/// `palisade lock` output, the audit dashboard), so two holders could not tell their keys
/// apart by reading them (CVE-2021-42574, "Trojan Source"). Free text refuses them for
/// the same reason ([`crate::validate_text`]): this is the one list of them.
pub(crate) fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}')
}

/// Checks a lock key: non-empty, at most [`MAX_KEY_LEN`] bytes, no control character
/// (Unicode `Cc`: U+0000–U+001F, U+007F–U+009F; NUL included), no bidirectional
/// formatting character (see [`InvalidInput::BidiControl`]), no `..` segment between
/// `/`s.
///
/// # Errors
///
/// [`InvalidInput::EmptyKey`], [`InvalidInput::KeyTooLong`],
/// [`InvalidInput::ControlCharacter`], [`InvalidInput::BidiControl`] or
/// [`InvalidInput::DotDotSegment`].
pub fn validate_key(key: &str) -> Result<(), InvalidInput> {
    if key.is_empty() {
        return Err(InvalidInput::EmptyKey);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(InvalidInput::KeyTooLong);
    }
    if key.chars().any(char::is_control) {
        return Err(InvalidInput::ControlCharacter);
    }
    if let Some((at, ch)) = key.char_indices().find(|&(_, c)| is_bidi_control(c)) {
        return Err(InvalidInput::BidiControl { ch, at });
    }
    if key.split('/').any(|seg| seg == "..") {
        return Err(InvalidInput::DotDotSegment);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["a", "orders", "n-1_x", "0", &"x".repeat(63)] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", "A", "-a", "a/b", "a.b", "a b", &"x".repeat(64)] {
            assert_eq!(validate_name(bad), Err(InvalidInput::BadName(bad.into())));
        }
    }

    #[test]
    fn bad_keys() {
        use InvalidInput::*;
        let reason = |k: &str| validate_key(k).unwrap_err();
        assert_eq!(reason(""), EmptyKey);
        assert_eq!(reason("a/../b"), DotDotSegment);
        assert_eq!(reason(".."), DotDotSegment);
        assert_eq!(reason("a\0b"), ControlCharacter);
        assert_eq!(reason("c1 \u{85}"), ControlCharacter);
        assert_eq!(
            reason("invoice-\u{202E}fdp.exe"),
            BidiControl {
                ch: '\u{202E}',
                at: 8
            }
        );
        for ch in [
            '\u{202A}', '\u{2066}', '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}',
        ] {
            assert!(
                matches!(reason(&format!("k{ch}")), BidiControl { at: 1, .. }),
                "{ch:?}"
            );
        }
        // Other format characters and right-to-left text itself are keys like any.
        assert!(validate_key("\u{5D0}\u{5D1}/\u{200D}x").is_ok());
        assert_eq!(reason(&"k".repeat(MAX_KEY_LEN + 1)), KeyTooLong);
        assert!(validate_key("a/..b/c..").is_ok());
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
    }
}
