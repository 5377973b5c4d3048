//! [`RedisBackendBuilder`]: a backend that opens its own connections.

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::config::NetConfig;
use super::connection::Conn;
#[cfg(feature = "redis-tls")]
use super::connection::install_crypto_provider;
use super::error::map_redis_error;
use super::{ConnectionMode, RedisBackend, RedisConfig, validate_prefix};
use crate::error::LockError;

/// Builds a [`RedisBackend`] that opens its own connections; from [`RedisBackend::builder`].
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
/// use syncguard::redis::{ConnectionMode, RedisBackend};
///
/// let pooled = RedisBackend::builder("redis://127.0.0.1:6379")
///     .mode(ConnectionMode::Pool { max_size: 32 })
///     .cleanup_in_is_locked(true)
///     .build()
///     .await?;
/// # let _ = pooled; Ok(()) }
/// ```
#[derive(Clone)]
#[must_use]
pub struct RedisBackendBuilder {
    url: String,
    config: RedisConfig,
    mode: ConnectionMode,
    net: NetConfig,
    #[cfg(feature = "redis-tls")]
    tls_roots: Option<TlsRoots>,
}

/// PEM certificates, shown by size only in `Debug`.
#[cfg(feature = "redis-tls")]
#[derive(Clone)]
struct TlsRoots(Vec<u8>);

#[cfg(feature = "redis-tls")]
impl std::fmt::Debug for TlsRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes of PEM>", self.0.len())
    }
}

impl std::fmt::Debug for RedisBackendBuilder {
    // The URL may carry a password: it is left out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut builder = f.debug_struct("RedisBackendBuilder");
        builder
            .field("config", &self.config)
            .field("mode", &self.mode)
            .field("net", &self.net);
        #[cfg(feature = "redis-tls")]
        builder.field("tls_roots", &self.tls_roots);
        builder.finish_non_exhaustive()
    }
}

