//! The LSC-table mode: a [`LockBackend`] on LockServiceCentral's own PostgreSQL `locks` table
//! (its documented schema and statements), so that `syncguard-server` processes and LSC
//! processes serve one table during a migration (`SYNCGUARD_LSC_TABLE=locks` with a
//! `postgres://` `SYNCGUARD_BACKEND_URL`).
//!
//! | syncguard | LSC's table `T` |
//! |---|---|
//! | key `namespace:lockName` (split at the first `:`) | the row `(namespace, lock_name)` |
//! | holder `{"owner","instanceId"}` (the server's) | the columns `owner`, `instance_id` |
//! | lock id | derived: base64url of the first 16 bytes of SHA-256 over `namespace \0 lock_name \0 owner \0 instance_id`; a row *is* a lock id when its current columns derive it, so an LSC takeover (which rewrites `owner`/`instance_id`) invalidates a stale lock id by itself |
//! | lock id → key | the side table `T_syncguard (lock_id, namespace, lock_name)`, written by the acquire statement (and by a key lookup of a live row, so that LSC-written rows can be renewed and released through the server), pruned to the current holder on acquire and release, and never trusted alone: release and extend re-derive the id from the row |
//! | fence | the counter table `T_fences (namespace, lock_name, fence)`, never deleted from, bumped by every acquisition through this backend that is not a same-holder re-entry, and (with the fence trigger) by LSC's own acquisitions |
//! | live | `expiry >= floor(DB now in s)` (LSC's inclusive second), reported as `expires_at_ms = expiry * 1000`, which syncguard's 1 s tolerance turns into the same predicate |
//! | acquired at | `(expiry − lease_duration) * 1000` |
//!
//! Statements (one round trip each; every decision on the database clock, `now()` floored to
//! the second; durations in whole seconds as LSC stores them):
//! - `acquire_as(key, D, holder)`: LSC's upsert (`INSERT ... ON CONFLICT DO UPDATE ... WHERE
//!   expired OR same owner+instance_id`, `expiry = now_s + D`, `lease_duration = D`), with the
//!   fence bump and the side-table row in data-modifying CTEs. A ttl that is not whole seconds
//!   is rounded up.
//! - `extend_by(lock id, by)`: LSC's renew (`expiry += by`, `lease_duration += by`), when the
//!   live row derives the lock id; `by` must be whole seconds.
//! - `extend(lock id, ttl)`: `expiry = now_s + ceil(ttl)`, the acquisition second kept.
//! - `release(lock id)`: LSC's guarded `DELETE` of the live row that derives the lock id (an
//!   expired row is left in place, as LSC leaves it).
//! - `acquire` without a holder is refused (`InvalidArgument`): LSC's rows need an owner.
//!
//! **LSC's own acquisitions and the fence.** LSC's statements know nothing of the counter. The
//! fence trigger ([`install_fence_trigger`](LscTableBackend::install_fence_trigger), which the
//! server installs at startup unless `SYNCGUARD_LSC_FENCE_TRIGGER=false`) closes that gap: an
//! `AFTER INSERT OR UPDATE` trigger on `T` that bumps `T_fences` whenever a write starts a new
//! hold (an insert, a change of `owner`/`instance_id`, or a holder taking its own expired row
//! again), so fences strictly increase across LSC's holders and the server's alike. The server's
//! acquire statement bumps the counter itself and marks its transaction
//! (`syncguard.lsc_fenced`), so the trigger leaves its writes alone; renewals never bump. The
//! trigger is the one change this mode makes to LSC's table (a trigger, no column): it needs the
//! table's owner, and it adds a counter upsert to LSC's acquisitions.
//!
//! Limits, documented rather than hidden:
//! - **Without the trigger, fences order this backend's acquisitions only.** A live row LSC
//!   wrote that this backend never acquired gets a counter of 1 when first looked up;
//!   re-entering a live LSC-written lock through the server keeps the current counter; a
//!   server acquisition after an LSC holder may get the token that holder was shown.
//! - **Clocks.** LSC computes `expiry` from its API server's clock and tests "expired" with
//!   `EXTRACT(EPOCH FROM now())::bigint`, which rounds: an LSC process takes over a row from
//!   `expiry + 0.5 s` of database time, this backend from `expiry + 1 s`. Run both on
//!   synchronized clocks.
//! - Owners, instance ids, namespaces and lock names longer than LSC's `VARCHAR(255)` are
//!   refused (`InvalidArgument`).

