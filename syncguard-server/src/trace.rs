//! One `tracing` span per request (`syncguard_server.request`, with its `request_id`, so that
//! what is logged while serving it can be told apart) and one structured log line when it
//! ends (target `syncguard_server::request`), modelled on LSC's canonical request log, both
//! at the [`RequestLogLevel`] set (`info` by default).
//!
//! The line is one event with each field once, and no span prefix: the method, the route
//! (or, for a path no route matches, the path), status, outcome, duration, and what the lock
//! handlers tell through a [`RequestFacts`] response extension. Values a client chooses
//! freely (`X-Request-Id`, an unmatched path) are cut to [`MAX_LOGGED_CHARS`]. When the level
//! is off, or the filter leaves it out, a request costs no span, no id and no clock reading.
//! Never logged: the instanceId (only its SHA-256, as LSC logs it), tokens, holders.

use std::fmt;
use std::str::FromStr;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use tracing::{Instrument, Level};

/// The target of the request log line.
const TARGET: &str = "syncguard_server::request";

/// The most characters of a client-chosen value (`X-Request-Id`, an unmatched path) that are
/// logged; longer ones are cut and end with `…`.
pub(crate) const MAX_LOGGED_CHARS: usize = 128;

/// The level at which each request is logged (its span and its log line), or `off`.
///
/// ```
/// use syncguard_server::RequestLogLevel;
///
/// let level: RequestLogLevel = "debug".parse()?;
/// assert_eq!(level, RequestLogLevel::at(tracing::Level::DEBUG));
/// assert_eq!("off".parse::<RequestLogLevel>()?, RequestLogLevel::OFF);
/// assert_eq!(RequestLogLevel::default().to_string(), "info");
/// # Ok::<(), syncguard_server::InvalidRequestLogLevel>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLogLevel(Option<Level>);

impl RequestLogLevel {
    /// No request span, no request log line.
    pub const OFF: Self = Self(None);

    /// Requests logged at `level`.
    pub const fn at(level: Level) -> Self {
        Self(Some(level))
    }

    /// The level, `None` when off.
    pub const fn level(self) -> Option<Level> {
        self.0
    }
}

impl Default for RequestLogLevel {
    /// `info`.
    fn default() -> Self {
        Self::at(Level::INFO)
    }
}

impl fmt::Display for RequestLogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(level) => f.write_str(&level.as_str().to_ascii_lowercase()),
            None => f.write_str("off"),
        }
    }
}

/// A request log level that is none of `error`, `warn`, `info`, `debug`, `trace`, `off`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a request log level; use error, warn, info, debug, trace or off")]
pub struct InvalidRequestLogLevel(String);

impl FromStr for RequestLogLevel {
    type Err = InvalidRequestLogLevel;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim().eq_ignore_ascii_case("off") {
            return Ok(Self::OFF);
        }
        // `Level`'s own parser also takes numbers; only the names are documented here.
        match text.trim().to_ascii_lowercase().as_str() {
            name @ ("error" | "warn" | "info" | "debug" | "trace") => name
                .parse()
                .map(Self::at)
                .map_err(|_| InvalidRequestLogLevel(text.to_owned())),
            _ => Err(InvalidRequestLogLevel(text.to_owned())),
        }
    }
}

/// What a lock handler tells the request log.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestFacts {
    /// `get`, `acquire`, `renew` or `release`.
    pub(crate) operation: &'static str,
    pub(crate) namespace: Option<String>,
    pub(crate) lock_name: Option<String>,
    /// LSC's `lock_service_outcome` (`ACQUIRED`, `RELEASE_CONFLICT`, ...).
    pub(crate) outcome: Option<&'static str>,
    /// LSC's `lock_result`: `success`, `conflict`, `not_found`.
    pub(crate) result: Option<&'static str>,
    /// SHA-256 (hex) of the instanceId.
    pub(crate) instance_id_hash: Option<String>,
    pub(crate) lease_seconds: Option<u32>,
    pub(crate) expiry: Option<u64>,
}

impl RequestFacts {
    pub(crate) fn new(operation: &'static str) -> Self {
        Self {
            operation,
            ..Self::default()
        }
    }
}

/// The hash under which an instanceId is logged: SHA-256, in lowercase hex.
pub(crate) fn hash_instance_id(instance_id: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(instance_id.as_bytes());
    let mut hex = String::with_capacity(2 * digest.len());
    for byte in digest {
        hex.push(char::from(HEX[usize::from(byte >> 4)]));
        hex.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    hex
}

/// `value`, cut to [`MAX_LOGGED_CHARS`] characters (then ending with `…`).
fn bounded(value: &str) -> String {
    match value.char_indices().nth(MAX_LOGGED_CHARS) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_owned(),
    }
}

