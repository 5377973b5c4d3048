//! Configuration of the Redis backend, and validation of the key prefix.

use std::time::Duration;

use crate::error::LockError;
use crate::timeouts::check_timeouts;

/// The key prefix used when none is configured, as in the reference design.
///
/// ```
/// assert_eq!(syncguard::redis::RedisConfig::new().prefix(), syncguard::redis::DEFAULT_PREFIX);
/// ```
pub const DEFAULT_PREFIX: &str = "syncguard";

/// The longest accepted key prefix, in bytes.
///
/// With keys of at most 512 bytes, every derived Redis key (lock, index, fence) then stays
/// within the reference's 1000-byte budget without hashing, so the layout is the plain one.
pub const MAX_PREFIX_BYTES: usize = 128;

/// Every setting of a [`RedisBackend`](super::RedisBackend) but where it connects: what
/// [`RedisBackend::connect_with`](super::RedisBackend::connect_with) (beside the URL) and
/// [`RedisBackend::new`](super::RedisBackend::new) (beside your connection) take.
///
/// Set with `with_*`, read with the bare name. Checked when the backend is made, before any
/// I/O; a bad setting is [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) naming it, and nothing is made. Where
/// the backend connects (one server, and the topologies to come) is the URL's to say, never
/// the configuration's.
///
/// Some settings govern only the connections syncguard opens itself
/// ([`connection_mode`](Self::with_connection_mode),
/// [`reconnect_retries`](Self::with_reconnect_retries), `tls_root_certs`):
/// [`RedisBackend::new`](super::RedisBackend::new), on a connection of yours, refuses a
/// configuration that sets them, rather than ignore them.
///
/// ```
/// use std::time::Duration;
/// use syncguard::redis::RedisConfig;
///
/// let config = RedisConfig::new()
///     .with_prefix("billing")
///     .with_cleanup_in_is_locked(true)
///     .with_operation_timeout(Duration::from_millis(500));
/// assert_eq!(config.prefix(), "billing");
/// assert!(config.cleanup_in_is_locked());
/// assert_eq!(RedisConfig::default().prefix(), "syncguard");
/// assert!(RedisConfig::default().release_notifications());
/// ```
///
/// # Default
///
/// | setting | default |
/// |---|---|
/// | [`prefix`](Self::with_prefix) | [`DEFAULT_PREFIX`] (`"syncguard"`) |
/// | [`cleanup_in_is_locked`](Self::with_cleanup_in_is_locked) | `false` |
/// | [`release_notifications`](Self::with_release_notifications) | `true` |
/// | [`connect_timeout`](Self::with_connect_timeout) | 1 s |
/// | [`operation_timeout`](Self::with_operation_timeout) | 1 s |
/// | [`connection_mode`](Self::with_connection_mode) | [`ConnectionMode::Multiplexed`] (only for `connect_with`) |
/// | [`reconnect_retries`](Self::with_reconnect_retries) | 2 (only for `connect_with`) |
/// | [`layout`](Self::with_layout) | [`RedisLayout::Reference`] on one server, [`RedisLayout::Cluster`] on a cluster |
/// | [`wait_for_replicas`](Self::with_wait_for_replicas) | none: an acquire or extend returns once the primary applied it |
/// | `tls_root_certs` (feature `redis-tls`) | none: the Mozilla root certificates (only for `connect_with`) |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    prefix: String,
    cleanup_in_is_locked: bool,
    release_notifications: bool,
    connect_timeout: Duration,
    operation_timeout: Duration,
    // Only for the connections `connect_with` opens: `None` unless set, so that `new` can tell.
    connection_mode: Option<ConnectionMode>,
    reconnect_retries: Option<usize>,
    // `None` unless set: the connection decides (the cluster layout on a cluster).
    layout: Option<RedisLayout>,
    wait_for_replicas: Option<WaitForReplicas>,
    #[cfg(feature = "redis-tls")]
    tls_root_certs: Option<TlsRoots>,
}

/// How many replicas must have an acquire or extend before it counts, and how long to wait for
/// them: [`RedisConfig::with_wait_for_replicas`].
///
/// ```
/// use std::time::Duration;
/// use syncguard::redis::RedisConfig;
///
/// let config = RedisConfig::new().with_wait_for_replicas(1, Duration::from_millis(200));
/// let wait = config.wait_for_replicas().unwrap();
/// assert_eq!((wait.replicas(), wait.timeout()), (1, Duration::from_millis(200)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitForReplicas {
    replicas: u32,
    timeout: Duration,
}

