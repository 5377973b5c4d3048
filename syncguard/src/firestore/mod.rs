//! The Cloud Firestore backend (feature `firestore`), on the [`firestore`] crate (gRPC).
//!
//! Firestore has no server clock a transaction can read, so **each client's clock decides
//! expiry**, as in the reference design: every client must keep its clock NTP-synchronized
//! (see [clocks](#clocks)).
//!
//! ```no_run
//! use std::time::Duration;
//! use syncguard::LockOptions;
//! use syncguard::firestore::FirestoreBackend;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), syncguard::LockError> {
//!     // Application Default Credentials, or FIRESTORE_EMULATOR_HOST for the emulator.
//!     let backend = FirestoreBackend::connect("my-project").await?;
//!     let options = LockOptions::builder().ttl(Duration::from_secs(30)).build()?;
//!     let guard = syncguard::acquire(&backend, "job:42", &options).await?;
//!     println!("fence {}", guard.fence());
//!     guard.release().await?;
//!     Ok(())
//! }
//! ```
//!
//! ## Making a backend
//!
//! As every network backend's:
//!
//! - [`FirestoreBackend::connect(project_id)`](FirestoreBackend::connect): the default
//!   configuration;
//! - [`FirestoreBackend::connect_with(project_id, config)`](FirestoreBackend::connect_with):
//!   every other setting is in the [`FirestoreConfig`];
//! - [`FirestoreBackend::new(db, config)`](FirestoreBackend::new): on a [`FirestoreDb`] of
//!   yours (another database than the default, a client with options of yours).
//!
//! The [`firestore`] crate syncguard is built with is re-exported here, so that
//! a client of yours is of the same version:
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use syncguard::firestore::{FirestoreBackend, FirestoreConfig, firestore};
//!
//! let options = firestore::FirestoreDbOptions::new("my-project".to_owned())
//!     .with_database_id("locks-db".to_owned());
//! let db = firestore::FirestoreDb::with_options(options).await?;
//! let backend = FirestoreBackend::new(db, FirestoreConfig::new())?;
//! # let _ = backend; Ok(()) }
//! ```
//!
//! ## Setup
//!
//! The `firestore` crate authenticates with Google's Application Default Credentials: the
//! service account key named by `GOOGLE_APPLICATION_CREDENTIALS`, `gcloud auth
//! application-default login`, or the metadata server on Google Cloud. The account needs read
//! and write access to the two collections (role `roles/datastore.user`). Nothing else needs
//! creating: collections appear with their first document, and the queries by `lockId` use
//! Firestore's automatic single-field index (if you manage indexes yourself, keep a
//! single-field ascending index on `lockId` in the lock collection).
//!
//! For the **emulator** (`gcloud components install cloud-firestore-emulator`, needs Java),
//! start it and set `FIRESTORE_EMULATOR_HOST=127.0.0.1:<port>`: the client then uses no
//! credentials, and any project id works.
//!
//! ## Storage layout and compatibility
//!
//! Storage follows the reference design, so a TypeScript SyncGuard service on the same
//! collections shares the locks:
//!
//! | what | collection (default) | document id | fields |
//! |---|---|---|---|
//! | lock, one per locked key | `locks` | [`make_storage_key("", key, 1500, 0)`](crate::backend::key::make_storage_key), e.g. `job:42` | `lockId`, `expiresAtMs`, `acquiredAtMs` (integers), `key`, `fence` (15-digit string); `holder` (string, only on a lock taken by [`acquire_as`](crate::LockBackend::acquire_as), absent otherwise: see [holders](#holders)) |
//! | fence counter, one per key ever locked, **never deleted** | `fence_counters` | [`make_fence_key("", lock document id, 1500, 0)`](crate::backend::key::make_fence_key), e.g. `fence:job:42` | `fence` (15-digit string, parsed and incremented as an integer, never through a float), `keyDebug` |
//!
//! [`FirestoreConfig`] names other collections. Document ids cannot contain `/`, so keys
//! containing `/` (and the reserved ids `.`, `..` and `__name__`) are rejected with
//! [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) before any I/O. Keys holding
//! code points unassigned in one side's Unicode version can be stored under two names: see
//! [`key`](crate::backend::key#unicode-the-limit-of-the-compatibility-promise).
//!
//! ## Transactions
//!
//! Every operation does all its reads first, then commits all its writes in one transaction,
//! each write conditioned on its document being unchanged since it was read (its update time,
//! or its absence). The commit is the atomicity point: of two acquires that saw the key free,
//! only one commit's preconditions hold. Acquire reads its two documents directly (single
//! document reads are strongly consistent); release, extend and lookup by lock id query the
//! lock collection by `lockId` inside a read-only transaction, a consistent snapshot, and
//! verify `lockId` on what they find. Read-write transactions that lock what they read are
//! deliberately not used: two of them that read one document and then write it wait on each
//! other until Firestore aborts them, which the emulator does only after 2 s, and under steady
//! contention from several clients no one got through.
//!
//! When a commit finds a document changed since its snapshot (a concurrent operation on the
//! same key got there first) or Firestore aborts it (`ABORTED`), the operation runs again
//! from its reads, up to [`FirestoreConfig::with_max_transaction_retries`] times (10 by
//! default) after randomized pauses (up to 20 ms, doubling to at most 500 ms: about 3 s in all
//! at worst). So contention on a key shows up as [`AcquireOutcome::Contended`], not as an
//! error; if the retries run out, the operation fails with
//! [`ErrorCode::ServiceUnavailable`](crate::ErrorCode::ServiceUnavailable)
//! (retryable). Within one process, acquires of one key also take turns before their commit,
//! so they do not conflict at all. Waiting for a held lock is left to
//! [`acquire`](crate::acquire())'s retry policy, as for every backend.
//!
//! Release, extend and lookup by lock id query without a limit, so they see every lock
//! document carrying the id. Two documents with one lock id cannot come from this library (ids
//! are 128 random bits); if it happens anyway (documents copied by hand, say), a warning is
//! logged, and when more than one of them is live none is released, extended or reported.
//!
//! ## Holders
//!
//! [`acquire_as`](crate::LockBackend::acquire_as) stores its holder in the lock document's
//! `holder` field; a lock taken without one has no such field (never `null`), as every
//! document the reference writes. The reference ignores the field, and its acquire of an
//! expired lock replaces the whole document, dropping it. A lock without holder is re-entered
//! by no one.
//!
//! `acquire_as` works as `acquire` does (its reads, then one commit conditioned on the lock
//! document being unchanged): a free or expired key is taken, with the holder; a live lock
//! taken by the same holder (compared byte for byte) is **re-entered**: the commit writes only
//! `expiresAtMs` (now + ttl) and `acquiredAtMs` (now), and the call answers with the lock's own
//! `lockId` and `fence` (the fence counter is not touched); any other live lock is
//! [`Contended`](crate::backend::AcquireOutcome::Contended).
//! [`extend_by`](crate::LockBackend::extend_by) adds to the live lock's `expiresAtMs` (capped
//! at 2^53 − 1, the largest integer a JavaScript number holds exactly) in a commit conditioned
//! as `extend`'s; a missing or expired lock is not held, and is never revived.
//! [`expire_at`](crate::LockBackend::expire_at) sets it to the time given, in the same way.
//!
//! A commit that conflicts is rejected whole (a failed precondition, or `ABORTED`), so the
//! operation's next run starts from what the store holds then: a retried `acquire_as` re-enters
//! a lock of its holder, or takes a free key, as a fresh call would. A commit of an
//! `acquire_as` whose answer is lost (a timeout, a dropped connection) fails the call and what
//! it may have written is left as it is, never released in the background (unlike a plain
//! acquire's: see [timeouts](#timeouts-and-acquires-in-doubt)): the lock id such a call took, or re-entered,
//! is handed to every later `acquire_as` of the same holder (in this process or another), and
//! releasing it would take the lock from under that caller. The holder's next `acquire_as` (a
//! client retrying after the error) re-enters the lock; otherwise it expires at its ttl, as a
//! crashed holder's does.
//!
//! The holder is stored as given, readable by anyone who may read the lock collection; it is
//! never logged or printed by this library.
//!
//! ## Timeouts and acquires in doubt
//!
//! Every operation returns within the
//! [operation timeout](FirestoreConfig::with_operation_timeout) (5 s by default: its reads,
//! its commit and the commit's retries), or fails with [`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout); Firestore
//! calls have no deadline of their own. Making the client in
//! [`connect_with`](FirestoreBackend::connect_with) is bounded by the
//! [connect timeout](FirestoreConfig::with_connect_timeout).
//!
//! An acquire whose outcome is unknown (it timed out, its commit failed without a clear
//! refusal, or its caller dropped it) may have written its lock, or may still write it when a
//! commit held up in the network arrives; nobody would hold that lock until its ttl ran out.
//! Its lock id is unique to the call (every run of its transaction writes the same one), so it
//! is released in the background by that id, which can never remove anyone else's lock: at
//! once, then again while it finds nothing, up to three times, an operation timeout apart
//! (and while the server is out of reach, until the lock's ttl is over). An `acquire_as` in
//! doubt is not released (see [holders](#holders)).
//!
//! ## Clocks
//!
//! Each client's clock ([`now_ms`], read after the operation's reads, before its commit)
//! decides expiry ([`TimeAuthority::Client`]). A lock is live while
//! `expiresAtMs > now - 1000`: the 1 s tolerance absorbs clock differences between clients,
//! and only that much. Run NTP on every client; **block deployment when a client is off by
//! ±500 ms or more, alert from ±200 ms, aim for ±100 ms**. A client whose clock runs ahead by
//! more than the tolerance can take a lock that another client still holds; if that cannot be
//! guaranteed, use the PostgreSQL or Redis backend, where the server's clock decides.
//!
//! ## Errors
//!
//! gRPC statuses map onto [`LockError`] as the reference's specification maps them, with the
//! `firestore` crate's error kept as the [`source`](std::error::Error::source):
//!
//! | error | [`LockError`] |
//! |---|---|
//! | `UNAVAILABLE`, `INTERNAL`, `ABORTED`, `CANCELLED`; a closed or failed connection | `ServiceUnavailable` |
//! | `DEADLINE_EXCEEDED`; a connection timeout; the operation or connect timeout | `NetworkTimeout` |
//! | `PERMISSION_DENIED`, `UNAUTHENTICATED`; no usable credentials when the client is made | `AuthFailed` |
//! | `INVALID_ARGUMENT`, `FAILED_PRECONDITION`; a project or database that does not exist | `InvalidArgument` |
//! | `RESOURCE_EXHAUSTED` (quota) | `RateLimited` |
//! | a document of an unexpected shape; anything else | `Internal` |
//!
//! A commit that conflicts (`ABORTED`, or a failed precondition of its own writes) is retried
//! as described under [transactions](#transactions) before any of this applies.
//!
//! [`now_ms`]: crate::backend::time::now_ms
//! [`TimeAuthority::Client`]: crate::backend::TimeAuthority::Client
//! [`AcquireOutcome::Contended`]: crate::backend::AcquireOutcome::Contended