mod identity;
mod rows;
mod statements;

use std::sync::Arc;
use std::time::Duration;

use sqlx::{AssertSqlSafe, PgPool};
use syncguard::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, Lease, LockBackend, LockInfo, Lookup,
    ReleaseOutcome, TimeAuthority,
};
use syncguard::{Fence, LockError, LockId};

use identity::{derive_lock_id, holder_of, split_holder, split_key};
use rows::{Found, Taken};
use statements::Statements;

/// The longest table name PostgreSQL keeps whole.
const MAX_IDENTIFIER_LEN: usize = 63;

/// The suffix of the longest side table name (`T_syncguard`).
const LONGEST_SUFFIX: &str = "_syncguard";

/// A lock backend on LSC's PostgreSQL table, for migrations: see the crate docs.
#[derive(Clone)]
pub struct LscTableBackend {
    pool: PgPool,
    table: Arc<str>,
    sql: Arc<Statements>,
}

impl std::fmt::Debug for LscTableBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LscTableBackend")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// Checks a table name as LSC does (`^[a-zA-Z_][a-zA-Z0-9_]*$`, at most 63 characters), and
/// that our side tables' names (`<table>_syncguard`, `<table>_fences`) fit as well.
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](syncguard::ErrorCode::InvalidArgument) saying what is wrong.
pub fn validate_table_name(table: &str) -> Result<(), LockError> {
    let mut chars = table.chars();
    let well_formed = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !well_formed || table.len() > MAX_IDENTIFIER_LEN {
        return Err(LockError::invalid_argument(format!(
            "SYNCGUARD_LSC_TABLE `{table}` must match ^[a-zA-Z_][a-zA-Z0-9_]*$ and have at most {MAX_IDENTIFIER_LEN} characters"
        )));
    }
    if table.len() + LONGEST_SUFFIX.len() > MAX_IDENTIFIER_LEN {
        return Err(LockError::invalid_argument(format!(
            "SYNCGUARD_LSC_TABLE `{table}` is too long for its side tables (`{table}{LONGEST_SUFFIX}` exceeds {MAX_IDENTIFIER_LEN} characters); use at most {} characters",
            MAX_IDENTIFIER_LEN - LONGEST_SUFFIX.len()
        )));
    }
    Ok(())
}

