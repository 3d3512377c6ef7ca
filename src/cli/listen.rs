//! The flags of a listener's bounds, shared by `palisade serve` and `palisade audit
//! serve`: the handshake, request head (and keep-alive idle) and body stall timeouts,
//! and the connection cap (see `palisade_listen::ConnLimits`).

use std::time::Duration;

use palisade_listen::ConnLimits;

/// How long a client may keep a connection without using it, and how many it may hold.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ListenArgs {
    /// How many connections are served at once. At the cap a new connection replaces the
    /// oldest idle one; when every connection has a request in flight, only the probe
    /// reserve is left. Keep it below the open-file limit (ulimit -n) less what the
    /// process needs for itself.
    #[arg(long, default_value_t = palisade_listen::DEFAULT_MAX_CONNECTIONS as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Connections past --max-connections that still answer the probe paths (/livez and
    /// /readyz of the lock service; the dashboard has none), each without keep-alive;
    /// any other request there gets 503 with Retry-After. 0: none.
    #[arg(long, default_value_t = palisade_listen::DEFAULT_PROBE_RESERVE as u32)]
    probe_reserve: u32,
    /// How long a TLS handshake may take, in milliseconds (mTLS only).
    #[arg(long, default_value_t = ms(palisade_listen::DEFAULT_HANDSHAKE_TIMEOUT),
          value_parser = clap::value_parser!(u64).range(1..))]
    handshake_timeout_ms: u64,
    /// How long a request head may take to arrive whole, in milliseconds, counted from
    /// the connection's start (after the handshake) or the previous response: so also how
    /// long an idle keep-alive connection is held.
    #[arg(long, default_value_t = ms(palisade_listen::DEFAULT_HEADER_TIMEOUT),
          value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout_ms: u64,
    /// How long a request body may send nothing, in milliseconds, before reading it fails
    /// and the connection is closed after the response; also how long a client may read
    /// nothing of a response before its connection is closed.
    #[arg(long, default_value_t = ms(palisade_listen::DEFAULT_BODY_STALL_TIMEOUT),
          value_parser = clap::value_parser!(u64).range(1..))]
    body_stall_timeout_ms: u64,
}

/// A default in milliseconds, for a flag's `default_value_t`.
const fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl ListenArgs {
    /// The bounds the flags give (the probe paths are the server's to set).
    pub(crate) fn limits(&self) -> ConnLimits {
        ConnLimits::new()
            .with_max_connections(self.max_connections as usize)
            .with_probe_reserve(self.probe_reserve as usize)
            .with_handshake_timeout(Duration::from_millis(self.handshake_timeout_ms))
            .with_header_timeout(Duration::from_millis(self.header_timeout_ms))
            .with_body_stall_timeout(Duration::from_millis(self.body_stall_timeout_ms))
    }
}