/// LSC's `outcome`: `success` (2xx), `rejected` (423), `timeout` (408, 504), `failure`.
fn outcome_of(status: u16) -> &'static str {
    match status {
        200..=299 => "success",
        423 => "rejected",
        408 | 504 => "timeout",
        _ => "failure",
    }
}

/// Runs `$body` with `$level` (a runtime [`Level`]) bound to the constant `LEVEL` the
/// `tracing` macros need.
macro_rules! with_level {
    ($level:expr, |$constant:ident| $body:expr) => {
        match $level {
            Level::ERROR => {
                const $constant: Level = Level::ERROR;
                $body
            }
            Level::WARN => {
                const $constant: Level = Level::WARN;
                $body
            }
            Level::INFO => {
                const $constant: Level = Level::INFO;
                $body
            }
            Level::DEBUG => {
                const $constant: Level = Level::DEBUG;
                $body
            }
            Level::TRACE => {
                const $constant: Level = Level::TRACE;
                $body
            }
        }
    };
}

/// The middleware: the span around the request, the log line after it.
pub(crate) async fn trace_requests(
    State(log): State<RequestLogLevel>,
    request: Request,
    next: Next,
) -> Response {
    let Some(level) = log.level() else {
        return next.run(request).await;
    };
    if !with_level!(level, |LEVEL| tracing::enabled!(target: TARGET, LEVEL)) {
        return next.run(request).await;
    }
    let started = Instant::now();
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned());
    // The path only where no route names the request (a 404): the route and the lock's
    // namespace and name say the rest.
    let target = route.is_none().then(|| bounded(request.uri().path()));
    let request_id = match request
        .headers()
        .get("x-request-id")
        .and_then(|value| value.to_str().ok())
    {
        Some(given) => bounded(given),
        None => format!("req_{}", uuid::Uuid::new_v4()),
    };
    let span = with_level!(level, |LEVEL| tracing::span!(
        target: TARGET,
        LEVEL,
        "syncguard_server.request",
        request_id = %request_id,
    ));
    let response = next.run(request).instrument(span).await;
    let status = response.status().as_u16();
    let facts = response.extensions().get::<RequestFacts>();
    #[allow(clippy::cast_possible_truncation)] // A request does not last 584 million years.
    let duration_ms = started.elapsed().as_millis() as u64;
    with_level!(level, |LEVEL| tracing::event!(
        target: TARGET,
        parent: None,
        LEVEL,
        request_id = %request_id,
        http_method = %method,
        http_route = route.as_deref(),
        http_target = target.as_deref(),
        http_status_code = status,
        outcome = outcome_of(status),
        duration_ms,
        lock_operation = facts.map(|facts| facts.operation),
        lock_namespace = facts.and_then(|facts| facts.namespace.as_deref()),
        lock_name = facts.and_then(|facts| facts.lock_name.as_deref()),
        lock_service_outcome = facts.and_then(|facts| facts.outcome),
        lock_result = facts.and_then(|facts| facts.result),
        instance_id_hash = facts.and_then(|facts| facts.instance_id_hash.as_deref()),
        requested_lease_duration_sec = facts.and_then(|facts| facts.lease_seconds),
        computed_expiry_epoch_sec = facts.and_then(|facts| facts.expiry),
        "request"
    ));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_by_name_and_anything_else_is_refused_with_the_names() {
        for (text, level) in [
            ("error", RequestLogLevel::at(Level::ERROR)),
            ("WARN", RequestLogLevel::at(Level::WARN)),
            ("info", RequestLogLevel::default()),
            (" debug ", RequestLogLevel::at(Level::DEBUG)),
            ("trace", RequestLogLevel::at(Level::TRACE)),
            ("Off", RequestLogLevel::OFF),
        ] {
            assert_eq!(text.parse::<RequestLogLevel>(), Ok(level), "{text}");
        }
        for text in ["", "3", "verbose"] {
            let error = text.parse::<RequestLogLevel>().unwrap_err().to_string();
            assert!(error.contains("use error, warn, info"), "{error}");
        }
    }

    #[test]
    fn client_chosen_values_are_cut() {
        let long = "x".repeat(60_000);
        assert_eq!(bounded(&long), format!("{}…", "x".repeat(MAX_LOGGED_CHARS)));
        assert_eq!(bounded("req-1"), "req-1");
        let wide = "é".repeat(200);
        assert_eq!(bounded(&wide).chars().count(), MAX_LOGGED_CHARS + 1);
    }

    #[test]
    fn the_instance_id_hash_is_sha256_hex() {
        assert_eq!(
            hash_instance_id("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