impl WaitForReplicas {
    /// How many replicas must acknowledge the write.
    pub const fn replicas(&self) -> u32 {
        self.replicas
    }

    /// How long the primary waits for them (`WAIT`'s timeout) before the write is given up.
    pub const fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// PEM certificates, shown by size only in `Debug`.
#[cfg(feature = "redis-tls")]
#[derive(Clone, PartialEq, Eq)]
pub(super) struct TlsRoots(pub(super) Vec<u8>);

#[cfg(feature = "redis-tls")]
impl std::fmt::Debug for TlsRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes of PEM>", self.0.len())
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// The reconnection attempts of the multiplexed connection unless set.
const DEFAULT_RECONNECT_RETRIES: usize = 2;

impl RedisConfig {
    /// The default configuration (see the table above).
    ///
    /// ```
    /// let config = syncguard::redis::RedisConfig::new();
    /// assert_eq!(config.prefix(), "syncguard");
    /// ```
    pub fn new() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            cleanup_in_is_locked: false,
            release_notifications: true,
            connect_timeout: Duration::from_secs(1),
            operation_timeout: Duration::from_secs(1),
            connection_mode: None,
            reconnect_retries: None,
            layout: None,
            wait_for_replicas: None,
            #[cfg(feature = "redis-tls")]
            tls_root_certs: None,
        }
    }

    /// The namespace of every key this backend writes (default `"syncguard"`). Services that
    /// share locks must use the same prefix; see [`validate_prefix`] for what is accepted.
    ///
    /// ```
    /// let config = syncguard::redis::RedisConfig::new().with_prefix("app:locks");
    /// assert_eq!(config.prefix(), "app:locks");
    /// ```
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Whether `is_locked` deletes the data of a lock it finds expired for more than
    /// [`CLEANUP_GUARD_MS`](crate::backend::time::CLEANUP_GUARD_MS) (default `false`: `is_locked` is a pure read). Only the lock key
    /// and its index are deleted, never a fence counter. Redis also drops lock keys by their
    /// own TTL, so this only matters for keys written without one.
    ///
    /// ```
    /// let config = syncguard::redis::RedisConfig::new().with_cleanup_in_is_locked(true);
    /// assert!(config.cleanup_in_is_locked());
    /// ```
    #[must_use]
    pub const fn with_cleanup_in_is_locked(mut self, enabled: bool) -> Self {
        self.cleanup_in_is_locked = enabled;
        self
    }

    /// Whether this backend announces releases and listens for them (default `true`; see
    /// [waiting](super#waiting)). On, a refused acquire marks the lock, the release of a marked
    /// lock publishes its key on the release channel `<prefix>:released`, and the backend
    /// subscribes to it once something waits, so that waiters (of every process) wake at once.
    /// Off, this backend neither marks, publishes nor subscribes: its waiters poll, and its
    /// releases reach other waiters only through their polling, as a reference (TypeScript)
    /// service's do. The same switch as the PostgreSQL backend's
    /// `PostgresConfig::with_release_notifications` (feature `postgres`).
    ///
    /// ```
    /// let config = syncguard::redis::RedisConfig::new().with_release_notifications(false);
    /// assert!(!config.release_notifications());
    /// ```
    #[must_use]
    pub const fn with_release_notifications(mut self, enabled: bool) -> Self {
        self.release_notifications = enabled;
        self
    }

    /// How long opening a connection may take: the connections
    /// [`connect_with`](super::RedisBackend::connect_with) opens (which it bounds, with the
    /// operation timeout for loading the scripts), their reconnections, and the release
    /// subscriber's connection (also under [`new`](super::RedisBackend::new), given a release
    /// client).
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = syncguard::redis::RedisConfig::new().with_connect_timeout(Duration::from_secs(3));
    /// assert_eq!(config.connect_timeout(), Duration::from_secs(3));
    /// ```
    #[must_use]
    pub const fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one lock operation may take, end to end (waiting for a pooled connection or a
    /// place in a batch, and the reply); past it, [`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout). An acquire
    /// cut short may still be applied by Redis: it is released in the background (see
    /// [timeouts](super#timeouts-and-acquires-in-doubt)). Enforced by the backend itself, so
    /// it holds under [`new`](super::RedisBackend::new) too, whatever your connection's own
    /// timeouts. It also bounds the subscriber's `SUBSCRIBE` and checks.
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = syncguard::redis::RedisConfig::new()
    ///     .with_operation_timeout(Duration::from_millis(500));
    /// assert_eq!(config.operation_timeout(), Duration::from_millis(500));
    /// ```
    #[must_use]
    pub const fn with_operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// How the connections [`connect_with`](super::RedisBackend::connect_with) opens talk to
    /// Redis (default [`ConnectionMode::Multiplexed`], the faster one). Only for
    /// `connect_with`: [`new`](super::RedisBackend::new) takes the connection itself, and
    /// refuses a configuration that sets this.
    ///
    /// ```
    /// use syncguard::redis::{ConnectionMode, RedisConfig};
    /// let config = RedisConfig::new().with_connection_mode(ConnectionMode::Pool { max_size: 16 });
    /// assert_eq!(config.connection_mode(), ConnectionMode::Pool { max_size: 16 });
    /// ```
    #[must_use]
    pub const fn with_connection_mode(mut self, mode: ConnectionMode) -> Self {
        self.connection_mode = Some(mode);
        self
    }

    /// How many times the multiplexed connection that
    /// [`connect_with`](super::RedisBackend::connect_with) opens retries reconnecting
    /// (exponential backoff from 100 ms) before the waiting operations fail with
    /// `ServiceUnavailable` (default 2). Only for `connect_with` to one server:
    /// [`new`](super::RedisBackend::new) and a `redis-cluster://` URL (whose connection sends
    /// each call again up to 8 times within the operation timeout) refuse a configuration
    /// that sets it.
    ///
    /// ```
    /// let config = syncguard::redis::RedisConfig::new().with_reconnect_retries(5);
    /// assert_eq!(config.reconnect_retries(), 5);
    /// ```
    #[must_use]
    pub const fn with_reconnect_retries(mut self, retries: usize) -> Self {
        self.reconnect_retries = Some(retries);
        self
    }

    /// Where the backend stores its keys (see [storage layout](super#storage-layout-and-compatibility)).
    /// Unset, the connection decides: [`RedisLayout::Reference`] on one server (shared with
    /// TypeScript SyncGuard services), [`RedisLayout::Cluster`] on a cluster (`redis-cluster://`
    /// URLs, feature `redis-cluster`), where it is the only layout that works. Set
    /// [`RedisLayout::Cluster`] on one server for its speed when no TypeScript service shares
    /// the locks, or to move to a cluster later with the same keys.
    ///
    /// ```
    /// use syncguard::redis::{RedisConfig, RedisLayout};
    /// let config = RedisConfig::new().with_layout(RedisLayout::Cluster);
    /// assert_eq!(config.layout(), Some(RedisLayout::Cluster));
    /// assert_eq!(RedisConfig::new().layout(), None);
    /// ```
    #[must_use]
    pub const fn with_layout(mut self, layout: RedisLayout) -> Self {
        self.layout = Some(layout);
        self
    }

    /// Makes an acquire or extend count only once `replicas` replicas have it (Redis `WAIT`,
    /// sent right after the call on the same connection, waiting at most `timeout`), so that a
    /// failover to one of them keeps the lock, its lease and its fence counter. An acquire the
    /// replicas did not acknowledge in time fails (retryable,
    /// [`ErrorCode::ServiceUnavailable`](crate::ErrorCode::ServiceUnavailable)) and its lock is
    /// released; such an extend fails the same way (the guard's heartbeat tries again within
    /// the lease). Releases send no `WAIT`: one lost in a failover leaves the lock to its ttl.
    ///
    /// Off by default. Turn it on where the primary fails over to a replica (Sentinel, a
    /// managed service's automatic failover) and two holders after a failover would cost more
    /// than one replica round trip per acquire: Redis replicates asynchronously, so without it
    /// a grant the primary had not yet sent on is lost with it, and a second caller gets the
    /// same lock. `replicas` at most the replicas the primary has (more never succeed); a
    /// primary that lost a replica refuses every acquire until it is back or the setting
    /// lowered. `timeout` from 1 ms, below the [operation
    /// timeout](Self::with_operation_timeout). Not on a Redis Cluster (refused there).
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = syncguard::redis::RedisConfig::new()
    ///     .with_wait_for_replicas(1, Duration::from_millis(250));
    /// assert_eq!(config.wait_for_replicas().unwrap().replicas(), 1);
    /// ```
    #[must_use]
    pub const fn with_wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait_for_replicas = Some(WaitForReplicas { replicas, timeout });
        self
    }

    /// Trusts only the CA certificates in `pem` (one or more, PEM-encoded) for a `rediss://`
    /// (or `rediss-cluster://`) URL, instead of the Mozilla root certificates: for a server
    /// whose certificate comes from a private CA. The host name is still verified. Feature
    /// `redis-tls`. Only for [`connect_with`](super::RedisBackend::connect_with), with a
    /// `rediss://` or `rediss-cluster://` URL (a `redis://` or `redis-cluster://` one is
    /// refused): [`new`](super::RedisBackend::new) refuses a configuration that sets it.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use syncguard::redis::{RedisBackend, RedisConfig};
    ///
    /// let config = RedisConfig::new().with_tls_root_certs(std::fs::read("/etc/ssl/redis-ca.pem")?);
    /// let backend = RedisBackend::connect_with("rediss://redis.internal:6380", config).await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    #[cfg(feature = "redis-tls")]
    #[must_use]
    pub fn with_tls_root_certs(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_certs = Some(TlsRoots(pem.into()));
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The replicas an acquire or extend waits for, if it waits
    /// ([`with_wait_for_replicas`](Self::with_wait_for_replicas)).
    pub const fn wait_for_replicas(&self) -> Option<WaitForReplicas> {
        self.wait_for_replicas
    }

    /// Whether `is_locked` cleans up long-expired locks.
    pub const fn cleanup_in_is_locked(&self) -> bool {
        self.cleanup_in_is_locked
    }

    /// Whether this backend announces releases and listens for them (see
    /// [`with_release_notifications`](Self::with_release_notifications)).
    ///
    /// ```
    /// assert!(syncguard::redis::RedisConfig::new().release_notifications());
    /// ```
    pub const fn release_notifications(&self) -> bool {
        self.release_notifications
    }

    /// How long opening a connection may take.
    pub const fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// How long one lock operation may take, end to end.
    pub const fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// How the connections `connect_with` opens talk to Redis.
    pub const fn connection_mode(&self) -> ConnectionMode {
        match self.connection_mode {
            Some(mode) => mode,
            None => ConnectionMode::Multiplexed,
        }
    }

    /// How many times the multiplexed connection retries reconnecting.
    pub const fn reconnect_retries(&self) -> usize {
        match self.reconnect_retries {
            Some(retries) => retries,
            None => DEFAULT_RECONNECT_RETRIES,
        }
    }

    /// The layout set with [`with_layout`](Self::with_layout); `None` when the connection
    /// decides.
    pub const fn layout(&self) -> Option<RedisLayout> {
        self.layout
    }

    /// The trusted CA certificates set with
    /// [`with_tls_root_certs`](Self::with_tls_root_certs), PEM-encoded.
    #[cfg(feature = "redis-tls")]
    pub fn tls_root_certs(&self) -> Option<&[u8]> {
        self.tls_root_certs.as_ref().map(|roots| roots.0.as_slice())
    }

    /// Checks every setting.
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) naming the setting that is wrong and what is accepted.
    ///
    /// ```
    /// use syncguard::redis::RedisConfig;
    ///
    /// assert!(RedisConfig::new().validate().is_ok());
    /// let error = RedisConfig::new().with_prefix("a b").validate().unwrap_err();
    /// assert!(error.to_string().contains("prefix"));
    /// ```
    pub fn validate(&self) -> Result<(), LockError> {
        validate_prefix(&self.prefix)?;
        check_timeouts(
            "RedisConfig",
            &[
                ("with_connect_timeout", self.connect_timeout),
                ("with_operation_timeout", self.operation_timeout),
            ],
        )?;
        if let Some(wait) = self.wait_for_replicas {
            if wait.replicas == 0 {
                return Err(LockError::invalid_argument(
                    "RedisConfig::with_wait_for_replicas: replicas must be at least 1 (leave \
                     the setting out not to wait for replicas)",
                ));
            }
            if wait.timeout < Duration::from_millis(1) || wait.timeout >= self.operation_timeout {
                return Err(LockError::invalid_argument(format!(
                    "RedisConfig::with_wait_for_replicas: the timeout must be from 1 ms and \
                     below the operation timeout ({:?}), got {:?}",
                    self.operation_timeout, wait.timeout
                )));
            }
        }
        if self.connection_mode == Some(ConnectionMode::Pool { max_size: 0 }) {
            return Err(LockError::invalid_argument(
                "RedisConfig::with_connection_mode: the pool size (max_size) must be at least 1",
            ));
        }
        Ok(())
    }

    /// The first setting of `self` that only connections syncguard opens can apply, if one
    /// is set: what [`RedisBackend::new`](super::RedisBackend::new) refuses.
    pub(super) fn connect_only_setting(&self) -> Option<&'static str> {
        #[cfg(feature = "redis-tls")]
        if self.tls_root_certs.is_some() {
            return Some("with_tls_root_certs");
        }
        if self.connection_mode.is_some() {
            Some("with_connection_mode")
        } else if self.reconnect_retries.is_some() {
            Some("with_reconnect_retries")
        } else {
            None
        }
    }

    /// Whether [`with_reconnect_retries`](Self::with_reconnect_retries) was called (a
    /// cluster connection and a Sentinel-followed one have no such setting).
    #[cfg(any(feature = "redis-cluster", feature = "redis-sentinel"))]
    pub(super) const fn has_reconnect_retries(&self) -> bool {
        self.reconnect_retries.is_some()
    }

    /// What the release subscriber connects within.
    pub(super) fn net(&self) -> NetConfig {
        NetConfig {
            connection_timeout: self.connect_timeout,
            response_timeout: self.operation_timeout,
        }
    }
}

