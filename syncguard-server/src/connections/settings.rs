//! How [`serve`](crate::serve) treats its connections: timeouts, the connection limit and the
//! shutdown drain.

use std::time::Duration;

/// How long a client may take to send a request's head (request line and headers), by default.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request's body, by default.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a kept-alive connection may wait for its next request, by default: above the 60 s
/// idle timeout of the common load balancers, so that they, not the server, close idle
/// connections (a server that closes first can race a request the balancer is sending).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(75);

/// How long a shutdown waits for the requests in progress, by default.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// How [`serve`](crate::serve) treats its connections.
///
/// Every connection speaks HTTP/1.1 (or 1.0); each has deadlines, so that no client holds a
/// connection by sending slowly or not at all:
///
/// - a new connection must send its first request's head within the **header read timeout**;
///   on a kept-alive connection, a request's head must be complete within that time of its
///   first byte. Otherwise the connection is closed.
/// - a request's body must have arrived within the **body read timeout** of its head;
///   otherwise the request is answered `408 Request Timeout` and the connection closed.
/// - a kept-alive connection waits at most the **idle timeout** for its next request (and a
///   client at most that long to read an answer), then it is closed.
///
/// At most **max connections** are served at once; a connection over the limit is answered
/// `503` at once and closed, and `/ready` answers 503 while the limit is reached. On
/// shutdown, connections with no request in progress (idle, or a head still arriving) are
/// closed at once, and requests in progress get up to the **shutdown timeout** to finish.
///
/// ```
/// use std::time::Duration;
/// use syncguard_server::ServeSettings;
///
/// let settings = ServeSettings::new()
///     .with_header_read_timeout(Duration::from_secs(5))
///     .with_max_connections(Some(500));
/// assert_eq!(settings.header_read_timeout(), Duration::from_secs(5));
/// assert_eq!(settings.idle_timeout(), Duration::from_secs(75));
/// ```
///
/// # Default
///
/// | setting | default |
/// |---|---|
/// | header read timeout | 10 s ([`DEFAULT_HEADER_READ_TIMEOUT`]) |
/// | body read timeout | 10 s ([`DEFAULT_BODY_READ_TIMEOUT`]) |
/// | idle timeout | 75 s ([`DEFAULT_IDLE_TIMEOUT`]) |
/// | max connections | `None`: the process's open-file limit less 128 (kept for the backend's connections, the listener and the like), at most 10,000 |
/// | shutdown timeout | 30 s ([`DEFAULT_SHUTDOWN_TIMEOUT`]) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeSettings {
    header_read_timeout: Duration,
    body_read_timeout: Duration,
    idle_timeout: Duration,
    max_connections: Option<usize>,
    shutdown_timeout: Duration,
}

impl ServeSettings {
    /// The defaults (see [the table](Self#default)).
    pub const fn new() -> Self {
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: None,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
        }
    }

    /// With a request's head due within `timeout` (more than zero).
    #[must_use]
    pub const fn with_header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// With a request's body due within `timeout` of its head (more than zero).
    #[must_use]
    pub const fn with_body_read_timeout(mut self, timeout: Duration) -> Self {
        self.body_read_timeout = timeout;
        self
    }

    /// With kept-alive connections closed after `timeout` without a request (more than zero).
    #[must_use]
    pub const fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// With at most `limit` connections at once (`None`: from the open-file limit). A limit
    /// the open-file limit cannot hold stops [`serve`](crate::serve) with an error.
    #[must_use]
    pub const fn with_max_connections(mut self, limit: Option<usize>) -> Self {
        self.max_connections = limit;
        self
    }

    /// With requests in progress at a shutdown given up to `timeout` to finish.
    #[must_use]
    pub const fn with_shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// How long a request's head may take.
    pub const fn header_read_timeout(&self) -> Duration {
        self.header_read_timeout
    }

    /// How long a request's body may take after its head.
    pub const fn body_read_timeout(&self) -> Duration {
        self.body_read_timeout
    }

    /// How long a kept-alive connection waits for its next request.
    pub const fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }

    /// The connection limit asked for (`None`: from the open-file limit).
    pub const fn max_connections(&self) -> Option<usize> {
        self.max_connections
    }

    /// How long a shutdown waits for requests in progress.
    pub const fn shutdown_timeout(&self) -> Duration {
        self.shutdown_timeout
    }

    /// Refuses timeouts of zero, which would close every connection at once.
    pub(crate) fn check(&self) -> Result<(), String> {
        for (name, timeout) in [
            ("header read timeout", self.header_read_timeout),
            ("body read timeout", self.body_read_timeout),
            ("idle timeout", self.idle_timeout),
        ] {
            if timeout.is_zero() {
                return Err(format!("the {name} must be more than zero"));
            }
        }
        if self.max_connections == Some(0) {
            return Err("the connection limit must be at least 1".to_owned());
        }
        Ok(())
    }
}

impl Default for ServeSettings {
    fn default() -> Self {
        Self::new()
    }
}
