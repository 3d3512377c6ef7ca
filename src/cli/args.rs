//! Value parsers shared by the flags of several commands.

/// The longest session TTL etcd grants, in seconds.
const MAX_TTL_SECS: u64 = 9_000_000_000;

/// Parses `--ttl`: whole seconds, from 1 to etcd's maximum lease TTL.
pub(crate) fn ttl_secs(text: &str) -> Result<u64, String> {
    let secs: u64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number of seconds"))?;
    if !(1..=MAX_TTL_SECS).contains(&secs) {
        return Err(format!(
            "the TTL is in whole seconds, from 1 to {MAX_TTL_SECS}, not {secs}"
        ));
    }
    Ok(secs)
}
