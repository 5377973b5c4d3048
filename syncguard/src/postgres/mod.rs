//! The PostgreSQL backend (feature `postgres`), on a sqlx [`PgPool`].
//!
//! Tables, columns, key derivation, fence format and the per-key advisory lock are those of
//! the SyncGuard reference design, so Rust and TypeScript services can share the same tables
//! ([compatibility](#compatibility-with-the-typescript-reference)). The database server's
//! clock decides expiry. Every operation is **one statement**, so the caller waits for one
//! round trip, and the server does one exchange (a connection whose statement ended normally
//! is kept for the next statement, instead of going back to the pool, where sqlx 0.9 would
//! ping it; kept connections return to the pool after a second idle). An acquire of a key
//! without a row (the common case) is one plain statement that increments the fence counter
//! and inserts the lock; one that finds a row (refused, re-entering, replacing an expired
//! lock) calls a server-side function that [`setup_schema`] installs (the reference runs the
//! same steps as an eight-round-trip transaction). The first refusal on a key costs the two
//! statements; for a second after it, that key's acquires call the function at once, as
//! `acquire_as` always does. Release, extend, `extend_by`, `expire_at`, `is_locked` and lookups are single
//! statements whose `WHERE` clause checks ownership and liveness, so that a concurrent
//! writer makes PostgreSQL check them again on the newest row. Waiters wake when a lock is
//! released: releases are announced with `pg_notify` and heard on one listening connection
//! per backend ([waiting](#waiting)).
//!
//! The backend stores holders ([`Capabilities::holders`](crate::backend::Capabilities)):
//! [`acquire_as`](crate::backend::LockBackend::acquire_as) keeps the holder in the lock row and
//! re-enters that holder's live lock, so several processes (replicas of `syncguard-server`)
//! share the holders' locks through the tables.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
//! use syncguard::postgres::{PostgresBackend, setup_schema};
//! use syncguard::LockOptions;
//!
//! let backend = PostgresBackend::connect("postgres://app@db/app").await?;
//! // Once, at startup (or apply schema.sql).
//! setup_schema(backend.pool(), backend.config()).await?;
//!
//! syncguard::with_lock(&backend, "invoice:7", &LockOptions::default(), async |guard| {
//!     println!("fence {}", guard.fence());
//!     Ok::<_, syncguard::LockError>(())
//! })
//! .await?;
//! # Ok(()) }
//! ```
//!
//! ## Making a backend
//!
//! As every network backend's:
//!
//! - [`PostgresBackend::connect(url)`](PostgresBackend::connect): the default configuration;
//! - [`PostgresBackend::connect_with(url, config)`](PostgresBackend::connect_with): every other
//!   setting is in the [`PostgresConfig`];
//! - [`PostgresBackend::new(pool, config)`](PostgresBackend::new): on a [`PgPool`] of yours
//!   (built with [`PostgresBackend::pool_options`], so that checkouts cost no ping).
//!
//! The URL is a libpq-style `postgres://` or `postgresql://` URL; any other scheme is
//! [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) at once (a Redis URL names the Redis backend). The
//! [`sqlx`] crate syncguard is built with is re-exported here, so that a pool of yours is of
//! the same version:
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use syncguard::postgres::{PostgresBackend, PostgresConfig, sqlx};
//!
//! let pool: sqlx::PgPool = PostgresBackend::pool_options()
//!     .max_connections(20)
//!     .connect("postgres://app@db/app")
//!     .await?;
//! let config = PostgresConfig::new().with_operation_timeout(Duration::from_secs(1));
//! let backend = PostgresBackend::new(pool, config)?;
//! # let _ = backend; Ok(()) }
//! ```
//!
//! ## Tables
//!
//! [`setup_schema`] creates what is missing at startup; for migrations, [`SCHEMA_SQL`] (the
//! bundled `schema.sql`) is the same DDL for the default names, and
//! [`PostgresConfig::schema_sql`] renders it for yours. With the default names:
//!
//! | table | columns | indexes |
//! |---|---|---|
//! | `syncguard_locks`: one row per lock, live or expired | `key TEXT PRIMARY KEY` (the storage key), `lock_id TEXT` (22 base64url characters), `expires_at_ms BIGINT`, `acquired_at_ms BIGINT` (Unix ms, server time), `fence TEXT` (15 digits), `user_key TEXT` (the normalized key), `holder TEXT` (the holder given to `acquire_as`, `NULL` for none), `contended BOOLEAN` (whether an acquire was refused during this hold, so that its release wakes the waiters; `NULL`: not known), `unclaimed BOOLEAN` (`TRUE` while only the `acquire_as` that took it has used its lock id; `NULL` once claimed) | unique on `lock_id`; on `expires_at_ms` |
//! | `syncguard_fence_counters`: one row per key ever locked, **never deleted** | `fence_key TEXT PRIMARY KEY`, `fence BIGINT` (the last fence given), `key_debug TEXT` (the key) | |
//!
//! Every column is `NOT NULL` but `key_debug`, `holder` and `contended`. The acquire function,
//! `syncguard_locks_acquire(...)`, takes `pg_advisory_xact_lock(hashtext(storage key))`,
//! reads the key's row `FOR UPDATE`, and if no live lock is there increments the fence
//! counter and replaces the lock row (deletes the expired one, inserts the new one), with
//! `clock_timestamp()` as the time; given a holder, it re-enters a live lock stored with the
//! same holder instead (its expiry and acquisition time restart, its lock id, fence and
//! `contended` mark stay). A new lock is stored with `contended` false; a refusal marks the live
//! lock `contended` (see [waiting](#waiting)).
//! A counter that is not positive, or past the maximum, fails the call with nothing stored.
//! A trigger, `syncguard_clear_holder` (function `<locks>_clear_holder`), clears the holder
//! (and the `contended` mark, to `NULL`) of a row that an `UPDATE` gives another lock id (see the
//! [compatibility notes](#compatibility-with-the-typescript-reference)). [`PostgresConfig`]
//! sets other table names and a schema; the functions and the indexes are named after the
//! lock table (`<locks>_acquire`, `<locks>_clear_holder`, `idx_<locks>_lock_id`,
//! `idx_<locks>_expires`).
//!
//! Upgrading: [`setup_schema`] brings an existing installation (an older syncguard's, or tables
//! created by the TypeScript reference) up to date in place: it adds the `holder` and `contended`
//! columns (`ALTER TABLE ... ADD COLUMN IF NOT EXISTS holder TEXT`, and `contended BOOLEAN`;
//! existing rows have no holder, and their mark is not known, so that their releases are announced
//! as before), the trigger and the new acquire function. The columns and the trigger are added only
//! when the catalog lacks them, so that later runs never lock the table exclusively (an `ALTER
//! TABLE` would, even with `IF NOT EXISTS`, and would queue every lock operation behind any long
//! reader of the table, such as a `pg_dump`). Until it has run on a table without these
//! columns, acquires, releases and lookups fail with
//! [`ErrorCode::Internal`](crate::ErrorCode::Internal) saying to run it,
//! having changed nothing. The acquire function keeps its signature (the new version
//! replaces the old one in place, and older processes calling it get the new one); the one of
//! versions before holders (seven arguments) stays, for their processes still running during a
//! rolling upgrade. An older process that runs its own `setup_schema` puts back its acquire
//! function, which does not mark refusals: until a newer one runs it again, releases of locks taken
//! meanwhile are announced (that function stores no mark, which reads as not known), and those of
//! locks taken before may go unannounced, so that their waiters poll.
//!
//! Expired rows stay until a later acquire of the same key overwrites them,
//! [`PostgresBackend::sweep_expired`] deletes them, or (opt-in,
//! [`PostgresConfig::with_cleanup_in_is_locked`]) `is_locked` does. Nothing deletes from the
//! fence table.
//!
//! ## Compatibility with the TypeScript reference
//!
//! The tables and indexes are the reference's (its optional generated `expires_at_ts` and
//! `acquired_at_ts` columns may be added), plus the nullable `holder`, `contended` and `unclaimed`
//! columns, which the reference never names: its inserts leave them `NULL` (no holder: `acquire_as` does
//! not re-enter such a lock, and lookups show none; whether anyone was refused is not known:
//! our release of such a lock is announced), and its releases and extends keep them with the
//! lock they belong to. Its acquire over an expired lock, an upsert that sets every other
//! column, would leave the expired lock's holder on the new lock, so that this holder could
//! re-enter a lock a TypeScript service holds: the trigger clears the holder of every row
//! whose lock id an update changes (and its mark, so that a release of the new lock is not
//! kept silent by the old lock's), and this library's acquire replaces an expired row
//! (delete and insert) rather than updating it. Storage keys are
//! [`make_storage_key("", key, 1700, 0)`](crate::backend::key::make_storage_key) (longer keys are
//! hashed, see [`MAX_STORAGE_KEY_BYTES`]), fence keys the two-step
//! [`make_fence_key("", storage key, 1700, 0)`](crate::backend::key::make_fence_key), and fences the
//! BIGINT counter, written as 15 digits in the lock row (the first is `000000000000001`).
//! Acquires serialize on the same advisory lock as the reference's transaction (the plain
//! statement takes it without waiting, and leaves a key whose lock is taken to the function). So Rust and
//! TypeScript services sharing the tables keep mutual exclusion and fence order on every key;
//! a test runs this backend's acquires against the reference's eight-statement transaction on
//! one key and checks exactly that. TypeScript services do not need the acquire function.
//! They announce no releases (and ignore ours): our waiters find the locks they release by
//! polling ([waiting](#waiting)).
//! The one limit is Unicode: keys holding code points unassigned in one side's Unicode
//! version can be stored under two names (see [`key`](crate::backend::key#unicode-the-limit-of-the-compatibility-promise)).
//!
//! ## Waiting
//!
//! A waiting [`acquire`](crate::acquire) wakes when the lock is released, not only at its
//! retry policy's delays (see [`RetryPolicy`](crate::RetryPolicy#waking-on-release)):
//!
//! - **Marking.** A refused acquire (and `acquire_as`) marks the live lock `contended`, in the
//!   same call; only the first refusal of a hold writes, later ones just read. The acquire
//!   function keeps the row locked from its read to its commit, so a release racing a refusal
//!   either commits first (and the acquire takes the free lock) or waits for the mark and is
//!   announced: never in between. A refusal does not wait for its commit to be flushed
//!   (`synchronous_commit` is off for its transaction): a mark lost in a crash costs a
//!   notification, never a lock. (The acquire function marks whichever backend calls it, one
//!   with notifications off included.)
//! - **Announcing.** The release statement, when it deletes a live lock marked `contended` (or
//!   one whose mark is not known: written before the column was added, or by the TypeScript
//!   reference), also calls `pg_notify(<channel>, <key>)` with the normalized key (the
//!   `user_key` column) as the payload, in the same statement and round trip. NOTIFY is
//!   transactional: PostgreSQL delivers it when the release commits, and never for one that did
//!   not. A release of a lock nobody was refused (the common case) announces nothing, nor does a
//!   release that finds nothing live (repeated, or of an expired lock). The waiters of this
//!   process are woken by a release made through the backend (or a clone) they wait on even
//!   when it is not announced: those queued behind a waiter of theirs that took the lock wait
//!   for their turn without trying it, so they were never refused. The channel is
//!   [`PostgresConfig::release_channel`]: `<lock table>_released` by default
//!   (`syncguard_locks_released`), prefixed with `<schema>_` when a schema is set and the name
//!   fits PostgreSQL's 63 bytes, or one of your own
//!   ([`with_release_channel`](PostgresConfig::with_release_channel)). Every process sharing
//!   the tables should use the same channel.
//! - **Listening.** The first time something waits, the backend (all its clones together)
//!   opens one connection of its own and runs `LISTEN` on the channel. It is opened with the
//!   pool's connect options (URL, TLS, credentials; not the pool's `after_connect` hooks), under
//!   the application name `syncguard listener` (after the pool's own if it has one:
//!   `app (syncguard listener)`), outside the pool, so that it never takes a connection from
//!   lock operations. A task hands each notification to the waiters of this process: the first
//!   waiter of that key tries once (see [`ReleaseNotifier`](crate::backend::ReleaseNotifier)).
//!   The connection stays open until the last clone of the backend is dropped; then the task
//!   closes it and ends.
//! - **The holder's lease end.** A refused acquire (and `acquire_as`) reports the live holder's
//!   expiry, which the acquire function reads under its row lock anyway: a lock that expires
//!   without a release announces nothing, and its waiters try again when its lease (and the
//!   tolerance) ends.
//!
//! Announcements are hints, and waiting stays bounded by polling at the retry policy's delays
//! without them. A release goes unannounced when a peer does not notify (the TypeScript
//! reference's services never do, nor a backend with
//! [`with_release_notifications(false)`](PostgresConfig::with_release_notifications)), or when
//! it happens while the listening connection is down or before its first `LISTEN` took effect.
//! A lost connection is opened again at once (by sqlx's listener) or, while the server stays
//! out of reach, at growing intervals up to 30 s; a connection silent for 30 s is checked with
//! a query (within the operation timeout), so that one cut silently by a partition or a NAT is
//! noticed. Each time it listens again, the first waiter of every key tries once, in case its
//! release went by unheard. Waiters of one process take turns in arrival order; across
//! processes, each process's first waiter tries on a release, and one of them wins.
//!
//! What it costs:
//!
//! - **One connection per backend** (not per clone) once something has waited: count it in the
//!   server's `max_connections`. Several [`PostgresBackend::new`] on one pool open one each.
//! - **A NOTIFY per contended release**, and one write per contended hold (the mark). A NOTIFY
//!   alone is cheap, but PostgreSQL serializes the commits of all notifying transactions of a
//!   server (a global lock, held from just before commit until the commit is flushed), so
//!   concurrent notifying releases do not share their WAL flushes. Uncontended releases, which
//!   do not notify, cost the same as with notifications off: on a 2-core test machine
//!   (PostgreSQL 15, `fsync` on; medians of three 3-second runs of the ignored test
//!   `release_notification_cost` in `tests/postgres/waiting.rs`), acquire+release cycles on
//!   keys of their own made, with notifications on and off, about 1,190 and 1,170 per second
//!   with one task, 2,130 and 2,200 with 4, and 3,080 and 3,060 with 16 (when every release
//!   notified: 1,120 and 1,110, 1,590 and 1,920, 1,780 and 2,790). Refusals do not wait for their
//!   commit to be flushed: on the same machine, 4 clients refused on one key made about 9,500
//!   refusals per second at 0.42 ms, against 3,000 at 1.2–1.5 ms waiting for the flush. Where
//!   the throughput of contended releases matters more than waking on release, turn
//!   notifications off
//!   ([`with_release_notifications(false)`](PostgresConfig::with_release_notifications)):
//!   waiters then poll.
//! - Behind a proxy that pools connections by transaction (PgBouncer's `transaction` mode),
//!   `LISTEN` does not work: turn notifications off, or nothing is heard and waiters poll.
//! - PostgreSQL keeps each notification until every session listening at the time has read
//!   it (in a queue of 8 GB by default; a NOTIFY into a full queue fails, and with it the
//!   release). The listener reads continuously; the session of a listening connection cut off
//!   by a partition holds the queue back until the server's TCP gives up on it.
//!
//! ## Timeouts and retries
//!
//! Operations fail fast, within the timeouts of the [`PostgresConfig`] (its table gives the
//! defaults): every lock operation returns within the
//! [operation timeout](PostgresConfig::with_operation_timeout), end to end (the wait for a
//! pooled connection, the statement and its one retry); opening a connection is bounded by the
//! [connect timeout](PostgresConfig::with_connect_timeout) as well. Past them an operation
//! fails with [`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout): during a partition nothing waits longer. A server
//! that refuses connections (down, or the wrong port) is [`ErrorCode::ServiceUnavailable`](crate::ErrorCode::ServiceUnavailable) at
//! once. Callers share the pool in the order they asked, one statement per checkout.
//!
//! - A connection whose statement did not end normally (a timeout, an I/O error, a caller
//!   that dropped the operation) is closed, never reused.
//! - A connection found dead (a server restart, an administrator's `pg_terminate_backend`)
//!   costs no failed operation: the statement is retried once on a freshly opened connection.
//!   That connection is opened outside the pool, so the pool's `after_connect` hooks do not
//!   run on it: put session settings in the URL (`?options=-c%20search_path%3Dlocking`).
//! - Every statement is safe to run twice: extends and reads are idempotent, a repeated
//!   release finds nothing to release, and a retried acquire recognizes the lock its first run
//!   may have taken (with a holder, by re-entering it). The exception is `extend_by`, which
//!   adds its amount again if the first run was applied and only its answer lost; the answer
//!   still gives the lock's true expiry.
//! - An acquire whose outcome is unknown (it timed out, its connection failed, or its caller
//!   dropped it mid-statement) may still take the lock when its statement lands: its lock id
//!   is released in the background, up to three times, a little apart, so that the key is not
//!   held by nobody until its ttl. An `acquire_as` in doubt is released the same way, but
//!   only while its lock is `unclaimed`: a new lock taken with a holder is stored unclaimed,
//!   and any re-entry, extend or `expire_at` by its lock id claims it (a later `acquire_as`
//!   of the same holder, in this process or another, was handed that id, or someone renews
//!   it). A lost re-entry leaves no lock under the call's own lock id: nothing is released.
//!
//! ## Errors
//!
//! Database and driver errors map onto [`LockError`] as the reference's specification
//! classifies them. The message says what happened and what to do; the driver's error (the
//! server's, with its SQLSTATE, or the I/O error) is kept as the
//! [`source`](std::error::Error::source):
//!
//! | error | [`LockError`] |
//! |---|---|
//! | connection refused, reset or failed; SQLSTATE classes 08, 53, 57 (server shutdown, terminated backend) and 40 (serialization failure, deadlock); a closed pool; TLS failures | `ServiceUnavailable` |
//! | the connect and operation timeouts; a statement timeout (`57014`) | `NetworkTimeout` |
//! | every pooled connection busy past the operation timeout | `RateLimited` |
//! | `28000`, `28P01` (authentication), `42501` (no privilege) | `AuthFailed` |
//! | classes 22 and 23 (bad data); invalid connection settings; a URL of another scheme (before any I/O); a missing database (`3D000`, naming it) | `InvalidArgument` |
//! | missing tables, columns or acquire function (`42P01`, `42703`, `42883`: run [`setup_schema`]); a damaged or exhausted fence counter; anything else | `Internal` |
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

