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
//! syncguard::with_lock(&backend, &LockOptions::new("invoice:7"), async |guard| {
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
//! use syncguard::postgres::{PostgresBackend, PostgresConfig};
//!
//! // A managed database (RDS, Cloud SQL, Neon), verified against the provider's CA bundle.
//! let url = "postgres://app:secret@db.example.com/app\
//!            ?sslmode=verify-full&sslrootcert=/etc/ssl/certs/provider-ca.pem";
//! let backend = PostgresBackend::connect(url, PostgresConfig::new()).await?;
//! # let _ = backend; Ok(()) }
//! ```

mod config;
mod error;
mod in_doubt;
mod session;

use std::sync::Arc;
use std::time::Duration;

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, PgPool, Row, SqlStr};

use config::Names;
pub use config::PostgresConfig;
use error::map_error;
use in_doubt::AcquireInDoubt;
use session::{Attempt, Session, boxed};

use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, Lease, LockBackend, LockInfo, Lookup,
    NotHeldReason, ReleaseOutcome, TimeAuthority,
};
use crate::key::{make_fence_key, make_storage_key, normalize_key};
use crate::time::{TIME_TOLERANCE_MS, ttl_millis};
use crate::{FENCE_MAX, Fence, LockError, LockId};

/// The schema for the default table names, as a migration file (`schema.sql`). For custom
/// names, [`PostgresConfig::schema_sql`] renders the same DDL.
pub const SCHEMA_SQL: &str = include_str!("schema.sql");

/// Longest storage key (bytes) before keys are hashed, as the reference design sets it for
/// PostgreSQL's B-tree entries.
pub const STORAGE_KEY_LIMIT_BYTES: usize = 1700;

pub use crate::time::CLEANUP_GUARD_MS;

/// The server's clock in Unix milliseconds, in every statement.
macro_rules! now_ms {
    () => {
        "floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT"
    };
}

/// Locks in PostgreSQL tables shared with the SyncGuard reference design.
///
/// Cheap to clone (the pool and prepared statement texts are shared). Build it with
/// [`PostgresBackend::connect`], or [`PostgresBackend::new`] on a pool of your own (built
/// with [`pool_options`](Self::pool_options), so that checkouts cost no ping), after
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

struct Inner {
    config: PostgresConfig,
    acquire: SqlStr,
    release: SqlStr,
    extend: SqlStr,
    is_locked: SqlStr,
    lookup_by_key: SqlStr,
    lookup_by_id: SqlStr,
    cleanup_key: SqlStr,
    sweep: SqlStr,
}

fn statement(sql: String) -> SqlStr {
    // Only validated identifiers (PostgresConfig::validate) are interpolated; values are bound.
    sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(Arc::<str>::from(sql)))
}

