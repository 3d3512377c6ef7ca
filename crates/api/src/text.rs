//! Free text fields: the one rule every text the service stores or looks up keeps
//! (a force release's reason, a namespace's tenant and tier, a request id, the audit
//! dashboard's filters).
//!
//! Names and lock keys have rules of their own ([`crate::validate_name`],
//! [`crate::validate_key`]); everything else a request carries as text is checked with
//! [`validate_text`] before anything is written or looked up. The rule:
//!
//! - 1 to `max_len` bytes of UTF-8 (each field has its own bound);
//! - not blank: at least one character that is not whitespace (Unicode `White_Space`,
//!   and U+FEFF, which ECMAScript's `\s` counts as whitespace);
//! - no control character (Unicode `Cc`: U+0000 to U+001F, U+007F to U+009F). PostgreSQL
//!   cannot store U+0000 in `text`, and the others have no place in one-line labels,
//!   logs or the dashboard's pages;
//! - no bidirectional formatting character (U+202A to U+202E, U+2066 to U+2069, U+200E,
//!   U+200F, U+061C): the ones lock keys refuse ([`crate::validate_key`]), one list for
//!   both. They make a reason or label display as other text in logs, `palisade` output
//!   and the dashboard (CVE-2021-42574, "Trojan Source").
//!
//! The OpenAPI document states the same with [`TEXT_PATTERN`] and a `maxLength` (which
//! counts characters, so it bounds the bytes only loosely).

use std::fmt;

use crate::InvalidInput;

/// The pattern of a text field, as the OpenAPI document states it: no control character
/// and no bidirectional formatting character, and at least one character that is none of
/// these nor whitespace. The
/// whitespace is spelled out (no `\s`, whose meaning differs between regex engines), so
/// ECMA-262, Python and Rust regexes read it alike.
pub const TEXT_PATTERN: &str = r"^[^\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*[^\u0000-\u0020\u007f-\u00a0\u061c\u1680\u2000-\u200a\u200e\u200f\u2028\u2029\u202a-\u202f\u205f\u2066-\u2069\u3000\ufeff][^\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*$";

/// Longest force release reason, in bytes.
pub const MAX_REASON_LEN: usize = 1024;

/// Longest label (a namespace's `tenant_id` or `cluster_tier`), in bytes.
pub const MAX_LABEL_LEN: usize = 256;

/// Longest force release request id accepted, in bytes (the service makes UUIDs, 36).
pub const MAX_REQUEST_ID_LEN: usize = 64;

/// What is wrong with a text field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TextFault {
    /// No character at all.
    Empty,
    /// Only whitespace.
    Blank,
    /// Longer than the field's bound.
    TooLong {
        /// Its length, in bytes.
        len: usize,
        /// The field's bound, in bytes.
        max: usize,
    },
    /// A control character.
    ControlCharacter {
        /// The character.
        ch: char,
        /// Its byte offset in the field.
        at: usize,
    },
    /// A bidirectional formatting character, which lock keys refuse too.
    BidiControl {
        /// The character.
        ch: char,
        /// Its byte offset in the field.
        at: usize,
    },
}

impl fmt::Display for TextFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TextFault::Empty => f.write_str("is empty"),
            TextFault::Blank => f.write_str("is blank (only whitespace)"),
            TextFault::TooLong { len, max } => write!(f, "is {len} bytes, more than {max}"),
            TextFault::ControlCharacter { ch, at } => write!(
                f,
                "has the control character U+{:04X} at byte {at} (no control characters, NUL included)",
                u32::from(*ch)
            ),
            TextFault::BidiControl { ch, at } => write!(
                f,
                "has the bidirectional formatting character U+{:04X} at byte {at} (such characters make text display as other text)",
                u32::from(*ch)
            ),
        }
    }
}

/// Whether `c` counts as whitespace for the blank check.
fn blank_char(c: char) -> bool {
    c.is_whitespace() || c == '\u{feff}'
}

/// Checks a text field named `field` against the rule of this module, with a bound of
/// `max_len` bytes.
///
/// # Errors
///
/// [`InvalidInput::BadText`] naming `field` and the [`TextFault`]: the first control
/// character if there is one, else the first bidirectional formatting character, else
/// empty, blank or too long.
pub fn validate_text(field: &'static str, value: &str, max_len: usize) -> Result<(), InvalidInput> {
    let fault = if let Some((at, ch)) = value.char_indices().find(|(_, c)| c.is_control()) {
        Some(TextFault::ControlCharacter { ch, at })
    } else if let Some((at, ch)) = value
        .char_indices()
        .find(|&(_, c)| crate::names::is_bidi_control(c))
    {
        Some(TextFault::BidiControl { ch, at })
    } else if value.is_empty() {
        Some(TextFault::Empty)
    } else if value.len() > max_len {
        Some(TextFault::TooLong {
            len: value.len(),
            max: max_len,
        })
    } else if value.chars().all(blank_char) {
        Some(TextFault::Blank)
    } else {
        None
    };
    match fault {
        Some(fault) => Err(InvalidInput::BadText { field, fault }),
        None => Ok(()),
    }
}