impl RedisBackendBuilder {
    /// What [`RedisBackend::builder`] starts from: the defaults, for `url`.
    pub(super) fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            config: RedisConfig::default(),
            mode: ConnectionMode::default(),
            net: NetConfig::default(),
            #[cfg(feature = "redis-tls")]
            tls_roots: None,
        }
    }

    /// The key prefix (default `"syncguard"`; see [`validate_prefix`]).
    ///
    /// ```
    /// let builder = syncguard::redis::RedisBackend::builder("redis://127.0.0.1").prefix("app");
    /// # let _ = builder;
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// Opt-in cleanup of long-expired locks in `is_locked` (default off; see
    /// [`RedisConfig::cleanup_in_is_locked`]).
    ///
    /// ```
    /// let builder = syncguard::redis::RedisBackend::builder("redis://127.0.0.1")
    ///     .cleanup_in_is_locked(true);
    /// # let _ = builder;
    /// ```
    pub fn cleanup_in_is_locked(mut self, enabled: bool) -> Self {
        self.config.cleanup_in_is_locked = enabled;
        self
    }

    /// Whether the backend announces releases (publishes them on the release channel) and
    /// listens for them (subscribes to it), so that waiters wake at once (default `true`; see
    /// [`RedisConfig::release_notifications`]). Off, its waiters poll.
    ///
    /// ```
    /// let builder = syncguard::redis::RedisBackend::builder("redis://127.0.0.1")
    ///     .release_notifications(false);
    /// # let _ = builder;
    /// ```
    pub fn release_notifications(mut self, enabled: bool) -> Self {
        self.config.release_notifications = enabled;
        self
    }

    /// Replaces the prefix, cleanup and release notification settings with `config`.
    ///
    /// ```
    /// use syncguard::redis::{RedisBackend, RedisConfig};
    /// let builder = RedisBackend::builder("redis://127.0.0.1")
    ///     .config(RedisConfig::new().with_prefix("app"));
    /// # let _ = builder;
    /// ```
    pub fn config(mut self, config: RedisConfig) -> Self {
        self.config = config;
        self
    }

    /// The connection mode (default [`ConnectionMode::Multiplexed`], the faster one).
    ///
    /// ```
    /// use syncguard::redis::{ConnectionMode, RedisBackend};
    /// let builder = RedisBackend::builder("redis://127.0.0.1")
    ///     .mode(ConnectionMode::Pool { max_size: 16 });
    /// # let _ = builder;
    /// ```
    pub fn mode(mut self, mode: ConnectionMode) -> Self {
        self.mode = mode;
        self
    }

    /// How long opening a connection may take (default 1 s).
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = syncguard::redis::RedisBackend::builder("redis://127.0.0.1")
    ///     .connection_timeout(Duration::from_secs(3));
    /// # let _ = builder;
    /// ```
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.net.connection_timeout = timeout;
        self
    }

    /// How long an operation waits for its reply before failing with `NetworkTimeout`
    /// (default 1 s; multiplexed mode only, pooled connections use redis-rs' default).
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = syncguard::redis::RedisBackend::builder("redis://127.0.0.1")
    ///     .response_timeout(Duration::from_millis(500));
    /// # let _ = builder;
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.net.response_timeout = timeout;
        self
    }

    /// How many times the multiplexed connection retries reconnecting (exponential backoff
    /// from 100 ms) before the waiting operations fail with `ServiceUnavailable` (default 2).
    ///
    /// ```
    /// let builder = syncguard::redis::RedisBackend::builder("redis://127.0.0.1")
    ///     .reconnect_retries(5);
    /// # let _ = builder;
    /// ```
    pub fn reconnect_retries(mut self, retries: usize) -> Self {
        self.net.reconnect_retries = retries;
        self
    }

    /// Trusts only the CA certificates in `pem` (one or more, PEM-encoded) for a `rediss://`
    /// URL, instead of the Mozilla root certificates: for a server whose certificate comes
    /// from a private CA. The host name is still verified. Feature `redis-tls`.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = syncguard::redis::RedisBackend::builder("rediss://redis.internal:6380")
    ///     .tls_root_certs(std::fs::read("/etc/ssl/redis-ca.pem")?)
    ///     .build()
    ///     .await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    #[cfg(feature = "redis-tls")]
    pub fn tls_root_certs(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_roots = Some(TlsRoots(pem.into()));
        self
    }

    /// The redis-rs client for the URL (and the trusted CAs, if set).
    fn client(&self) -> Result<::redis::Client, LockError> {
        #[cfg(feature = "redis-tls")]
        if let Some(TlsRoots(pem)) = &self.tls_roots {
            let certificates = ::redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            };
            return ::redis::Client::build_with_tls(self.url.as_str(), certificates).map_err(
                |error| {
                    LockError::invalid_argument(
                        "invalid Redis URL or TLS root certificates; tls_root_certs needs a \
                         rediss:// URL and PEM-encoded CA certificates",
                    )
                    .with_source(super::error::driver_error(error))
                },
            );
        }
        ::redis::Client::open(self.url.as_str()).map_err(|error| {
            LockError::invalid_argument(
                "invalid Redis URL; expected redis://[user:password@]host[:port][/db] (or \
                 rediss:// with the redis-tls feature)",
            )
            .with_source(super::error::driver_error(error))
        })
    }

    /// Validates the settings, connects and loads the scripts.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad prefix, URL or pool size (before any I/O); then as
    /// [`RedisBackend::connect`].
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::redis::RedisBackend::builder("redis://127.0.0.1:6379")
    ///     .build()
    ///     .await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub async fn build(self) -> Result<RedisBackend, LockError> {
        validate_prefix(&self.config.prefix)?;
        let client = self.client()?;
        #[cfg(feature = "redis-tls")]
        install_crypto_provider();
        let conn = match self.mode {
            ConnectionMode::Multiplexed => {
                let settings = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.net.connection_timeout))
                    .set_response_timeout(Some(self.net.response_timeout))
                    .set_number_of_retries(self.net.reconnect_retries);
                let manager = ConnectionManager::new_with_config(client.clone(), settings)
                    .await
                    .map_err(map_redis_error)?;
                Conn::Manager(manager)
            }
            ConnectionMode::Pool { max_size } => {
                if max_size == 0 {
                    return Err(LockError::invalid_argument(
                        "Redis pool size must be at least 1",
                    ));
                }
                // From the client's connection info, which carries the trusted CAs, if any.
                let manager = deadpool_redis::Manager::new(client.get_connection_info().clone())
                    .map_err(|error| {
                        LockError::invalid_argument("invalid Redis connection settings")
                            .with_source(error)
                    })?;
                let pool = deadpool_redis::Pool::builder(manager)
                    .max_size(max_size)
                    .runtime(deadpool_redis::Runtime::Tokio1)
                    .wait_timeout(Some(self.net.response_timeout))
                    .create_timeout(Some(self.net.connection_timeout))
                    .recycle_timeout(Some(self.net.response_timeout))
                    .build()
                    .map_err(|error| {
                        LockError::internal("could not build the Redis connection pool")
                            .with_source(error)
                    })?;
                Conn::Pool(pool)
            }
        };
        // The subscriber connects as the others do: same address, credentials and TLS.
        let backend = RedisBackend::with_conn(conn, &self.config, Some((client, self.net)))?;
        backend.load_scripts().await?;
        Ok(backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_leaves_out_the_url_and_its_password() {
        let builder = RedisBackendBuilder::new("redis://app:s3cret@cache:6379/0");
        let shown = format!("{builder:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("cache:6379"),
            "{shown}"
        );
        assert!(shown.contains("RedisBackendBuilder"), "{shown}");
    }
}
