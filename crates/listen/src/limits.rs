//! [`ConnLimits`]: the bounds every listener keeps.

use std::time::Duration;

/// The default of [`ConnLimits::with_handshake_timeout`]: 10 s.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The default of [`ConnLimits::with_header_timeout`]: 30 s.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// The default of [`ConnLimits::with_body_stall_timeout`]: 30 s.
pub const DEFAULT_BODY_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The default of [`ConnLimits::with_max_connections`]: 512 (nginx's default
/// `worker_connections`), half the usual open-file limit of a systemd service (1,024),
/// which leaves room for the process's own files and its etcd and Postgres connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// The default of [`ConnLimits::with_probe_reserve`]: 8 connections.
pub const DEFAULT_PROBE_RESERVE: usize = 8;

/// How long a listener waits for each part of a connection, and how many it holds.
///
/// | bound | default | what happens past it |
/// |---|---|---|
/// | handshake | [`DEFAULT_HANDSHAKE_TIMEOUT`] | a TLS handshake not finished is dropped (no HTTP response) |
/// | header | [`DEFAULT_HEADER_TIMEOUT`] | a request head not received whole, counted from the handshake's end or from the previous response, closes the connection (no response); so it is also how long an idle keep-alive connection is held |
/// | body stall | [`DEFAULT_BODY_STALL_TIMEOUT`] | a request body that delivers no bytes for this long fails the handler's read of it, and the connection is closed after the response; a response the client reads nothing of for this long (its socket buffer full) closes the connection |
/// | connections | [`DEFAULT_MAX_CONNECTIONS`] | see below |
/// | probe reserve | [`DEFAULT_PROBE_RESERVE`] | see below |
///
/// At the connection cap a new connection takes the place of the oldest connection that
/// has no request in flight (idle on keep-alive, in its handshake, or still sending its
/// head), which is closed; idle connections never lock clients out. When every
/// connection has a request in flight, a new one goes to the *probe reserve*: there only
/// the [probe paths](ConnLimits::with_probe_paths) are answered (without keep-alive), and
/// any other request gets 503 with `Retry-After: 1`. The reserve replaces its own oldest
/// idle connection the same way. With the reserve full of requests too, a new connection
/// is closed at once.
///
/// Every timeout must be above zero; a zero is taken as one millisecond.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct ConnLimits {
    pub(crate) handshake_timeout: Duration,
    pub(crate) header_timeout: Duration,
    pub(crate) body_stall_timeout: Duration,
    pub(crate) max_connections: usize,
    pub(crate) probe_reserve: usize,
    pub(crate) probe_paths: Vec<String>,
    pub(crate) http2: bool,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits::new()
    }
}

/// A timeout of at least one millisecond (hyper and tokio take a zero as "already past").
fn at_least_1ms(d: Duration) -> Duration {
    d.max(Duration::from_millis(1))
}

impl ConnLimits {
    /// The defaults of the table above, with no probe paths.
    pub fn new() -> Self {
        ConnLimits {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_stall_timeout: DEFAULT_BODY_STALL_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            probe_reserve: DEFAULT_PROBE_RESERVE,
            probe_paths: Vec::new(),
            http2: false,
        }
    }

    /// Also serves HTTP/2 (prior knowledge on plain TCP, ALPN `h2` over TLS when the
    /// server config offers it), next to HTTP/1.1. The header bound applies to HTTP/1.1
    /// heads; an HTTP/2 connection's streams are bounded by the body stall bound.
    pub fn with_http2(mut self) -> Self {
        self.http2 = true;
        self
    }

    /// Whether HTTP/2 is served ([`with_http2`](Self::with_http2)).
    pub fn http2(&self) -> bool {
        self.http2
    }

    /// How long a TLS handshake may take, from the connection's accept. Plain HTTP has
    /// no handshake: its first head falls under [`with_header_timeout`](Self::with_header_timeout).
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = at_least_1ms(timeout);
        self
    }

    /// How long a request head may take to arrive whole, counted from the end of the
    /// handshake (the accept, in plain HTTP) or of the previous response: also the
    /// longest an idle keep-alive connection is held (hyper's `header_read_timeout`).
    pub fn with_header_timeout(mut self, timeout: Duration) -> Self {
        self.header_timeout = at_least_1ms(timeout);
        self
    }

    /// How long a request body may deliver no bytes before reading it fails
    /// (tower-http's `TimeoutBody`, reset by every frame received), and how long the
    /// client may read none of a response before the connection is closed. A body that
    /// trickles in faster than that is bounded by the service's body size limit.
    pub fn with_body_stall_timeout(mut self, timeout: Duration) -> Self {
        self.body_stall_timeout = at_least_1ms(timeout);
        self
    }

    /// How many connections the listener serves at once, the probe reserve aside. At
    /// least 1. Keep it below the process's open-file limit (`RLIMIT_NOFILE`, `ulimit
    /// -n`, systemd's `LimitNOFILE=`) less the files the process needs for itself.
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// How many connections past the cap may still be served the probe paths only
    /// (0: none; then connections past the cap are closed at once).
    pub fn with_probe_reserve(mut self, reserve: usize) -> Self {
        self.probe_reserve = reserve;
        self
    }

    /// The paths (exact, without query) answered on the probe reserve, e.g. `/livez`
    /// and `/readyz`.
    pub fn with_probe_paths<I, P>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        self.probe_paths = paths.into_iter().map(Into::into).collect();
        self
    }

    /// The TLS handshake bound.
    pub fn handshake_timeout(&self) -> Duration {
        self.handshake_timeout
    }

    /// The request head (and keep-alive idle) bound.
    pub fn header_timeout(&self) -> Duration {
        self.header_timeout
    }

    /// The body stall bound.
    pub fn body_stall_timeout(&self) -> Duration {
        self.body_stall_timeout
    }

    /// The connection cap.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// The probe reserve.
    pub fn probe_reserve(&self) -> usize {
        self.probe_reserve
    }

    /// The paths answered on the probe reserve.
    pub fn probe_paths(&self) -> &[String] {
        &self.probe_paths
    }
}