/// Checks that every name and value of the query string `query` (without its `?`)
/// decodes to UTF-8, as `application/x-www-form-urlencoded` decoding (`+` a space, `%XX`
/// a byte) gives it. The usual decoders replace a byte sequence that is not UTF-8 with
/// U+FFFD, so `key=%FF` would be read as the key "\u{FFFD}", another key than was sent.
///
/// # Errors
///
/// [`InvalidInput::QueryNotUtf8`] naming the first such parameter (its name as far as it
/// decodes).
pub fn validate_query_utf8(query: &str) -> Result<(), InvalidInput> {
    let decode = |part: &str| {
        let spaced = part.replace('+', " ");
        String::from_utf8(percent_encoding::percent_decode_str(&spaced).collect()).is_ok()
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !decode(name) || !decode(value) {
            let shown = percent_encoding::percent_decode_str(&name.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned();
            return Err(InvalidInput::QueryNotUtf8 { param: shown });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(value: &str, max: usize) -> Option<TextFault> {
        match validate_text("f", value, max) {
            Ok(()) => None,
            Err(InvalidInput::BadText { field, fault }) => {
                assert_eq!(field, "f");
                Some(fault)
            }
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn text_is_bounded_not_blank_and_free_of_control_characters() {
        for good in [
            "stuck batch job",
            "ü",
            "a b",
            " x ",
            "tab\u{a0}free",
            "\u{2028}x",
        ] {
            assert_eq!(fault(good, 64), None, "{good:?}");
        }
        assert_eq!(fault(&"x".repeat(64), 64), None);
        assert_eq!(fault("", 64), Some(TextFault::Empty));
        for blank in [" ", "\u{a0}\u{3000}", "\u{feff}", "\u{2028}"] {
            assert_eq!(fault(blank, 64), Some(TextFault::Blank), "{blank:?}");
        }
        assert_eq!(
            fault(&"x".repeat(65), 64),
            Some(TextFault::TooLong { len: 65, max: 64 })
        );
        // Bytes, not characters: "é" is two.
        assert_eq!(
            fault(&"é".repeat(33), 64),
            Some(TextFault::TooLong { len: 66, max: 64 })
        );
        for (value, ch, at) in [
            ("a\0b", '\0', 1),
            ("\u{1}", '\u{1}', 0),
            ("line\nbreak", '\n', 4),
            ("tab\t", '\t', 3),
            ("del\u{7f}", '\u{7f}', 3),
            ("éc1\u{85}", '\u{85}', 4),
            (" \u{9f}", '\u{9f}', 1),
        ] {
            assert_eq!(
                fault(value, 64),
                Some(TextFault::ControlCharacter { ch, at }),
                "{value:?}"
            );
        }
        // A control character is named before any other fault.
        assert_eq!(
            fault(&format!("{}\0", "x".repeat(70)), 64),
            Some(TextFault::ControlCharacter { ch: '\0', at: 70 })
        );
    }

    /// Every character a lock key refuses as a control or bidirectional formatting
    /// character, text refuses too, with the same offset.
    #[test]
    fn text_refuses_the_characters_keys_refuse() {
        let mut refused = 0;
        for c in (0..=0x10ffff_u32).filter_map(char::from_u32) {
            let value = format!("reason {c}");
            let (key, text) = (
                crate::validate_key(&value),
                validate_text("reason", &value, MAX_REASON_LEN),
            );
            match key {
                Err(InvalidInput::BidiControl { ch, at }) => {
                    refused += 1;
                    assert_eq!(
                        text,
                        Err(InvalidInput::BadText {
                            field: "reason",
                            fault: TextFault::BidiControl { ch, at }
                        }),
                        "{value:?}"
                    );
                }
                Err(InvalidInput::ControlCharacter) => {
                    refused += 1;
                    assert_eq!(
                        text,
                        Err(InvalidInput::BadText {
                            field: "reason",
                            fault: TextFault::ControlCharacter { ch: c, at: 7 }
                        }),
                        "{value:?}"
                    );
                }
                _ => assert_eq!(text, Ok(()), "{value:?}"),
            }
        }
        // 65 controls, U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C.
        assert_eq!(refused, 65 + 5 + 4 + 3);
        let e = validate_text("reason", "ok\u{202e}kcab", MAX_REASON_LEN).unwrap_err();
        assert_eq!(
            e.to_string(),
            "reason has the bidirectional formatting character U+202E at byte 2 (such characters make text display as other text)"
        );
    }

    #[test]
    fn the_error_names_the_field_and_the_cause() {
        let e = validate_text("reason", "stuck\0", MAX_REASON_LEN).unwrap_err();
        assert_eq!(
            e.to_string(),
            "reason has the control character U+0000 at byte 5 (no control characters, NUL included)"
        );
        let e = validate_text("tenant_id", "", MAX_LABEL_LEN).unwrap_err();
        assert_eq!(e.to_string(), "tenant_id is empty");
        let e = validate_text("reason", &"x".repeat(1025), MAX_REASON_LEN).unwrap_err();
        assert_eq!(e.to_string(), "reason is 1025 bytes, more than 1024");
    }

    #[test]
    fn query_strings_must_decode_to_utf8() {
        for good in [
            "",
            "key=a%2Fb",
            "key=%C3%A9t%C3%A9&x",
            "a+b=c+d",
            "k=%E2%80%AE",
            "&&",
        ] {
            assert_eq!(validate_query_utf8(good), Ok(()), "{good}");
        }
        for (bad, param) in [
            ("key=%FF", "key"),
            ("ns=a&key=%C3", "key"),
            ("%FF=1", "\u{FFFD}"),
            ("key=ok&res%6Furce=%80x", "resource"),
        ] {
            assert_eq!(
                validate_query_utf8(bad),
                Err(InvalidInput::QueryNotUtf8 {
                    param: param.to_owned()
                }),
                "{bad}"
            );
        }
    }
}
