//! The PostgreSQL backend (feature `postgres`), on a sqlx [`PgPool`].
//!
//! Tables, columns, key derivation, fence format and the per-key advisory lock are those of
//! the SyncGuard reference design, so Rust and TypeScript services can share the same tables.
//! Every operation is **one round trip**: acquire is a server-side function that
//! [`setup_schema`] installs (the reference runs the same steps as an eight-round-trip
//! transaction); release, extend, `is_locked` and lookups are single statements.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
//! use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
//! use syncguard::LockOptions;
//!
//! let pool = sqlx::PgPool::connect("postgres://app@db/app").await.expect("connect");
//! let config = PostgresConfig::new();
//! setup_schema(&pool, &config).await?; // once, at startup (or apply schema.sql)
//! let backend = PostgresBackend::new(pool, config)?;
//!
//! syncguard::with_lock(&backend, "invoice:7", &LockOptions::default(), async |guard| {
//!     println!("fence {}", guard.fence());
//!     Ok::<_, syncguard::LockError>(())
//! })
//! .await?;
//! # Ok(()) }
//! ```
//!
//! Time authority is the database server's clock; expired rows stay until a later acquire of
//! the same key overwrites them, [`PostgresBackend::sweep_expired`] deletes them, or (opt-in)
//! `is_locked` cleans them up. Fence counters are never deleted.
//!
//! ## TLS
//!
//! With the `postgres-tls` feature, the URL's `sslmode` asks for TLS (sqlx's rustls, *ring*
//! provider): `require` encrypts without verifying the server's certificate, `verify-ca`
//! verifies that a trusted CA signed it, `verify-full` also that it names the host, and the
//! default `prefer` encrypts whenever the server offers TLS. Trusted CAs are the Mozilla root
//! certificates (webpki-roots) and those in the `sslrootcert` file (libpq trusts only the
//! file). Without the feature, `prefer` connects in plain text and the other modes fail with
//! `ServiceUnavailable` naming the feature. A certificate that fails verification is
//! `ServiceUnavailable` with the rustls error kept as the source.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
//! use syncguard::postgres::PostgresBackend;
//!
//! // A managed database (RDS, Cloud SQL, Neon), verified against the provider's CA bundle.
//! let url = "postgres://app:secret@db.example.com/app\
//!            ?sslmode=verify-full&sslrootcert=/etc/ssl/certs/provider-ca.pem";
//! let backend = PostgresBackend::connect(url).await?;
//! # let _ = backend; Ok(()) }
//! ```

mod builder;
mod config;
mod error;
mod in_doubt;
mod operations;
mod session;
mod statements;

use std::sync::Arc;

use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

pub use builder::PostgresBackendBuilder;
pub use config::PostgresConfig;
use error::map_error;
use operations::guarded_tolerance_ms;
use session::{Session, boxed};
use statements::Inner;

use crate::LockError;

/// The schema for the default table names, as a migration file (`schema.sql`). For custom
/// names, [`PostgresConfig::schema_sql`] renders the same DDL.
pub const SCHEMA_SQL: &str = include_str!("schema.sql");

/// Longest storage key (bytes) before keys are hashed, as the reference design sets it for
/// PostgreSQL's B-tree entries.
pub const STORAGE_KEY_LIMIT_BYTES: usize = 1700;

pub use crate::time::CLEANUP_GUARD_MS;

/// Locks in PostgreSQL tables shared with the SyncGuard reference design.
///
/// Cheap to clone (the pool and prepared statement texts are shared). Build it with
/// [`connect`](Self::connect) (the default configuration), the [`builder`](Self::builder) (a
/// configuration of your own), or [`new`](Self::new) on a pool of your own (built with
/// [`pool_options`](Self::pool_options), so that checkouts cost no ping), after
/// [`setup_schema`] (or the `schema.sql` migration).
///
/// Every operation takes a connection from the pool for one statement and gives it back:
/// callers share the pool in the order they asked. Operations fail fast, within the
/// [timeouts](PostgresConfig) of the configuration; a connection found dead (a server
/// restart, a terminated backend) costs no failed operation, as the statement is retried once
/// on a fresh connection.
#[derive(Clone)]
pub struct PostgresBackend {
    session: Arc<Session>,
    inner: Arc<Inner>,
}

