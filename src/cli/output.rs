//! Writing to stdout and stderr without panicking: a closed pipe (EPIPE) is an error
//! the command handles, never a panic.

use std::io::Write;

/// Writes `text` and a newline to stdout and flushes it.
///
/// # Errors
///
/// The write or flush failed, e.g. `EPIPE` when the reader has gone.
pub(crate) fn emit(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()
}

/// Writes `palisade: MESSAGE` to stderr; a stderr that cannot be written is ignored.
pub(crate) fn warn(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "palisade: {message}");
}