impl Inner {
    fn new(config: PostgresConfig) -> Result<Self, LockError> {
        config.validate()?;
        let Names {
            locks,
            acquire: acquire_fn,
            ..
        } = Names::new(&config);
        let now = now_ms!();
        let lookup = |column: &str| {
            statement(format!(
                "SELECT user_key, lock_id, expires_at_ms, acquired_at_ms, fence FROM {locks} \
                 WHERE {column} = $1 AND expires_at_ms > {now} - $2"
            ))
        };
        Ok(Self {
            acquire: statement(format!(
                "SELECT acquired, expires_at_ms, fence FROM {acquire_fn}($1, $2, $3, $4, $5, $6, $7)"
            )),
            // Resolve, verify ownership and liveness, and delete in one atomic statement. A
            // competing writer makes PostgreSQL re-check `lock_id` and expiry on the row's
            // newest version, so a lock taken over in between is never deleted.
            release: statement(format!(
                "WITH target AS (SELECT 1 FROM {locks} WHERE lock_id = $1), \
                 released AS (DELETE FROM {locks} WHERE lock_id = $1 AND expires_at_ms > {now} - $2 RETURNING 1) \
                 SELECT EXISTS (SELECT 1 FROM released) AS released, EXISTS (SELECT 1 FROM target) AS found"
            )),
            extend: statement(format!(
                "WITH target AS (SELECT 1 FROM {locks} WHERE lock_id = $1), \
                 clock AS (SELECT {now} AS ms), \
                 extended AS (UPDATE {locks} SET expires_at_ms = clock.ms + $2 FROM clock \
                   WHERE lock_id = $1 AND expires_at_ms > clock.ms - $3 RETURNING expires_at_ms) \
                 SELECT (SELECT expires_at_ms FROM extended) AS expires_at_ms, EXISTS (SELECT 1 FROM target) AS found"
            )),
            is_locked: statement(format!(
                "SELECT expires_at_ms > {now} - $2 AS live, expires_at_ms < {now} - $3 AS sweepable \
                 FROM {locks} WHERE key = $1"
            )),
            lookup_by_key: lookup("key"),
            lookup_by_id: lookup("lock_id"),
            cleanup_key: statement(format!(
                "DELETE FROM {locks} WHERE key = $1 AND expires_at_ms < {now} - $2"
            )),
            sweep: statement(format!(
                "DELETE FROM {locks} WHERE expires_at_ms < {now} - $1"
            )),
            config,
        })
    }
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

    /// Connects a pool with [`pool_options`](Self::pool_options) and builds the backend. The
    /// schema must exist (see [`setup_schema`]).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
    ///
    /// let backend = PostgresBackend::connect("postgres://app@db/app", PostgresConfig::new()).await?;
    /// setup_schema(backend.pool(), backend.config()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a bad configuration or URL;
    /// [`LockError::ServiceUnavailable`] at once when nothing listens at the URL's address;
    /// [`LockError::NetworkTimeout`] when connecting takes longer than the connect timeout;
    /// [`LockError::ServiceUnavailable`] when TLS fails (the server's certificate rejected, or
    /// an `sslmode` that needs TLS without the `postgres-tls` feature); other mapped
    /// connection errors (for example [`LockError::AuthFailed`]).
    pub async fn connect(url: &str, config: PostgresConfig) -> Result<Self, LockError> {
        config.validate()?;
        let options = PgConnectOptions::from_str(url).map_err(|e| {
            LockError::invalid_argument("invalid PostgreSQL connection URL").with_source(e)
        })?;
        let pool = Self::pool_options()
            .acquire_timeout(config.acquire_timeout())
            .connect_lazy_with(options);
        let backend = Self::new(pool, config)?;
        // Connect now, so that a wrong URL or a server that is down fails here.
        backend
            .session
            .run(|conn, _| boxed(sqlx::query("SELECT 1").execute(conn)))
            .await?;
        Ok(backend)
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

    async fn acquire_impl(&self, key: &str, ttl: Duration) -> Result<AcquireOutcome, LockError> {
        let key = normalize_key(key)?;
        let ttl_ms = ttl_millis(ttl)?;
        let storage_key = make_storage_key("", &key, STORAGE_KEY_LIMIT_BYTES, 0)?;
        let fence_key = make_fence_key("", &storage_key, STORAGE_KEY_LIMIT_BYTES, 0)?;
        let lock_id = LockId::generate();
        let (acquire, lookup_by_id) = (&self.inner.acquire, &self.inner.lookup_by_id);
        let in_doubt = AcquireInDoubt::new(self, &lock_id, ttl);
        let outcome = self
            .session
            .run(|conn, attempt| {
                let (key, storage_key, fence_key) =
                    (key.to_string(), storage_key.clone(), fence_key.clone());
                let lock_id = lock_id.as_str().to_owned();
                let (acquire, lookup_by_id) = (acquire.clone(), lookup_by_id.clone());
                boxed(async move {
                    let row = sqlx::query(acquire)
                        .bind(&storage_key)
                        .bind(&key)
                        .bind(&fence_key)
                        .bind(&lock_id)
                        .bind(as_bigint(ttl_ms))
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .bind(as_bigint(FENCE_MAX))
                        .fetch_one(&mut *conn)
                        .await?;
                    if attempt == Attempt::Retry && !row.try_get::<bool, _>(0)? {
                        // The first run may have taken the lock before its connection died:
                        // then the lock it finds is its own.
                        let own = sqlx::query(lookup_by_id)
                            .bind(&lock_id)
                            .bind(as_bigint(TIME_TOLERANCE_MS))
                            .fetch_optional(&mut *conn)
                            .await?;
                        return Ok(Acquired::from_lookup(own));
                    }
                    Ok(Acquired::Row(row))
                })
            })
            .await;
        match outcome {
            // A retry found another holder: the first run may still land, so the acquire stays
            // in doubt (released in the background when `in_doubt` drops).
            Ok(Acquired::HeldByAnother) => Ok(AcquireOutcome::Contended),
            Ok(Acquired::Row(row)) => {
                in_doubt.settle();
                if !row.try_get::<bool, _>(0).map_err(decode_error)? {
                    return Ok(AcquireOutcome::Contended);
                }
                let expires_at_ms = millis(&row, 1)?;
                let fence = Fence::new(millis(&row, 2)?)?;
                Ok(AcquireOutcome::Acquired(Lease::new(
                    lock_id,
                    expires_at_ms,
                    fence,
                )))
            }
            Ok(Acquired::OwnLock(row)) => {
                in_doubt.settle();
                let fence: String = row.try_get(4).map_err(decode_error)?;
                Ok(AcquireOutcome::Acquired(Lease::new(
                    lock_id,
                    millis(&row, 2)?,
                    fence.parse()?,
                )))
            }
            Err(error) => {
                in_doubt.settle_if_certain(&error);
                Err(error)
            }
        }
    }

    async fn release_impl(&self, lock_id: &LockId) -> Result<ReleaseOutcome, LockError> {
        let sql = &self.inner.release;
        let row = self
            .session
            .run(|conn, _| {
                boxed(
                    sqlx::query(sql.clone())
                        .bind(lock_id.as_str().to_owned())
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .fetch_one(conn),
                )
            })
            .await?;
        let released: bool = row.try_get(0).map_err(decode_error)?;
        let found: bool = row.try_get(1).map_err(decode_error)?;
        Ok(if released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld(Some(not_held_reason(found)))
        })
    }