mod acquire;
mod config;
mod error;
mod in_doubt;
mod kept;
mod listener;
mod operations;
mod refused;
mod rows;
mod session;
mod statements;

use std::str::FromStr;
use std::sync::Arc;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool};

pub use config::PostgresConfig;
use error::map_error;
use listener::ReleaseListener;
use operations::guarded_tolerance_ms;
use refused::RecentlyRefused;
use session::{Session, boxed};
/// The sqlx crate this backend is built with, so that your [`PgPool`] is of the same version.
pub use sqlx;
use statements::Inner;

use crate::error::LockError;
use crate::url_scheme::{UrlBackend, check_url_scheme};

/// The schema for the default table names, as a migration file (`schema.sql`). For custom
/// names, [`PostgresConfig::schema_sql`] renders the same DDL.
pub const SCHEMA_SQL: &str = include_str!("schema.sql");

/// Longest storage key (bytes) before keys are hashed, as the reference design sets it for
/// PostgreSQL's B-tree entries.
pub const MAX_STORAGE_KEY_BYTES: usize = 1700;

/// Locks in PostgreSQL tables shared with the SyncGuard reference design.
///
/// Cheap to clone (the pool and prepared statement texts are shared). Make it with
/// [`connect`](Self::connect) (the default configuration), [`connect_with`](Self::connect_with)
/// (a [`PostgresConfig`] of your own), or [`new`](Self::new) on a pool of your own (built with
/// [`pool_options`](Self::pool_options), so that checkouts cost no ping), after
/// [`setup_schema`] (or the `schema.sql` migration).
///
/// Every operation takes a connection for one statement: the one the backend used last, if it
/// keeps one idle, else one from the pool. Connections the backend keeps go back to the pool
/// when they have idled for a second, have been out of it for a minute, or the pool is closed,
/// so that a pool shared with the application is not held by past bursts of locking. It
/// fails fast, within the timeouts of the configuration, and a connection found dead costs
/// no failed operation (see [timeouts and retries](self#timeouts-and-retries)).
/// Waiting for a held lock opens one more connection, outside the pool, on which the backend
/// and its clones hear of releases (see [waiting](self#waiting)); it closes when the last
/// clone is dropped.
#[derive(Clone)]
pub struct PostgresBackend {
    session: Arc<Session>,
    inner: Arc<Inner>,
    /// Wakes this process's waiters on announced releases; `None` when the configuration
    /// announces none ([`PostgresConfig::with_release_notifications`]).
    listener: Option<Arc<ReleaseListener>>,
    /// Keys whose acquires were refused lately: theirs skip the statement for free keys.
    refused: Arc<RecentlyRefused>,
}