/// Creates the tables, indexes and the acquire function for `config`, if missing. Idempotent
/// and safe to run from several processes at once; run it at startup, or apply
/// [`SCHEMA_SQL`] / [`PostgresConfig::schema_sql`] as a migration instead.
///
/// # Errors
/// [`LockError::InvalidArgument`] for a bad configuration (before any I/O); mapped database
/// errors (for example [`LockError::AuthFailed`] without the `CREATE` privilege).
pub async fn setup_schema(pool: &PgPool, config: &PostgresConfig) -> Result<(), LockError> {
    let ddl = config.schema_sql()?;
    let mut tx = pool.begin().await.map_err(|e| map_error(e, Some(pool)))?;
    // Concurrent CREATE ... IF NOT EXISTS can still collide in the catalogs; serialize them.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('syncguard:setup_schema'))")
        .execute(&mut *tx)
        .await
        .map_err(|e| map_error(e, Some(pool)))?;
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(&mut *tx)
        .await
        .map_err(|e| map_error(e, Some(pool)))?;
    tx.commit().await.map_err(|e| map_error(e, Some(pool)))
}

impl PostgresBackend {
    /// A backend on `pool` with `config`. The schema must exist (see [`setup_schema`]).
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for invalid table or schema names, or timeouts.
    pub fn new(pool: PgPool, config: PostgresConfig) -> Result<Self, LockError> {
        let inner = Inner::new(config)?;
        Ok(Self {
            session: Arc::new(Session::new(pool, &inner.config)),
            inner: Arc::new(inner),
        })
    }

    /// Pool options suited to lock traffic: sqlx's defaults, except that connections are not
    /// pinged on every checkout (`test_before_acquire(false)`), which would add a round trip
    /// to every operation; a dead connection is found by the statement instead, and the
    /// statement retried once on a fresh connection. Use them for your own pool too.
    pub fn pool_options() -> PgPoolOptions {
        PgPoolOptions::new().test_before_acquire(false)
    }

    /// Connects a pool with [`pool_options`](Self::pool_options) and builds the backend with
    /// the default [`PostgresConfig`]. For another configuration, use the
    /// [`builder`](Self::builder). The schema must exist (see [`setup_schema`]).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::postgres::{PostgresBackend, setup_schema};
    ///
    /// let backend = PostgresBackend::connect("postgres://app@db/app").await?;
    /// setup_schema(backend.pool(), backend.config()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a bad URL;
    /// [`LockError::ServiceUnavailable`] at once when nothing listens at the URL's address;
    /// [`LockError::NetworkTimeout`] when connecting takes longer than the connect timeout;
    /// [`LockError::ServiceUnavailable`] when TLS fails (the server's certificate rejected, or
    /// an `sslmode` that needs TLS without the `postgres-tls` feature); other mapped
    /// connection errors (for example [`LockError::AuthFailed`]).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder(url).build().await
    }

    /// A builder for a backend that connects a pool of its own to `url`, with a configuration
    /// of your own. No I/O happens until [`build`](PostgresBackendBuilder::build).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// use std::time::Duration;
    /// use syncguard::postgres::{PostgresBackend, PostgresConfig};
    ///
    /// let backend = PostgresBackend::builder("postgres://app@db/app")
    ///     .config(PostgresConfig::new().with_acquire_timeout(Duration::from_secs(5)))
    ///     .build()
    ///     .await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn builder(url: &str) -> PostgresBackendBuilder {
        PostgresBackendBuilder::new(url)
    }

    /// The pool the backend runs on.
    pub fn pool(&self) -> &PgPool {
        self.session.pool()
    }

    /// The configuration.
    pub fn config(&self) -> &PostgresConfig {
        &self.inner.config
    }

    /// Deletes expired lock rows (more than [`CLEANUP_GUARD_MS`] past the tolerance) and
    /// returns how many. Never touches the fence table. Run it periodically if many distinct
    /// keys are locked once and never again; otherwise an acquire overwrites expired rows.
    ///
    /// # Errors
    /// Mapped database errors.
    pub async fn sweep_expired(&self) -> Result<u64, LockError> {
        let sql = &self.inner.sweep;
        let result = self
            .session
            .run(|conn, _| {
                boxed(
                    sqlx::query(sql.clone())
                        .bind(guarded_tolerance_ms())
                        .execute(conn),
                )
            })
            .await?;
        Ok(result.rows_affected())
    }
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}