/// How the connections of [`RedisBackend::connect_with`](super::RedisBackend::connect_with)
/// talk to Redis ([`RedisConfig::with_connection_mode`]).
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

/// Where a [`RedisBackend`](super::RedisBackend) stores its keys
/// ([`RedisConfig::with_layout`]; see
/// [storage layout](super#storage-layout-and-compatibility)).
///
/// ```
/// use syncguard::redis::RedisLayout;
/// assert_ne!(RedisLayout::Reference, RedisLayout::Cluster);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedisLayout {
    /// The SyncGuard reference design's keys: `<prefix>:<key>`, a lock-id index
    /// `<prefix>:id:<lockId>` and a fence counter `<prefix>:fence:<prefix>:<key>`. Rust and
    /// TypeScript services share locks with it. The default on one server; a cluster refuses
    /// its scripts (the three keys are in different slots).
    Reference,
    /// Every key of a lock in one hash slot, found from the lock's key or its lock id:
    /// `<prefix>:{<tag>}` and its fence counter `<prefix>:{<tag>}:fence`, no index. Required on
    /// a cluster; on one server an acquire writes two keys instead of three and a release
    /// deletes one instead of two. Not shared with TypeScript services, which use the
    /// reference layout.
    Cluster,
}

/// The timeouts of the release subscriber's connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NetConfig {
    pub(crate) connection_timeout: Duration,
    pub(crate) response_timeout: Duration,
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
    fn settings_are_checked_and_named() {
        let zero = Duration::ZERO;
        for (config, setting) in [
            (
                RedisConfig::new().with_connect_timeout(zero),
                "with_connect_timeout",
            ),
            (
                RedisConfig::new().with_operation_timeout(zero),
                "with_operation_timeout",
            ),
            (
                RedisConfig::new().with_connection_mode(ConnectionMode::Pool { max_size: 0 }),
                "with_connection_mode",
            ),
            (RedisConfig::new().with_prefix("a:"), "prefix"),
        ] {
            let error = config.validate().unwrap_err();
            assert_eq!(error.code(), crate::ErrorCode::InvalidArgument);
            assert!(error.to_string().contains(setting), "{error}");
        }
        assert_eq!(RedisConfig::new().connect_only_setting(), None);
        assert_eq!(
            RedisConfig::new()
                .with_reconnect_retries(2)
                .connect_only_setting(),
            Some("with_reconnect_retries")
        );
    }

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