/// Creates the tables, indexes, trigger and functions for `config`, if missing, adds the
/// `holder` and `contended` columns to a lock table created without them, and replaces the
/// functions with this version's (see [tables](self#tables)). Idempotent and safe to run from
/// several processes at once; run it at startup, or apply [`SCHEMA_SQL`] /
/// [`PostgresConfig::schema_sql`] as a migration instead.
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a bad configuration
/// (before any I/O) or a pool whose
/// database does not exist; mapped database errors (for example
/// [`ErrorCode::AuthFailed`](crate::ErrorCode::AuthFailed) without the `CREATE` privilege).
pub async fn setup_schema(pool: &PgPool, config: &PostgresConfig) -> Result<(), LockError> {
    let ddl = config.schema_sql()?;
    let mut tx = pool.begin().await.map_err(|e| map_error(e, Some(pool)))?;
    // Concurrent CREATE ... IF NOT EXISTS can still collide in the catalogs; serialize them.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('syncguard:setup_schema'))")
        .execute(&mut *tx)
        .await
        .map_err(|e| map_error(e, Some(pool)))?;
    // Once the schema exists, every CREATE ... IF NOT EXISTS makes the server send a notice
    // ("relation ... already exists, skipping"), which sqlx logs at INFO: four lines at every
    // start. Warnings still come through; the setting ends with the transaction.
    sqlx::query("SET LOCAL client_min_messages = warning")
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
    /// A backend on `pool`, a pool of yours, with `config`. No I/O happens here. The schema
    /// must exist (see [`setup_schema`]).
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) naming the setting, for invalid table or schema names or
    /// timeouts, or a setting only a pool syncguard opens can apply
    /// ([`with_max_connections`](PostgresConfig::with_max_connections): size your pool with
    /// [`PgPoolOptions::max_connections`] instead).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use syncguard::postgres::{PostgresBackend, PostgresConfig};
    ///
    /// let pool = PostgresBackend::pool_options().connect("postgres://app@db/app").await?;
    /// let backend = PostgresBackend::new(pool, PostgresConfig::new().with_schema("locking"))?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn new(pool: PgPool, config: PostgresConfig) -> Result<Self, LockError> {
        if let Some(setting) = config.connect_only_setting() {
            return Err(LockError::invalid_argument(format!(
                "PostgresConfig::{setting} applies only to the pool that \
                 PostgresBackend::connect_with opens; PostgresBackend::new runs on your pool: \
                 set it there (PgPoolOptions) and leave it out of the config"
            )));
        }
        Self::on_pool(pool, config)
    }

    /// A backend on `pool`, whichever made it.
    fn on_pool(pool: PgPool, config: PostgresConfig) -> Result<Self, LockError> {
        let inner = Inner::new(config)?;
        let listener = inner
            .config
            .release_notifications()
            .then(|| Arc::new(ReleaseListener::new()));
        Ok(Self {
            session: Arc::new(Session::new(pool, &inner.config)),
            inner: Arc::new(inner),
            listener,
            refused: Arc::default(),
        })
    }

    /// Pool options suited to lock traffic: sqlx's defaults, except that connections are not
    /// pinged on every checkout (`test_before_acquire(false)`), which would add a round trip
    /// to every operation; a dead connection is found by the statement instead, and the
    /// statement retried once on a fresh connection. Use them for your own pool too.
    pub fn pool_options() -> PgPoolOptions {
        PgPoolOptions::new().test_before_acquire(false)
    }

    /// Connects a pool of its own to `url` with the default [`PostgresConfig`];
    /// [`connect_with`](Self::connect_with) takes a configuration of yours. The schema must
    /// exist (see [`setup_schema`]).
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
    /// As [`connect_with`](Self::connect_with).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_with(url, PostgresConfig::new()).await
    }

    /// Checks `url` and `config`, connects a pool of its own (from
    /// [`pool_options`](Self::pool_options), of
    /// [`max_connections`](PostgresConfig::with_max_connections)) and makes the backend on
    /// it, connecting once so that a wrong URL or a server that is down fails here, within
    /// the [connect timeout](PostgresConfig::with_connect_timeout). The schema must exist
    /// (see [`setup_schema`]).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// use std::time::Duration;
    /// use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
    ///
    /// let config = PostgresConfig::new()
    ///     .with_lock_table("app_locks")
    ///     .with_fence_table("app_fence_counters")
    ///     .with_operation_timeout(Duration::from_secs(1));
    /// let backend = PostgresBackend::connect_with("postgres://app@db/app", config).await?;
    /// setup_schema(backend.pool(), backend.config()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Before any I/O, [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a URL whose scheme is not
    /// `postgres` or `postgresql` (naming the Redis backend for a Redis URL), a malformed URL,
    /// or a bad configuration (naming the setting); then
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a URL naming a database the server does not have;
    /// [`ErrorCode::ServiceUnavailable`](crate::ErrorCode::ServiceUnavailable) at once when nothing listens at the URL's address;
    /// [`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout) when connecting takes longer than the connect timeout;
    /// [`ErrorCode::ServiceUnavailable`](crate::ErrorCode::ServiceUnavailable) when TLS fails (the server's certificate rejected, or
    /// an `sslmode` that needs TLS without the `postgres-tls` feature); other mapped
    /// connection errors (for example [`ErrorCode::AuthFailed`](crate::ErrorCode::AuthFailed)).
    pub async fn connect_with(url: &str, config: PostgresConfig) -> Result<Self, LockError> {
        check_url_scheme(url, UrlBackend::Postgres)?;
        config.validate()?;
        let options = PgConnectOptions::from_str(url).map_err(|e| {
            LockError::invalid_argument("invalid PostgreSQL connection URL")
                .with_source(error::driver_error(e))
        })?;
        // The pool's own wait is only a backstop: each operation (and the first connection)
        // is bounded by its own budget, the operation or the connect timeout, whichever is
        // longer must not be cut short by the pool.
        let pool = Self::pool_options()
            .max_connections(config.max_connections())
            .acquire_timeout(config.operation_timeout().max(config.connect_timeout()))
            .connect_lazy_with(options);
        let backend = Self::on_pool(pool, config)?;
        // Connect now, so that a wrong URL or a server that is down fails here.
        backend
            .session
            .run_first(|conn, _| boxed(sqlx::query("SELECT 1").execute(conn)))
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

    /// Deletes expired lock rows (more than [`CLEANUP_GUARD_MS`](crate::backend::time::CLEANUP_GUARD_MS) past the tolerance) and
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
