//! Configuration of the Redis backend, and validation of the key prefix.

use std::time::Duration;

use crate::error::LockError;

/// The key prefix used when none is configured, as in the reference design.
///
/// ```
/// assert_eq!(syncguard::redis::RedisConfig::new().prefix, syncguard::redis::DEFAULT_PREFIX);
/// ```
pub const DEFAULT_PREFIX: &str = "syncguard";

/// The longest accepted key prefix, in bytes.
///
/// With keys of at most 512 bytes, every derived Redis key (lock, index, fence) then stays
/// within the reference's 1000-byte budget without hashing, so the layout is the plain one.
pub const MAX_PREFIX_BYTES: usize = 128;

/// How far past its expiry an expired lock must be before `is_locked` may delete it when
/// [`RedisConfig::with_cleanup_in_is_locked`] is on (the specification's guard of at least
/// 2000 ms, so that cleanup never races a concurrent extend).
///
/// ```
/// assert!(syncguard::redis::CLEANUP_GUARD_MS >= 2000);
/// ```
pub use crate::time::CLEANUP_GUARD_MS;

/// Layout and behaviour settings shared by every connection mode.
///
/// Pass it to [`RedisBackend::from_connection_manager`](super::RedisBackend::from_connection_manager)
/// or [`RedisBackend::from_pool`](super::RedisBackend::from_pool); the
/// [`builder`](super::RedisBackend::builder) sets the same values. The prefix is validated when
/// the backend is built.
///
/// ```
/// use syncguard::redis::RedisConfig;
///
/// let config = RedisConfig::new().with_prefix("billing").with_cleanup_in_is_locked(true);
/// assert_eq!(config.prefix, "billing");
/// assert!(config.cleanup_in_is_locked);
/// assert_eq!(RedisConfig::default().prefix, "syncguard");
/// assert!(RedisConfig::default().release_notifications);
/// ```
///
/// # Default
///
/// | setting | default |
/// |---|---|
/// | [`prefix`](Self::prefix) | [`DEFAULT_PREFIX`] (`"syncguard"`) |
/// | [`cleanup_in_is_locked`](Self::cleanup_in_is_locked) | `false` |
/// | [`release_notifications`](Self::release_notifications) | `true` |
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The namespace of every key this backend writes (default `"syncguard"`). Services that
    /// share locks must use the same prefix; see [`validate_prefix`] for what is accepted.
    pub prefix: String,
    /// Whether `is_locked` deletes the data of a lock it finds expired for more than
    /// [`CLEANUP_GUARD_MS`] (default `false`: `is_locked` is a pure read). Only the lock key
    /// and its index are deleted, never a fence counter. Redis also drops lock keys by their
    /// own TTL, so this only matters for keys written without one.
    pub cleanup_in_is_locked: bool,
    /// Whether this backend announces releases and listens for them (default `true`; see
    /// [waiting](super#waiting)). On, a refused acquire marks the lock, the release of a marked
    /// lock publishes its key on the release channel `<prefix>:released`, and the backend
    /// subscribes to it once something waits, so that waiters (of every process) wake at once.
    /// Off, this backend neither marks, publishes nor subscribes: its waiters poll, and its
    /// releases reach other waiters only through their polling, as a reference (TypeScript)
    /// service's do. The same switch as the PostgreSQL backend's
    /// `PostgresConfig::with_release_notifications` (feature `postgres`).
    pub release_notifications: bool,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            cleanup_in_is_locked: false,
            release_notifications: true,
        }
    }
}

impl RedisConfig {
    /// The default configuration: prefix `"syncguard"`, no cleanup in `is_locked`, releases
    /// announced and listened for.
    ///
    /// ```
    /// let config = syncguard::redis::RedisConfig::new();
    /// assert_eq!(config.prefix, "syncguard");
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the key prefix (validated when the backend is built).
    ///
    /// ```
    /// let config = syncguard::redis::RedisConfig::new().with_prefix("app:locks");
    /// assert_eq!(config.prefix, "app:locks");
    /// ```
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Enables or disables the opt-in cleanup of long-expired locks in `is_locked`.
    ///
    /// ```
    /// let config = syncguard::redis::RedisConfig::new().with_cleanup_in_is_locked(true);
    /// assert!(config.cleanup_in_is_locked);
    /// ```
    #[must_use]
    pub fn with_cleanup_in_is_locked(mut self, enabled: bool) -> Self {
        self.cleanup_in_is_locked = enabled;
        self
    }

    /// Enables or disables release notifications: publishing releases on the release channel,
    /// and subscribing to it (see [`release_notifications`](Self::release_notifications)).
    /// Off, the backend's waiters poll.
    ///
    /// ```
    /// let config = syncguard::redis::RedisConfig::new().with_release_notifications(false);
    /// assert!(!config.release_notifications());
    /// ```
    #[must_use]
    pub fn with_release_notifications(mut self, enabled: bool) -> Self {
        self.release_notifications = enabled;
        self
    }