mod config;
mod documents;
mod error;
mod in_doubt;
mod operations;
mod transaction;

use std::sync::Arc;

use ::firestore::FirestoreDb;

/// The firestore crate this backend is built with, so that your [`FirestoreDb`] is of the same
/// version.
pub use ::firestore;
pub use config::FirestoreConfig;
use error::map_error;

use crate::backend::ReleaseNotifier;
use crate::error::LockError;

/// Locks in Cloud Firestore (or its emulator), shared by every process using the same project,
/// database and collections.
///
/// Let [`connect`](Self::connect) (the default configuration) or
/// [`connect_with`](Self::connect_with) (a [`FirestoreConfig`] of yours) make the client, or
/// make it on a [`FirestoreDb`] you already have with [`new`](Self::new). Clones share the client. The
/// [module documentation](self) covers the credentials, the documents, the transactions, the
/// clock requirement and the errors.
///
/// ```no_run
/// use std::time::Duration;
/// use syncguard::LockBackend;
/// use syncguard::firestore::{FirestoreBackend, FirestoreConfig};
///
/// #[tokio::main]
/// async fn main() -> Result<(), syncguard::LockError> {
///     let db = syncguard::firestore::firestore::FirestoreDb::new("my-project")
///         .await
///         .expect("Firestore client (check the credentials)");
///     let config = FirestoreConfig::new().with_lock_collection("app_locks");
///     let backend = FirestoreBackend::new(db, config)?;
///     if let Some(lease) = backend.acquire("report:daily", Duration::from_secs(60)).await?.lease() {
///         println!("fence {}", lease.fence);
///         backend.release(&lease.lock_id).await?;
///     }
///     Ok(())
/// }
/// ```
#[derive(Clone)]
pub struct FirestoreBackend {
    db: FirestoreDb,
    config: FirestoreConfig,
    /// Acquire transactions of one process on one key take turns (striped by document id):
    /// Firestore's pessimistic locking makes concurrent read-then-write transactions on one
    /// document wait on each other until its lock timeout aborts all but one, which the
    /// emulator takes 2 s to do. Across processes, the retries on `ABORTED` deal with it.
    gates: Arc<[tokio::sync::Mutex<()>]>,
    /// Wakes this process's waiters on the releases made through this backend (and its
    /// clones); releases by other processes are found by polling.
    notifier: ReleaseNotifier,
}

