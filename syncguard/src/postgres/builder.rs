//! [`PostgresBackendBuilder`]: a backend on a pool of its own.

use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

use super::session::boxed;
use super::{PostgresBackend, PostgresConfig};
use crate::error::LockError;

/// Builds a [`PostgresBackend`] that connects a pool of its own; from
/// [`PostgresBackend::builder`].
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
/// use std::time::Duration;
/// use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
///
/// let config = PostgresConfig::new()
///     .with_lock_table("app_locks")
///     .with_fence_table("app_fence_counters")
///     .with_operation_timeout(Duration::from_secs(2));
/// let backend = PostgresBackend::builder("postgres://app@db/app")
///     .config(config)
///     .build()
///     .await?;
/// setup_schema(backend.pool(), backend.config()).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use]
pub struct PostgresBackendBuilder {
    url: String,
    config: PostgresConfig,
}

impl PostgresBackendBuilder {
    /// What [`PostgresBackend::builder`] starts from: the default configuration, for `url`.
    pub(super) fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            config: PostgresConfig::default(),
        }
    }

    /// Table names, timeouts, cleanup and release notifications (default
    /// [`PostgresConfig::new`]).
    ///
    /// ```
    /// use syncguard::postgres::{PostgresBackend, PostgresConfig};
    ///
    /// let builder = PostgresBackend::builder("postgres://app@db/app")
    ///     .config(PostgresConfig::new().with_schema("locking"));
    /// # let _ = builder;
    /// ```
    pub fn config(mut self, config: PostgresConfig) -> Self {
        self.config = config;
        self
    }

    /// Whether the backend announces releases and listens for them (default `true`; see
    /// [`PostgresConfig::with_release_notifications`]). Off, its waiters poll. Set it after
    /// [`config`](Self::config), which replaces it.
    ///
    /// ```
    /// use syncguard::postgres::PostgresBackend;
    ///
    /// let builder = PostgresBackend::builder("postgres://app@pgbouncer/app")
    ///     .release_notifications(false);
    /// # let _ = builder;
    /// ```
    pub fn release_notifications(mut self, enabled: bool) -> Self {
        self.config = self.config.with_release_notifications(enabled);
        self
    }

    /// Validates the configuration and the URL, connects a pool with
    /// [`PostgresBackend::pool_options`] and builds the backend on it, connecting once so that
    /// a wrong URL or a server that is down fails here. The schema must exist (see
    /// [`setup_schema`](super::setup_schema)).
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a bad configuration or
    /// URL, or a URL naming a database the server does not have;
    /// [`ErrorCode::ServiceUnavailable`](crate::ErrorCode::ServiceUnavailable) at once when nothing
    /// listens at the URL's address;
    /// [`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout) when connecting takes longer
    /// than the connect timeout;
    /// [`ErrorCode::ServiceUnavailable`](crate::ErrorCode::ServiceUnavailable) when TLS fails (the
    /// server's certificate rejected, or
    /// an `sslmode` that needs TLS without the `postgres-tls` feature); other mapped
    /// connection errors (for example [`ErrorCode::AuthFailed`](crate::ErrorCode::AuthFailed)).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::postgres::PostgresBackend::builder("postgres://app@db/app")
    ///     .build()
    ///     .await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub async fn build(self) -> Result<PostgresBackend, LockError> {
        let config = self.config;
        config.validate()?;
        let options = PgConnectOptions::from_str(&self.url).map_err(|e| {
            LockError::invalid_argument("invalid PostgreSQL connection URL")
                .with_source(super::error::driver_error(e))
        })?;
        let pool = PostgresBackend::pool_options()
            .acquire_timeout(config.acquire_timeout())
            .connect_lazy_with(options);
        let backend = PostgresBackend::new(pool, config)?;
        // Connect now, so that a wrong URL or a server that is down fails here.
        backend
            .session
            .run(|conn, _| boxed(sqlx::query("SELECT 1").execute(conn)))
            .await?;
        Ok(backend)
    }
}

impl std::fmt::Debug for PostgresBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: never printed.
        f.debug_struct("PostgresBackendBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
