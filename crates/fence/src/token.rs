//! The fencing token: `epoch · 2^48 + grant_rev`, its parts, and its wire forms.

use std::fmt;
use std::str::FromStr;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// Bits of the token that hold the etcd revision (the low 48).
const REVISION_BITS: u32 = 48;
/// Exclusive upper bound of a revision that fits a token: 2^48.
const REVISION_LIMIT: u64 = 1 << REVISION_BITS;
/// Exclusive upper bound of an epoch: 2^15, so a token always stays below 2^63.
const EPOCH_LIMIT: u16 = 1 << 15;

/// An epoch of the lock service's revision counter, in `0..2^15`.
///
/// The epoch is advanced when etcd's revision counter could go backwards or be replaced:
/// etcd restored from a snapshot, or a namespace rehomed to another etcd cluster. A new
/// epoch is always greater than every epoch used before, so tokens stay monotonic across
/// the change. The upper bound keeps every token below 2^63, so it fits a signed `BIGINT`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(try_from = "u16", into = "u16")]
pub struct Epoch(u16);

impl Epoch {
    /// The first epoch.
    pub const ZERO: Epoch = Epoch(0);
    /// The last usable epoch, `2^15 - 1`. Advancing past it is refused.
    pub const MAX: Epoch = Epoch(EPOCH_LIMIT - 1);

    /// Makes an epoch.
    ///
    /// # Errors
    ///
    /// [`TokenRangeError::Epoch`] if `value >= 2^15`.
    pub const fn new(value: u16) -> Result<Self, TokenRangeError> {
        if value < EPOCH_LIMIT {
            Ok(Epoch(value))
        } else {
            Err(TokenRangeError::Epoch(value as u64))
        }
    }

    /// The epoch as a number in `0..2^15`.
    pub const fn get(self) -> u16 {
        self.0
    }

    /// The next epoch, or `None` at [`Epoch::MAX`].
    pub const fn next(self) -> Option<Epoch> {
        if self.0 + 1 < EPOCH_LIMIT {
            Some(Epoch(self.0 + 1))
        } else {
            None
        }
    }
}

impl TryFrom<u16> for Epoch {
    type Error = TokenRangeError;
    fn try_from(value: u16) -> Result<Self, Self::Error> {
        Epoch::new(value)
    }
}

