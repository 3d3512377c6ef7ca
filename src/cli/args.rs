//! Value parsers shared by the flags of several commands. The bounds are the service's,
//! from `palisade_api::limits`, so a value the CLI accepts is one the service accepts.

use std::time::Duration;

use palisade_api::limits;

/// Parses `--ttl`: whole seconds, from 1 to the service's maximum session TTL.
pub(crate) fn ttl_secs(text: &str) -> Result<u64, String> {
    let secs: u64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number of seconds"))?;
    limits::check_session_ttl(Duration::from_secs(secs), limits::MAX_SESSION_TTL)
        .map_err(|e| e.to_string())?;
    Ok(secs)
}

/// Parses `--ttl-min-ms`: milliseconds, up to the class maximum.
pub(crate) fn ttl_min_ms(text: &str) -> Result<u64, String> {
    class_ms(text, "ttl_min_ms", limits::MAX_CLASS_TTL)
}

/// Parses `--ttl-max-ms`: milliseconds, up to the class maximum.
pub(crate) fn ttl_max_ms(text: &str) -> Result<u64, String> {
    class_ms(text, "ttl_max_ms", limits::MAX_CLASS_TTL)
}

/// Parses `--lock-delay-ms`: milliseconds, up to the longest lock-delay.
pub(crate) fn lock_delay_ms(text: &str) -> Result<u64, String> {
    class_ms(text, "lock_delay_ms", limits::MAX_LOCK_DELAY)
}

fn class_ms(text: &str, field: &'static str, max: Duration) -> Result<u64, String> {
    let ms: u64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number of milliseconds"))?;
    limits::check_class_ms(field, Duration::from_millis(ms), max).map_err(|e| e.to_string())?;
    Ok(ms)
}

/// Checks a name given on the command line (`what`: "namespace", "class", "tier")
/// before anything is sent: not empty, and `[a-z0-9][a-z0-9_-]{0,62}`.
pub(crate) fn check_name(what: &str, name: &str) -> Result<(), super::exit::CliError> {
    if name.is_empty() {
        return Err(super::exit::CliError::bad_input(format!(
            "the {what} name is empty: give a name of the form {}",
            palisade_api::NAME_PATTERN
        )));
    }
    palisade_api::validate_name(name)
        .map_err(|e| super::exit::CliError::bad_input(format!("{what} {name:?}: {e}")))
}