const GATES: usize = 256;

impl std::fmt::Debug for FirestoreBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FirestoreBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl FirestoreBackend {
    /// A backend on `db`, a client of yours, with `config`. No I/O happens here.
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) naming the setting, for invalid or equal collection
    /// names, a bad timeout, or a setting only a client syncguard makes can apply
    /// ([`with_connect_timeout`](FirestoreConfig::with_connect_timeout)).
    ///
    /// ```no_run
    /// use syncguard::firestore::{FirestoreBackend, FirestoreConfig, firestore};
    ///
    /// #[tokio::main]
    /// async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ///     let db = firestore::FirestoreDb::new("my-project").await?;
    ///     let backend = FirestoreBackend::new(db, FirestoreConfig::new())?;
    ///     println!("{backend:?}");
    ///     Ok(())
    /// }
    /// ```
    pub fn new(db: FirestoreDb, config: FirestoreConfig) -> Result<Self, LockError> {
        if let Some(setting) = config.connect_only_setting() {
            return Err(LockError::invalid_argument(format!(
                "FirestoreConfig::{setting} applies only to the client that \
                 FirestoreBackend::connect_with makes; FirestoreBackend::new runs on your \
                 client: leave it out of the config"
            )));
        }
        Self::on_client(db, config)
    }

    fn on_client(db: FirestoreDb, config: FirestoreConfig) -> Result<Self, LockError> {
        config.validate()?;
        let gates = (0..GATES).map(|_| tokio::sync::Mutex::new(())).collect();
        Ok(Self {
            db,
            config,
            gates,
            notifier: ReleaseNotifier::new(),
        })
    }

    /// Makes a client for `project_id` (Application Default Credentials, or the emulator
    /// named by `FIRESTORE_EMULATOR_HOST`) and a backend on it with the default
    /// [`FirestoreConfig`] (collections `locks` and `fence_counters`);
    /// [`connect_with`](Self::connect_with) takes a configuration of yours.
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with).
    ///
    /// ```no_run
    /// use syncguard::firestore::FirestoreBackend;
    ///
    /// #[tokio::main]
    /// async fn main() -> Result<(), syncguard::LockError> {
    ///     let backend = FirestoreBackend::connect("my-project").await?;
    ///     println!("{:?}", backend.config());
    ///     Ok(())
    /// }
    /// ```
    pub async fn connect(project_id: &str) -> Result<Self, LockError> {
        Self::connect_with(project_id, FirestoreConfig::new()).await
    }

    /// Checks `config`, then makes a client for `project_id` (Application Default
    /// Credentials, or the emulator named by `FIRESTORE_EMULATOR_HOST`) within the
    /// [connect timeout](FirestoreConfig::with_connect_timeout), and the backend on it.
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a bad configuration (naming the setting) or an empty
    /// project id (before any I/O); [`ErrorCode::AuthFailed`](crate::ErrorCode::AuthFailed) when no usable credentials are
    /// found; [`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout) past the connect timeout; other client errors
    /// mapped as for operations.
    ///
    /// ```no_run
    /// use syncguard::firestore::{FirestoreBackend, FirestoreConfig};
    ///
    /// #[tokio::main]
    /// async fn main() -> Result<(), syncguard::LockError> {
    ///     let config = FirestoreConfig::new()
    ///         .with_lock_collection("app_locks")
    ///         .with_fence_collection("app_fence_counters");
    ///     let backend = FirestoreBackend::connect_with("my-project", config).await?;
    ///     println!("{:?}", backend.config());
    ///     Ok(())
    /// }
    /// ```
    pub async fn connect_with(
        project_id: &str,
        config: FirestoreConfig,
    ) -> Result<Self, LockError> {
        config.validate()?;
        if project_id.is_empty() {
            return Err(LockError::invalid_argument(
                "the Firestore project id is empty; pass your Google Cloud project id",
            ));
        }
        let within = config.connect_timeout();
        let db = tokio::time::timeout(within, FirestoreDb::new(project_id))
            .await
            .map_err(|_elapsed| {
                LockError::network_timeout(format!(
                    "could not make a Firestore client within the connect timeout ({within:?})"
                ))
            })?
            .map_err(map_error)?;
        Self::on_client(db, config)
    }

    /// The Firestore client.
    ///
    /// ```no_run
    /// # async fn f(backend: syncguard::firestore::FirestoreBackend) {
    /// let db: &syncguard::firestore::firestore::FirestoreDb = backend.db();
    /// # }
    /// ```
    pub fn db(&self) -> &FirestoreDb {
        &self.db
    }

    /// The configuration.
    ///
    /// ```no_run
    /// # async fn f(backend: syncguard::firestore::FirestoreBackend) {
    /// assert_eq!(backend.config().lock_collection(), "locks");
    /// # }
    /// ```
    pub fn config(&self) -> &FirestoreConfig {
        &self.config
    }
}