impl LscTableBackend {
    /// The backend on `table` through `pool` (nothing is created: see [`setup`](Self::setup)).
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](syncguard::ErrorCode::InvalidArgument) for a table name
    /// [`validate_table_name`] refuses.
    pub fn new(pool: PgPool, table: &str) -> Result<Self, LockError> {
        validate_table_name(table)?;
        Ok(Self {
            pool,
            table: table.into(),
            sql: Arc::new(Statements::new(table)),
        })
    }

    /// Connects to `url` (syncguard's PostgreSQL pool options) and builds the backend.
    ///
    /// # Errors
    /// As [`new`](Self::new); connection failures.
    pub async fn connect(url: &str, table: &str) -> Result<Self, LockError> {
        validate_table_name(table)?;
        let pool = syncguard::PostgresBackend::pool_options()
            .connect(url)
            .await
            .map_err(map_error)?;
        Self::new(pool, table)
    }

    /// Creates what is missing: LSC's table with LSC's documented DDL (an existing one is
    /// never altered), `<table>_syncguard` and `<table>_fences`. Idempotent.
    ///
    /// # Errors
    /// Database errors (such as a missing `CREATE` privilege).
    pub async fn setup(&self) -> Result<(), LockError> {
        self.run_ddl(&self.sql.setup).await
    }

    /// Installs the fence trigger on LSC's table (see the module docs), replacing an older
    /// version of it; run [`setup`](Self::setup) first. Idempotent, and atomic: the table is
    /// never without the trigger once it had it.
    ///
    /// # Errors
    /// Database errors (such as not owning LSC's table).
    pub async fn install_fence_trigger(&self) -> Result<(), LockError> {
        self.run_ddl(&self.sql.install_fence_trigger).await
    }

    /// Runs `ddl` in one transaction, serialized with every other server doing the same:
    /// replicas starting together would otherwise collide in PostgreSQL's catalogs (`CREATE
    /// ... IF NOT EXISTS` and `CREATE OR REPLACE FUNCTION` are not safe against each other).
    async fn run_ddl(&self, ddl: &str) -> Result<(), LockError> {
        let mut tx = self.pool.begin().await.map_err(map_error)?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('syncguard:lsc_table_setup'))")
            .execute(&mut *tx)
            .await
            .map_err(map_error)?;
        // "already exists, skipping" notices at every start are noise; warnings still show.
        sqlx::query("SET LOCAL client_min_messages = warning")
            .execute(&mut *tx)
            .await
            .map_err(map_error)?;
        sqlx::raw_sql(AssertSqlSafe(ddl.to_owned()))
            .execute(&mut *tx)
            .await
            .map_err(map_error)?;
        tx.commit().await.map_err(map_error)
    }

    /// Whether LSC's table has the fence trigger (`false` when the table does not exist).
    ///
    /// # Errors
    /// Database errors.
    pub async fn has_fence_trigger(&self) -> Result<bool, LockError> {
        let (present,): (bool,) =
            sqlx::query_as(AssertSqlSafe(self.sql.has_fence_trigger.as_str()))
                .fetch_one(&self.pool)
                .await
                .map_err(map_error)?;
        Ok(present)
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// LSC's table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    async fn acquire_holder(
        &self,
        key: &str,
        ttl: Duration,
        holder: &str,
    ) -> Result<AcquireOutcome, LockError> {
        let (namespace, lock_name) = split_key(key)?;
        let (owner, instance_id) = split_holder(holder)?;
        let seconds = ceil_seconds(ttl)?;
        let lock_id = derive_lock_id(namespace, lock_name, &owner, &instance_id)?;
        let row = sqlx::query(AssertSqlSafe(self.sql.acquire.as_str()))
            .bind(namespace)
            .bind(lock_name)
            .bind(&owner)
            .bind(&instance_id)
            .bind(seconds)
            .bind(lock_id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_error)?;
        let Some(row) = row else {
            return Ok(AcquireOutcome::contended(None));
        };
        let Taken { expiry, fence } = Taken::read(&row)?;
        Ok(AcquireOutcome::Acquired(Lease::new(
            lock_id,
            expires_at_ms(expiry),
            fence_of(fence)?,
        )))
    }

    async fn update_expiry(
        &self,
        sql: &str,
        lock_id: &LockId,
        seconds: i64,
    ) -> Result<ExtendOutcome, LockError> {
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(lock_id.as_str())
            .bind(seconds)
            .fetch_optional(&self.pool)
            .await
            .map_err(map_error)?;
        Ok(match row {
            Some(row) => ExtendOutcome::Extended {
                expires_at_ms: expires_at_ms(rows::read(&row, "expiry")?),
            },
            None => ExtendOutcome::NotHeld(None),
        })
    }

    async fn release_id(&self, lock_id: &LockId) -> Result<ReleaseOutcome, LockError> {
        let row = sqlx::query(AssertSqlSafe(self.sql.release.as_str()))
            .bind(lock_id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_error)?;
        Ok(if row.is_some() {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld(None)
        })
    }

    async fn lookup_lock(&self, query: Lookup<'_>) -> Result<Option<LockInfo>, LockError> {
        let (namespace, lock_name, found) = match query {
            Lookup::Key(key) => {
                let (namespace, lock_name) = split_key(key)?;
                let row = sqlx::query(AssertSqlSafe(self.sql.lookup_key.as_str()))
                    .bind(namespace)
                    .bind(lock_name)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(map_error)?;
                let Some(row) = row else { return Ok(None) };
                (
                    namespace.to_owned(),
                    lock_name.to_owned(),
                    Found::read(&row)?,
                )
            }
            Lookup::LockId(lock_id) => {
                let row = sqlx::query(AssertSqlSafe(self.sql.lookup_id.as_str()))
                    .bind(lock_id.as_str())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(map_error)?;
                let Some(row) = row else { return Ok(None) };
                (
                    rows::read(&row, "namespace")?,
                    rows::read(&row, "lock_name")?,
                    Found::read(&row)?,
                )
            }
        };
        let Found {
            owner,
            instance_id,
            lease_duration: lease,
            expiry,
            fence,
        } = found;
        let lock_id = derive_lock_id(&namespace, &lock_name, &owner, &instance_id)?;
        let acquired_second = expiry.saturating_sub(lease);
        let info = LockInfo::new(
            format!("{namespace}:{lock_name}"),
            lock_id,
            expires_at_ms(expiry),
            expires_at_ms(acquired_second),
            // Only a concurrent first lookup of an LSC-written row leaves no counter visible.
            fence_of(fence.or(Some(1)))?,
        );
        Ok(Some(
            info.with_holder(Some(holder_of(&owner, &instance_id))),
        ))
    }

    async fn locked(&self, key: &str) -> Result<bool, LockError> {
        let (namespace, lock_name) = split_key(key)?;
        let row = sqlx::query(AssertSqlSafe(self.sql.is_locked.as_str()))
            .bind(namespace)
            .bind(lock_name)
            .fetch_one(&self.pool)
            .await
            .map_err(map_error)?;
        rows::read(&row, "locked")
    }
}