impl From<Epoch> for u16 {
    fn from(e: Epoch) -> u16 {
        e.0
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An etcd revision: the cluster-wide, strictly increasing counter that every committed
/// write advances (etcd's documented MVCC semantics). Revisions are never reused; gaps
/// between the revisions a client sees are normal.
///
/// etcd reports revisions as `int64`; a `Revision` holds any non-negative one. Only
/// revisions below 2^48 fit a [`FencingToken`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Revision(u64);

impl Revision {
    /// Makes a revision from an unsigned number.
    pub const fn new(value: u64) -> Self {
        Revision(value)
    }

    /// Makes a revision from etcd's signed representation.
    ///
    /// # Errors
    ///
    /// [`TokenRangeError::Revision`] carrying the value as-is if it is negative (etcd never
    /// reports a negative revision).
    pub const fn from_i64(value: i64) -> Result<Self, TokenRangeError> {
        if value >= 0 {
            Ok(Revision(value as u64))
        } else {
            Err(TokenRangeError::NegativeRevision(value))
        }
    }

    /// The revision as a number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The revision in etcd's signed representation (saturating at `i64::MAX`).
    pub const fn as_i64(self) -> i64 {
        if self.0 > i64::MAX as u64 {
            i64::MAX
        } else {
            self.0 as i64
        }
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A fencing token: `epoch · 2^48 + grant_rev`, always below 2^63.
///
/// Tokens order the holds of a lock: a hold granted later has a larger token, across
/// keys and across epochs. A resource that refuses every write whose token is below the
/// highest it has seen cannot be written by a holder whose lease has already passed on.
///
/// Wire forms:
/// - HTTP header `Fencing-Token: <decimal>` via [`Display`](fmt::Display) and
///   [`FromStr`], which accepts ASCII digits only (no sign, no spaces).
/// - JSON: serialized as a decimal *string*, because tokens exceed 2^53 and a JavaScript
///   number would round them; deserialized from either a string or a JSON integer.
/// - SQL: `i64` for `BIGINT` columns via `From<FencingToken> for i64` (lossless) and
///   `TryFrom<i64>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// The smallest token.
    pub const MIN: FencingToken = FencingToken(0);
    /// The largest token, `2^63 - 1` (epoch `2^15 - 1`, revision `2^48 - 1`).
    pub const MAX: FencingToken = FencingToken(i64::MAX as u64);

    /// Composes a token from the epoch and the revision of the granting transaction.
    ///
    /// # Errors
    ///
    /// [`TokenRangeError::Revision`] if `revision >= 2^48`. (An [`Epoch`] is always in
    /// range by construction.)
    pub const fn from_parts(epoch: Epoch, revision: Revision) -> Result<Self, TokenRangeError> {
        if revision.0 >= REVISION_LIMIT {
            return Err(TokenRangeError::Revision(revision.0));
        }
        Ok(FencingToken(
            ((epoch.0 as u64) << REVISION_BITS) | revision.0,
        ))
    }

    /// Interprets a raw token value.
    ///
    /// # Errors
    ///
    /// [`TokenRangeError::Token`] if `value >= 2^63`.
    pub const fn from_u64(value: u64) -> Result<Self, TokenRangeError> {
        if value <= i64::MAX as u64 {
            Ok(FencingToken(value))
        } else {
            Err(TokenRangeError::Token(value))
        }
    }

    /// The raw token value, below 2^63.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The epoch part (the high bits).
    pub const fn epoch(self) -> Epoch {
        Epoch((self.0 >> REVISION_BITS) as u16)
    }

    /// The revision part (the low 48 bits): the etcd revision of the granting transaction.
    pub const fn revision(self) -> Revision {
        Revision(self.0 & (REVISION_LIMIT - 1))
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}

impl From<FencingToken> for i64 {
    /// Lossless: a token is always below 2^63.
    fn from(t: FencingToken) -> i64 {
        t.0 as i64
    }
}

impl TryFrom<u64> for FencingToken {
    type Error = TokenRangeError;
    fn try_from(value: u64) -> Result<Self, Self::Error> {
        FencingToken::from_u64(value)
    }
}

impl TryFrom<i64> for FencingToken {
    type Error = TokenRangeError;
    /// # Errors
    ///
    /// [`TokenRangeError::NegativeToken`] for a negative value.
    fn try_from(value: i64) -> Result<Self, Self::Error> {
        if value < 0 {
            Err(TokenRangeError::NegativeToken(value))
        } else {
            Ok(FencingToken(value as u64))
        }
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for FencingToken {
    type Err = ParseTokenError;

    /// Parses the decimal form: one or more ASCII digits `0-9` and nothing else.
    ///
    /// Unlike `u64::from_str` this refuses a leading `+`; it also refuses signs,
    /// whitespace anywhere (trim optional whitespace of a header before calling),
    /// non-ASCII digits, and values of 2^63 or more.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_decimal(s.as_bytes())
    }
}

impl FencingToken {
    /// Parses the decimal form from raw bytes, as found in an HTTP header value.
    ///
    /// # Errors
    ///
    /// The same as [`FromStr`]: see [`ParseTokenError`].
    pub fn parse_bytes(bytes: &[u8]) -> Result<Self, ParseTokenError> {
        parse_decimal(bytes)
    }
}

fn parse_decimal(bytes: &[u8]) -> Result<FencingToken, ParseTokenError> {
    if bytes.is_empty() {
        return Err(ParseTokenError::Empty);
    }
    let mut value: u64 = 0;
    for (position, &b) in bytes.iter().enumerate() {
        if !b.is_ascii_digit() {
            return Err(ParseTokenError::InvalidByte { position, byte: b });
        }
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or(ParseTokenError::OutOfRange)?;
    }
    FencingToken::from_u64(value).map_err(|_| ParseTokenError::OutOfRange)
}

impl Serialize for FencingToken {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FencingToken {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = FencingToken;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a fencing token: a decimal string or a non-negative integer below 2^63",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FencingToken, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<FencingToken, E> {
                FencingToken::from_u64(v).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<FencingToken, E> {
                FencingToken::try_from(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A value outside the range a token or one of its parts can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenRangeError {
    /// An epoch of 2^15 or more.
    #[error("epoch {0} is out of range (must be below 2^15 = 32768)")]
    Epoch(u64),
    /// A revision of 2^48 or more cannot be encoded in a token.
    #[error("revision {0} is out of range for a fencing token (must be below 2^48)")]
    Revision(u64),
    /// A negative revision (etcd never reports one).
    #[error("revision {0} is negative")]
    NegativeRevision(i64),
    /// A raw token of 2^63 or more.
    #[error("token {0} is out of range (must be below 2^63)")]
    Token(u64),
    /// A negative raw token (from a signed `BIGINT`).
    #[error("token {0} is negative")]
    NegativeToken(i64),
}

/// Why a decimal token string was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseTokenError {
    /// The input was empty.
    #[error("fencing token is empty")]
    Empty,
    /// A byte other than an ASCII digit `0-9` (sign, space, letter, non-ASCII digit...).
    #[error("fencing token has an invalid byte 0x{byte:02x} at position {position}; only ASCII digits are allowed")]
    InvalidByte {
        /// Zero-based byte offset of the offending byte.
        position: usize,
        /// The offending byte.
        byte: u8,
    },
    /// The value is 2^63 or more.
    #[error("fencing token is out of range (must be below 2^63)")]
    OutOfRange,
}

#[cfg(feature = "postgres")]
mod sql {
    //! `BIGINT` (`INT8`) columns hold tokens directly (feature `postgres`).

    use postgres_types::{accepts, to_sql_checked, FromSql, IsNull, ToSql, Type};

    use super::FencingToken;

    impl ToSql for FencingToken {
        fn to_sql(
            &self,
            ty: &Type,
            out: &mut bytes::BytesMut,
        ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
            i64::from(*self).to_sql(ty, out)
        }
        accepts!(INT8);
        to_sql_checked!();
    }

    impl<'a> FromSql<'a> for FencingToken {
        /// # Errors
        ///
        /// A negative value is refused with [`TokenRangeError::NegativeToken`](super::TokenRangeError).
        fn from_sql(
            ty: &Type,
            raw: &'a [u8],
        ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
            Ok(FencingToken::try_from(i64::from_sql(ty, raw)?)?)
        }
        accepts!(INT8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tok(e: u16, r: u64) -> FencingToken {
        FencingToken::from_parts(Epoch::new(e).unwrap(), Revision::new(r)).unwrap()
    }

    #[test]
    fn layout_is_epoch_shifted_by_48_plus_revision() {
        assert_eq!(tok(0, 7).get(), 7);
        assert_eq!(tok(1, 0).get(), 1 << 48);
        assert_eq!(tok(3, 5).get(), 3 * (1 << 48) + 5);
        assert_eq!(tok(Epoch::MAX.get(), REVISION_LIMIT - 1), FencingToken::MAX);
        assert_eq!(i64::from(FencingToken::MAX), i64::MAX);
    }

    #[test]
    fn ranges_are_checked() {
        assert_eq!(Epoch::new(1 << 15), Err(TokenRangeError::Epoch(1 << 15)));
        assert_eq!(Epoch::MAX.next(), None);
        assert_eq!(Epoch::ZERO.next(), Some(Epoch::new(1).unwrap()));
        assert_eq!(
            FencingToken::from_parts(Epoch::ZERO, Revision::new(1 << 48)),
            Err(TokenRangeError::Revision(1 << 48))
        );
        assert_eq!(
            FencingToken::from_u64(1 << 63),
            Err(TokenRangeError::Token(1 << 63))
        );
        assert_eq!(
            FencingToken::try_from(-1i64),
            Err(TokenRangeError::NegativeToken(-1))
        );
        assert_eq!(
            Revision::from_i64(-5),
            Err(TokenRangeError::NegativeRevision(-5))
        );
    }

    #[test]
    fn a_later_epoch_outranks_any_revision_of_an_earlier_one() {
        assert!(tok(1, 0) > tok(0, REVISION_LIMIT - 1));
    }

    #[test]
    fn parser_refuses_what_u64_from_str_would_accept_and_more() {
        use ParseTokenError::*;
        assert_eq!("".parse::<FencingToken>(), Err(Empty));
        assert_eq!(
            "+5".parse::<FencingToken>(),
            Err(InvalidByte {
                position: 0,
                byte: b'+'
            })
        );
        assert_eq!(
            "-5".parse::<FencingToken>(),
            Err(InvalidByte {
                position: 0,
                byte: b'-'
            })
        );
        assert_eq!(
            "1 2".parse::<FencingToken>(),
            Err(InvalidByte {
                position: 1,
                byte: b' '
            })
        );
        assert_eq!(
            " 12".parse::<FencingToken>(),
            Err(InvalidByte {
                position: 0,
                byte: b' '
            })
        );
        assert_eq!(
            "12\n".parse::<FencingToken>(),
            Err(InvalidByte {
                position: 2,
                byte: b'\n'
            })
        );
        // ARABIC-INDIC DIGIT ONE (U+0661) is a digit to char::is_numeric, not to us.
        assert!(matches!(
            "1\u{0661}".parse::<FencingToken>(),
            Err(InvalidByte { position: 1, .. })
        ));
        assert_eq!(
            "9223372036854775808".parse::<FencingToken>(),
            Err(OutOfRange)
        );
        assert_eq!(
            "99999999999999999999999".parse::<FencingToken>(),
            Err(OutOfRange)
        );
        assert_eq!(
            "9223372036854775807".parse::<FencingToken>(),
            Ok(FencingToken::MAX)
        );
        assert_eq!("0".parse::<FencingToken>(), Ok(FencingToken::MIN));
    }

    #[test]
    fn json_is_a_string_and_accepts_numbers() {
        let t = tok(2, 99);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, format!("\"{}\"", t.get()));
        assert_eq!(serde_json::from_str::<FencingToken>(&json).unwrap(), t);
        assert_eq!(
            serde_json::from_str::<FencingToken>(&t.get().to_string()).unwrap(),
            t
        );
        assert!(serde_json::from_str::<FencingToken>("-1").is_err());
        assert!(serde_json::from_str::<FencingToken>("\"+1\"").is_err());
        assert!(serde_json::from_str::<FencingToken>("1.5").is_err());
        assert!(serde_json::from_str::<FencingToken>("9223372036854775808").is_err());
        assert!(serde_json::from_str::<Epoch>("32768").is_err());
    }

    proptest! {
        #[test]
        fn parts_round_trip(e in 0u16..(1 << 15), r in 0u64..(1 << 48)) {
            let t = tok(e, r);
            prop_assert_eq!(t.epoch().get(), e);
            prop_assert_eq!(t.revision().get(), r);
            prop_assert_eq!(FencingToken::try_from(i64::from(t)).unwrap(), t);
        }

        #[test]
        fn order_is_lexicographic_on_epoch_then_revision(
            e1 in 0u16..(1 << 15), r1 in 0u64..(1 << 48),
            e2 in 0u16..(1 << 15), r2 in 0u64..(1 << 48),
        ) {
            prop_assert_eq!(tok(e1, r1).cmp(&tok(e2, r2)), (e1, r1).cmp(&(e2, r2)));
        }

        #[test]
        fn display_parse_round_trip(v in 0u64..=(i64::MAX as u64)) {
            let t = FencingToken::from_u64(v).unwrap();
            prop_assert_eq!(t.to_string().parse::<FencingToken>(), Ok(t));
        }

        #[test]
        fn parse_agrees_with_u64_on_digit_strings_and_never_panics(s in "\\PC{0,24}") {
            let ours = s.parse::<FencingToken>();
            let digits_only = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            match s.parse::<u64>() {
                Ok(v) if digits_only && v <= i64::MAX as u64 => prop_assert_eq!(ours.map(|t| t.get()), Ok(v)),
                _ => prop_assert!(ours.is_err()),
            }
        }
    }
}