    async fn extend_impl(
        &self,
        lock_id: &LockId,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let ttl_ms = ttl_millis(ttl)?;
        let sql = &self.inner.extend;
        let row = self
            .session
            .run(|conn, _| {
                boxed(
                    sqlx::query(sql.clone())
                        .bind(lock_id.as_str().to_owned())
                        .bind(as_bigint(ttl_ms))
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .fetch_one(conn),
                )
            })
            .await?;
        let expires_at_ms: Option<i64> = row.try_get(0).map_err(decode_error)?;
        let found: bool = row.try_get(1).map_err(decode_error)?;
        Ok(match expires_at_ms {
            Some(ms) => ExtendOutcome::Extended {
                expires_at_ms: to_millis(ms)?,
            },
            None => ExtendOutcome::NotHeld(Some(not_held_reason(found))),
        })
    }

    async fn is_locked_impl(&self, key: &str) -> Result<bool, LockError> {
        let key = normalize_key(key)?;
        let storage_key = make_storage_key("", &key, STORAGE_KEY_LIMIT_BYTES, 0)?;
        let sql = &self.inner.is_locked;
        let row = self
            .session
            .run(|conn, _| {
                boxed(
                    sqlx::query(sql.clone())
                        .bind(storage_key.clone())
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .bind(guarded_tolerance_ms())
                        .fetch_optional(conn),
                )
            })
            .await?;
        let Some(row) = row else { return Ok(false) };
        let live: bool = row.try_get(0).map_err(decode_error)?;
        let sweepable: bool = row.try_get(1).map_err(decode_error)?;
        if sweepable && self.inner.config.cleanup_in_is_locked() {
            self.spawn_cleanup(storage_key);
        }
        Ok(live)
    }