impl LockBackend for LscTableBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        let _ = (key, ttl);
        Box::pin(async {
            Err(LockError::invalid_argument(
                "the LSC-table backend needs a holder (LSC's rows have an owner and instanceId): use acquire_as",
            ))
        })
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        Box::pin(self.release_id(lock_id))
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(async move {
            let seconds = ceil_seconds(ttl)?;
            self.update_expiry(&self.sql.extend, lock_id, seconds).await
        })
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(self.locked(key))
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(self.lookup_lock(query))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("postgres-lsc-table", TimeAuthority::Server).with_holders()
    }

    fn acquire_as<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.acquire_holder(key, ttl, holder))
    }

    fn extend_by<'a>(
        &'a self,
        lock_id: &'a LockId,
        by: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(async move {
            syncguard::backend::time::ttl_millis(by)?;
            if by.subsec_nanos() != 0 {
                return Err(LockError::invalid_argument(format!(
                    "the LSC-table backend extends by whole seconds, got {by:?}"
                )));
            }
            let seconds = seconds_i64(by.as_secs())?;
            self.update_expiry(&self.sql.extend_by, lock_id, seconds)
                .await
        })
    }
}

/// A ttl in whole seconds, rounded up (checked as syncguard checks ttls).
fn ceil_seconds(ttl: Duration) -> Result<i64, LockError> {
    let ms = syncguard::backend::time::ttl_millis(ttl)?;
    seconds_i64(ms.div_ceil(1000))
}

fn seconds_i64(seconds: u64) -> Result<i64, LockError> {
    i64::try_from(seconds).map_err(|_| LockError::invalid_argument("duration out of range"))
}

/// An `expiry` second as the syncguard expiry: `expiry * 1000` (see the module docs).
fn expires_at_ms(second: i64) -> u64 {
    u64::try_from(second).unwrap_or(0).saturating_mul(1000)
}

fn fence_of(value: Option<i64>) -> Result<Fence, LockError> {
    let value = value.ok_or_else(|| LockError::internal("the acquisition has no fence counter"))?;
    Fence::new(u64::try_from(value).unwrap_or(0))
}

/// A sqlx error as a [`LockError`], with the driver's error as its source.
fn map_error(error: sqlx::Error) -> LockError {
    let mapped = match &error {
        sqlx::Error::Database(db) => LockError::internal(format!(
            "PostgreSQL refused a statement on the LSC table (SQLSTATE {})",
            db.code().unwrap_or_default()
        )),
        sqlx::Error::Io(_) => LockError::service_unavailable("PostgreSQL is unreachable"),
        sqlx::Error::PoolTimedOut => {
            LockError::network_timeout("timed out waiting for a PostgreSQL connection")
        }
        sqlx::Error::PoolClosed => LockError::service_unavailable("the PostgreSQL pool is closed"),
        sqlx::Error::Configuration(_) => {
            LockError::invalid_argument("invalid PostgreSQL connection settings")
        }
        _ => LockError::internal("unexpected error from the PostgreSQL driver (sqlx)"),
    };
    mapped.with_source(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert!(validate_table_name("locks").is_ok());
        assert!(validate_table_name("_Locks_2").is_ok());
        assert!(validate_table_name("2locks").is_err());
        assert!(validate_table_name("locks;drop").is_err());
        assert!(validate_table_name("").is_err());
        assert!(validate_table_name(&"a".repeat(53)).is_ok());
        assert!(validate_table_name(&"a".repeat(54)).is_err());
    }

    #[test]
    fn seconds() {
        assert_eq!(ceil_seconds(Duration::from_secs(60)).unwrap(), 60);
        assert_eq!(ceil_seconds(Duration::from_millis(1500)).unwrap(), 2);
        assert!(ceil_seconds(Duration::ZERO).is_err());
        assert_eq!(expires_at_ms(1_727_000_060), 1_727_000_060_000);
    }
}
