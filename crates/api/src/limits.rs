//! The service's bounds on session TTLs and on a class's TTL range and lock-delay: the
//! one home of these numbers, for the service, its OpenAPI document and the CLI's flags;
//! and the keepalive every etcd client of Palisade uses.

use std::time::Duration;

use crate::InvalidInput;

/// The shortest session TTL: etcd grants leases in whole seconds, at least one.
pub const MIN_SESSION_TTL: Duration = Duration::from_secs(1);

/// The longest session TTL the service grants unless built with another maximum
/// (`ServiceOptions::with_max_ttl`); `palisade serve` uses it.
pub const MAX_SESSION_TTL: Duration = Duration::from_secs(3600);

/// The longest `ttl_max` (and so `ttl_min`) of a lock class: a class cannot allow a
/// session TTL the service does not grant.
pub const MAX_CLASS_TTL: Duration = MAX_SESSION_TTL;

/// The longest lock-delay of a class. A lock-delay covers a holder that may still run
/// for up to one TTL after its lease ended, so it need not be longer than the longest
/// TTL.
pub const MAX_LOCK_DELAY: Duration = MAX_SESSION_TTL;

/// How long an etcd connection of the lock core or the audit tailer may go without
/// receiving anything before the client pings it (HTTP/2 PING; a ping unanswered within
/// the client's request timeout closes the connection). Above etcd's
/// `--grpc-keepalive-min-time` (5 s by default): etcd counts a ping that comes sooner
/// after the last one, with no response sent between (an idle watch), as a strike, and
/// at the third closes the connection (GOAWAY `too_many_pings`), ending every watch on it.
/// A cluster run with a larger minimum makes its clients reconnect that way.
pub const ETCD_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(6);

/// `d` as people write it here: whole seconds as `N s`, else `N ms`.
pub(crate) fn shown(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Checks a session TTL: a whole number of seconds from [`MIN_SESSION_TTL`] to `max`.
///
/// # Errors
///
/// [`InvalidInput::SessionTtlOutOfRange`], whose text states the range in seconds.
pub fn check_session_ttl(ttl: Duration, max: Duration) -> Result<(), InvalidInput> {
    if ttl.subsec_nanos() != 0 || ttl < MIN_SESSION_TTL || ttl > max {
        return Err(InvalidInput::SessionTtlOutOfRange { ttl, max });
    }
    Ok(())
}

/// Checks a class field given in milliseconds (`field`, as the request names it)
/// against `0..=max`.
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] naming the field and the range.
pub fn check_class_ms(
    field: &'static str,
    value: Duration,
    max: Duration,
) -> Result<(), InvalidInput> {
    if value > max {
        return Err(InvalidInput::OutOfRange { field, value, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ttls_are_whole_seconds_from_one_to_the_maximum() {
        let max = MAX_SESSION_TTL;
        assert!(check_session_ttl(Duration::from_secs(1), max).is_ok());
        assert!(check_session_ttl(max, max).is_ok());
        for (bad, shown) in [
            (Duration::ZERO, "0 s"),
            (Duration::from_millis(1500), "1500 ms"),
            (max + Duration::from_secs(1), "3601 s"),
        ] {
            let e = check_session_ttl(bad, max).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("session TTL {shown} is not a whole number of seconds from 1 to 3600 s")
            );
        }
    }

    #[test]
    fn class_fields_name_themselves_and_their_range() {
        let e =
            check_class_ms("lock_delay_ms", Duration::from_secs(3601), MAX_LOCK_DELAY).unwrap_err();
        assert_eq!(
            e.to_string(),
            "lock_delay_ms 3601000 is above 3600000 (ms; from 0 to 3600 s)"
        );
        assert!(check_class_ms("ttl_max_ms", MAX_CLASS_TTL, MAX_CLASS_TTL).is_ok());
    }
}