    /// Fire-and-forget deletion of one expired row; failures only cost a later retry.
    fn spawn_cleanup(&self, storage_key: String) {
        let backend = self.clone();
        tokio::spawn(async move {
            let sql = &backend.inner.cleanup_key;
            let deleted = backend
                .session
                .run(|conn, _| {
                    boxed(
                        sqlx::query(sql.clone())
                            .bind(storage_key.clone())
                            .bind(guarded_tolerance_ms())
                            .execute(conn),
                    )
                })
                .await;
            if let Err(error) = deleted {
                tracing::debug!(%error, "syncguard is_locked cleanup failed");
            }
        });
    }

    async fn lookup_impl(&self, query: Lookup<'_>) -> Result<Option<LockInfo>, LockError> {
        let (sql, value) = match query {
            Lookup::Key(key) => {
                let key = normalize_key(key)?;
                (
                    &self.inner.lookup_by_key,
                    make_storage_key("", &key, STORAGE_KEY_LIMIT_BYTES, 0)?,
                )
            }
            Lookup::LockId(lock_id) => (&self.inner.lookup_by_id, lock_id.as_str().to_owned()),
        };
        let row = self
            .session
            .run(|conn, _| {
                boxed(
                    sqlx::query(sql.clone())
                        .bind(value.clone())
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .fetch_optional(conn),
                )
            })
            .await?;
        let Some(row) = row else { return Ok(None) };
        let stored_id: String = row.try_get(1).map_err(decode_error)?;
        let stored_id = LockId::parse(&stored_id)
            .map_err(|_| LockError::internal("stored lock_id is malformed"))?;
        // Explicit ownership check (ADR-003), even though the query filtered on it.
        if let Lookup::LockId(lock_id) = query
            && stored_id != *lock_id
        {
            return Ok(None);
        }
        let fence: String = row.try_get(4).map_err(decode_error)?;
        Ok(Some(LockInfo::new(
            row.try_get(0).map_err(decode_error)?,
            stored_id,
            millis(&row, 2)?,
            millis(&row, 3)?,
            fence.parse()?,
        )))
    }
}

impl LockBackend for PostgresBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.acquire_impl(key, ttl))
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        Box::pin(self.release_impl(lock_id))
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(self.extend_impl(lock_id, ttl))
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(self.is_locked_impl(key))
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(self.lookup_impl(query))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("postgres", TimeAuthority::Server)
    }
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// What an acquire statement found.
enum Acquired {
    /// The acquire function's row: taken, or contended.
    Row(PgRow),
    /// A retried acquire found the lock its first run took (a lookup row).
    OwnLock(PgRow),
    /// A retried acquire found another holder.
    HeldByAnother,
}

impl Acquired {
    fn from_lookup(row: Option<PgRow>) -> Self {
        row.map_or(Self::HeldByAnother, Self::OwnLock)
    }
}

fn not_held_reason(found: bool) -> NotHeldReason {
    if found {
        NotHeldReason::Expired
    } else {
        NotHeldReason::NotFound
    }
}

fn guarded_tolerance_ms() -> i64 {
    as_bigint(TIME_TOLERANCE_MS + CLEANUP_GUARD_MS)
}

/// Our millisecond values (validated ttls, constants) always fit a BIGINT.
fn as_bigint(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn millis(row: &PgRow, index: usize) -> Result<u64, LockError> {
    to_millis(row.try_get::<i64, _>(index).map_err(decode_error)?)
}

fn to_millis(value: i64) -> Result<u64, LockError> {
    u64::try_from(value)
        .map_err(|_| LockError::internal(format!("stored timestamp {value} is negative")))
}

fn decode_error(error: sqlx::Error) -> LockError {
    LockError::internal("unexpected column in a syncguard PostgreSQL result").with_source(error)
}