    /// Whether this backend announces releases and listens for them (see
    /// [`release_notifications`](Self::release_notifications)).
    ///
    /// ```
    /// assert!(syncguard::redis::RedisConfig::new().release_notifications());
    /// ```
    pub fn release_notifications(&self) -> bool {
        self.release_notifications
    }
}

/// How a [`RedisBackend`](super::RedisBackend) built by the builder talks to Redis.
///
/// ```
/// use syncguard::redis::ConnectionMode;
///
/// assert_eq!(ConnectionMode::default(), ConnectionMode::Multiplexed);
/// let pooled = ConnectionMode::Pool { max_size: 32 };
/// # let _ = pooled;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ConnectionMode {
    /// One multiplexed, auto-reconnecting connection (redis `ConnectionManager`): concurrent
    /// operations are pipelined on it. The default, and the faster mode in the benchmark.
    #[default]
    Multiplexed,
    /// A deadpool-redis pool of up to `max_size` connections. Each operation checks a
    /// connection out (deadpool-redis pings it on checkout) and returns it afterwards.
    Pool {
        /// The most connections the pool opens.
        max_size: usize,
    },
}

/// Network settings of the builder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NetConfig {
    pub(crate) connection_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) reconnect_retries: usize,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            reconnect_retries: 2,
        }
    }
}

/// Checks a key prefix for the Redis backend and returns it as stored.
///
/// Accepted: 1 to [`MAX_PREFIX_BYTES`] bytes of ASCII letters, digits and `-` `_` `.` `/`
/// `@` `+`, in segments separated by single colons (`app:locks`), with no empty segment (no
/// leading, trailing or doubled colon) and no segment equal to `id` or `fence` (the names of
/// the index and fence namespaces under a prefix). Whitespace, glob characters (`*?[]\`),
/// braces and anything else would make derived keys or `SCAN` patterns ambiguous.
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) saying what is accepted.
///
/// ```
/// use syncguard::redis::validate_prefix;
///
/// assert!(validate_prefix("syncguard").is_ok());
/// assert!(validate_prefix("app:locks-v2").is_ok());
/// assert!(validate_prefix("  ").is_err());
/// assert!(validate_prefix("app:").is_err());
/// assert!(validate_prefix("app:fence").is_err());
/// assert!(validate_prefix("a b").is_err());
/// ```
pub fn validate_prefix(prefix: &str) -> Result<&str, LockError> {
    const ACCEPTED: &str = "accepted: 1 to 128 bytes of ASCII letters, digits and - _ . / @ +, \
        in segments separated by single colons, no segment named `id` or `fence` (e.g. \
        \"syncguard\" or \"app:locks\")";
    if prefix.trim().is_empty() {
        return Err(LockError::invalid_argument(format!(
            "Redis key prefix is empty; {ACCEPTED}"
        )));
    }
    if prefix.len() > MAX_PREFIX_BYTES {
        return Err(LockError::invalid_argument(format!(
            "Redis key prefix is {} bytes, longer than {MAX_PREFIX_BYTES}; {ACCEPTED}",
            prefix.len()
        )));
    }
    if let Some(bad) = prefix.chars().find(|&c| !is_prefix_char(c)) {
        return Err(LockError::invalid_argument(format!(
            "Redis key prefix {prefix:?} contains {bad:?}; {ACCEPTED}"
        )));
    }
    for segment in prefix.split(':') {
        if segment.is_empty() {
            return Err(LockError::invalid_argument(format!(
                "Redis key prefix {prefix:?} has an empty segment (a leading, trailing or \
                 doubled colon); {ACCEPTED}"
            )));
        }
        if segment == "id" || segment == "fence" {
            return Err(LockError::invalid_argument(format!(
                "Redis key prefix {prefix:?} has a segment {segment:?}, which names the index \
                 or fence namespace of another prefix; {ACCEPTED}"
            )));
        }
    }
    Ok(prefix)
}

fn is_prefix_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | '@' | '+' | ':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        for good in [
            "syncguard",
            "a",
            "app:locks",
            "x.y/z@1+2_-",
            &"p".repeat(128),
        ] {
            assert_eq!(validate_prefix(good).unwrap(), good);
        }
        for bad in [
            "",
            "   ",
            "\t",
            &"p".repeat(129),
            ":a",
            "a:",
            "a::b",
            "a b",
            "a*",
            "a?",
            "a[b]",
            "a\\b",
            "{a}",
            "caf\u{e9}",
            "id",
            "a:fence",
            "fence:a",
            "a:id:b",
            "a\nb",
        ] {
            let err = validate_prefix(bad).unwrap_err();
            assert_eq!(err.code(), crate::ErrorCode::InvalidArgument, "{bad:?}");
            assert!(err.to_string().contains("accepted"), "{err}");
        }
    }
}
