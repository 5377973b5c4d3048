//! The Cloud Firestore backend (feature `firestore`), on the [`firestore`] crate (gRPC).
//!
//! Storage follows the reference design, so a TypeScript SyncGuard service on the same
//! collections shares the locks:
//!
//! - a **lock document** per locked key in the lock collection (default `locks`), with the id
//!   [`make_storage_key("", key, 1500, 0)`](crate::key::make_storage_key) and the fields
//!   `{lockId, expiresAtMs, acquiredAtMs, key, fence}`;
//! - a **fence counter document** per key ever locked in the fence collection (default
//!   `fence_counters`), with the two-step id [`make_fence_key`] and the fields
//!   `{fence, keyDebug}`, `fence` a 15-digit zero-padded decimal string. Fence documents are
//!   never deleted.
//!
//! Every operation does all its reads first, then commits all its writes in one transaction,
//! each write conditioned on its document being unchanged since it was read (its update time,
//! or its absence). The commit is the atomicity point: of two acquires that saw the key free,
//! only one commit's preconditions hold. Acquire reads its two documents directly (single
//! document reads are strongly consistent); release, extend and lookup by lock id query the
//! lock collection by `lockId` (Firestore's automatic single-field index serves it) inside a
//! read-only transaction, a consistent snapshot, and verify `lockId` on what they find.
//! Read-write transactions that lock what they read are deliberately not used: two of them
//! that read one document and then write it wait on each other until Firestore aborts them,
//! which the emulator does only after 2 s, and under steady contention from several clients
//! no one got through.
//!
//! **Time authority is the client**: expiry is decided by each client's clock ([`now_ms`],
//! read after the operation's reads, before its commit) with the common 1 s tolerance, so
//! every client must keep its clock NTP-synchronized, well within ±500 ms (alert at ±200 ms,
//! aim for ±100 ms). See [`FirestoreBackend`].
//!
//! ```no_run
//! use std::time::Duration;
//! use syncguard::LockOptions;
//! use syncguard::firestore::{FirestoreBackend, FirestoreConfig};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), syncguard::LockError> {
//!     // Application Default Credentials, or FIRESTORE_EMULATOR_HOST for the emulator.
//!     let backend = FirestoreBackend::connect("my-project", FirestoreConfig::new()).await?;
//!     let options = LockOptions::new("job:42").with_ttl(Duration::from_secs(30));
//!     let guard = syncguard::acquire(&backend, &options).await?;
//!     println!("fence {}", guard.fence());
//!     guard.release().await?;
//!     Ok(())
//! }
//! ```

mod config;
mod error;

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use firestore::errors::FirestoreError;
use firestore::gcloud_sdk::google::firestore::v1::Document;
use firestore::timestamp_utils::from_timestamp;
use firestore::{
    FirestoreConsistencySelector, FirestoreDb, FirestoreTransaction, FirestoreTransactionMode,
    FirestoreTransactionOptions, FirestoreWritePrecondition,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use config::FirestoreConfig;

use self::config::{MAX_ID_BYTES, id_problem};
use self::error::{is_aborted, is_conflict, map_error};
use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, Lease, LockBackend, LockInfo, Lookup,
    NotHeldReason, ReleaseOutcome, TimeAuthority,
};
use crate::key::{hash_key, make_fence_key, make_storage_key, normalize_key};
use crate::time::{is_live, now_ms, ttl_millis};
use crate::{Fence, LockError, LockId};

/// Locks in Cloud Firestore (or its emulator), shared by every process using the same project,
/// database and collections.
///
/// Build it from a [`FirestoreDb`] with [`new`](Self::new), or let
/// [`connect`](Self::connect) make the client. Clones share the client.
///
/// # Credentials and the emulator
/// The `firestore` crate authenticates with Google's Application Default Credentials: the
/// service account key named by `GOOGLE_APPLICATION_CREDENTIALS`, `gcloud auth
/// application-default login`, or the metadata server on Google Cloud. The account needs read
/// and write access to the two collections (role `roles/datastore.user`). With
/// `FIRESTORE_EMULATOR_HOST=host:port` set, the client talks to the emulator instead and needs
/// no credentials.
///
/// # Clocks
/// Firestore has no server clock a transaction can read, so, as in the reference design, each
/// client's clock decides expiry ([`TimeAuthority::Client`]). A lock is live while
/// `expiresAtMs > now - 1000`: the 1 s tolerance absorbs clock differences between clients,
/// and only that much. Run NTP on every client; block deployment when a client is off by
/// ±500 ms or more, alert from ±200 ms, aim for ±100 ms. A client whose clock runs ahead by
/// more than the tolerance can take a lock that another client still holds; if that cannot be
/// guaranteed, use the PostgreSQL or Redis backend, where the server's clock decides.
///
/// # Contention
/// Each operation is one logical attempt, but when its commit finds a document changed since
/// its snapshot (a concurrent operation on the same key got there first) or Firestore aborts
/// it (`ABORTED`), it runs again from its reads, up to
/// [`FirestoreConfig::with_max_transaction_retries`] times (10 by default) after randomized
/// pauses (up to 20 ms, doubling to at most 500 ms: about 3 s in all at worst). So contention on
/// a key shows up as [`AcquireOutcome::Contended`], not as an error; if the retries run out,
/// the operation fails with [`LockError::ServiceUnavailable`] (retryable). Within one process,
/// acquires of one key also take turns before their commit, so they do not conflict at all.
/// Waiting for a held lock is left to [`acquire`](crate::acquire)'s retry policy, as for
/// every backend.
///
/// # Duplicate lock ids
/// Release, extend and lookup by lock id query without a limit, so they see every lock
/// document carrying the id. Two documents with one lock id cannot come from this library (ids
/// are 128 random bits); if it happens anyway (documents copied by hand, say), a warning is
/// logged, and when more than one of them is live none is released, extended or reported.
///
/// # Keys
/// Document ids cannot contain `/`, so keys containing `/` (and the reserved ids `.`, `..` and
/// `__name__`) are rejected with [`LockError::InvalidArgument`] before any I/O.
///
/// ```no_run
/// use std::time::Duration;
/// use syncguard::LockBackend;
/// use syncguard::firestore::{FirestoreBackend, FirestoreConfig};
///
/// #[tokio::main]
/// async fn main() -> Result<(), syncguard::LockError> {
///     let db = firestore::FirestoreDb::new("my-project")
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
}

const GATES: usize = 256;

impl std::fmt::Debug for FirestoreBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FirestoreBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A lock document, field for field as the reference stores it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LockDocument {
    lock_id: String,
    expires_at_ms: Millis,
    acquired_at_ms: Millis,
    key: String,
    fence: String,
}

/// A fence counter document.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FenceDocument {
    fence: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_debug: Option<String>,
}

/// Unix milliseconds, written as a Firestore integer and read from an integer or (as a
/// JavaScript client may write it) a whole double.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Millis(u64);

impl Serialize for Millis {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Expiries are bounded by now + MAX_TTL, far inside i64.
        serializer.serialize_i64(i64::try_from(self.0).unwrap_or(i64::MAX))
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Millis;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a non-negative whole number of milliseconds")
            }
            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<Millis, E> {
                Ok(Millis(value))
            }
            fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<Millis, E> {
                u64::try_from(value)
                    .map(Millis)
                    .map_err(|_| E::custom("negative milliseconds"))
            }
            fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<Millis, E> {
                if value.is_finite()
                    && value >= 0.0
                    && value.fract() == 0.0
                    && value < 2f64.powi(63)
                {
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    Ok(Millis(value as u64))
                } else {
                    Err(E::custom(
                        "milliseconds must be a whole non-negative number",
                    ))
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A write planned from a snapshot, committed only if the document is still as it was read.
enum Write {
    SetLock(String, LockDocument, FirestoreWritePrecondition),
    SetFence(String, FenceDocument, FirestoreWritePrecondition),
    UpdateExpiry(String, LockDocument, FirestoreWritePrecondition),
    DeleteLock(String, FirestoreWritePrecondition),
}

/// A document as read: its id, its data, and the precondition that it is unchanged since.
struct Found<T> {
    id: String,
    data: T,
    unchanged: FirestoreWritePrecondition,
}

impl<T: serde::de::DeserializeOwned> Found<T> {
    fn from_document(document: &Document) -> Result<Self, FirestoreError> {
        let id = document
            .name
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let data = FirestoreDb::deserialize_doc_to::<T>(document)?;
        Ok(Self {
            id,
            data,
            unchanged: unchanged_since(Some(document))?,
        })
    }
}

/// The precondition that a document is as it was read (`None`: that it still does not exist).
fn unchanged_since(
    document: Option<&Document>,
) -> Result<FirestoreWritePrecondition, FirestoreError> {
    match document.and_then(|document| document.update_time) {
        Some(update_time) => Ok(FirestoreWritePrecondition::UpdateTime(from_timestamp(
            update_time,
        )?)),
        None => Ok(FirestoreWritePrecondition::Exists(false)),
    }
}

/// Why a transaction body stopped.
enum TxError {
    Store(FirestoreError),
    Lock(LockError),
    /// The commit found a document changed since it was read (or the transaction aborted).
    Conflict(FirestoreError),
}

impl From<FirestoreError> for TxError {
    fn from(error: FirestoreError) -> Self {
        Self::Store(error)
    }
}

impl From<LockError> for TxError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

/// What release and extend found for a lock id.
enum Resolved {
    /// Exactly one live document carries the lock id.
    Held(Found<LockDocument>),
    /// Why there is nothing to act on.
    NotHeld(Option<NotHeldReason>),
}

impl FirestoreBackend {
    /// A backend on an existing client, after validating `config`.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for invalid or equal collection names.
    ///
    /// ```no_run
    /// use syncguard::firestore::{FirestoreBackend, FirestoreConfig};
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
        config.validate()?;
        let gates = (0..GATES).map(|_| tokio::sync::Mutex::new(())).collect();
        Ok(Self { db, config, gates })
    }

    /// Validates `config`, then creates a client for `project_id` (Application Default
    /// Credentials, or the emulator named by `FIRESTORE_EMULATOR_HOST`) and the backend on it.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for an invalid configuration; [`LockError::AuthFailed`]
    /// when no usable credentials are found; other client errors mapped as for operations.
    ///
    /// ```no_run
    /// use syncguard::firestore::{FirestoreBackend, FirestoreConfig};
    ///
    /// #[tokio::main]
    /// async fn main() -> Result<(), syncguard::LockError> {
    ///     let backend = FirestoreBackend::connect("my-project", FirestoreConfig::new()).await?;
    ///     println!("{:?}", backend.config());
    ///     Ok(())
    /// }
    /// ```
    pub async fn connect(project_id: &str, config: FirestoreConfig) -> Result<Self, LockError> {
        config.validate()?;
        if project_id.is_empty() {
            return Err(LockError::invalid_argument(
                "the Firestore project id is empty; pass your Google Cloud project id",
            ));
        }
        let db = FirestoreDb::new(project_id).await.map_err(map_error)?;
        Self::new(db, config)
    }

    /// The Firestore client.
    ///
    /// ```no_run
    /// # async fn f(backend: syncguard::firestore::FirestoreBackend) {
    /// let db: &firestore::FirestoreDb = backend.db();
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

    /// The lock and fence document ids of a (valid, normalized) key.
    fn document_ids(key: &str) -> Result<(String, String), LockError> {
        let lock_doc = make_storage_key("", key, MAX_ID_BYTES, 0)?;
        if let Some(problem) = id_problem(&lock_doc) {
            return Err(LockError::invalid_argument(format!(
                "key {key:?} cannot be a Firestore document id: {problem}; use another separator \
                 (for example ':')"
            )));
        }
        let fence_doc = make_fence_key("", &lock_doc, MAX_ID_BYTES, 0)?;
        Ok((lock_doc, fence_doc))
    }

    /// Runs `body`'s reads (in a read-only transaction, a consistent snapshot that takes no
    /// document locks, when `snapshot`; as direct reads otherwise), then commits the writes it
    /// planned in one transaction, each conditioned on its document being unchanged since it
    /// was read; runs it all again on a conflict, within the retry budget.
    async fn transact<T, F, Fut>(&self, snapshot: bool, body: F) -> Result<T, LockError>
    where
        F: Fn(FirestoreDb) -> Fut,
        Fut: Future<Output = Result<(T, Vec<Write>), TxError>>,
    {
        let mut retries = 0;
        loop {
            let conflict = match self.attempt(snapshot, &body).await {
                Ok(value) => return Ok(value),
                Err(TxError::Conflict(error)) => error,
                Err(TxError::Store(error)) if is_aborted(&error) => error,
                Err(TxError::Store(error)) => return Err(map_error(error)),
                Err(TxError::Lock(error)) => return Err(error),
            };
            if retries >= self.config.max_transaction_retries() {
                return Err(if is_aborted(&conflict) {
                    map_error(conflict)
                } else {
                    LockError::service_unavailable(format!(
                        "the lock documents kept changing under {} attempts; try again",
                        retries + 1
                    ))
                    .with_source(conflict)
                });
            }
            retries += 1;
            // Full jitter, so that operations that conflicted once do not meet again.
            let cap = (10_u64 << retries.min(6)).min(500);
            let pause = rand::random_range(1..=cap);
            tracing::debug!(
                retries,
                pause_ms = pause,
                "Firestore documents changed under a syncguard operation; running it again"
            );
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    async fn attempt<T, F, Fut>(&self, snapshot: bool, body: &F) -> Result<T, TxError>
    where
        F: Fn(FirestoreDb) -> Fut,
        Fut: Future<Output = Result<(T, Vec<Write>), TxError>>,
    {
        let (value, writes) =
            if snapshot {
                let read_only = FirestoreTransactionOptions {
                    mode: FirestoreTransactionMode::ReadOnly,
                    ..FirestoreTransactionOptions::default()
                };
                let snapshot = self.db.begin_transaction_with_options(read_only).await?;
                let reader = self.db.clone_with_consistency_selector(
                    FirestoreConsistencySelector::Transaction(snapshot.transaction_id().clone()),
                );
                let planned = body(reader).await;
                snapshot.rollback().await.ok();
                planned?
            } else {
                // Direct reads of single documents: each is strongly consistent, and the commit's
                // preconditions check that none changed since, as a snapshot would.
                body(self.db.clone()).await?
            };
        if writes.is_empty() {
            return Ok(value);
        }
        // Every read is done; now the writes, atomically, in one commit.
        let mut transaction = self.db.begin_transaction().await?;
        if let Err(error) = self.queue(&mut transaction, writes) {
            transaction.rollback().await.ok();
            return Err(error.into());
        }
        transaction.commit().await.map_err(|error| {
            if is_conflict(&error) {
                TxError::Conflict(error)
            } else {
                TxError::Store(error)
            }
        })?;
        Ok(value)
    }

    fn queue(
        &self,
        transaction: &mut FirestoreTransaction<'_>,
        writes: Vec<Write>,
    ) -> Result<(), FirestoreError> {
        let (locks, fences) = (
            self.config.lock_collection(),
            self.config.fence_collection(),
        );
        for write in writes {
            match write {
                Write::SetLock(id, document, unchanged) => {
                    self.db
                        .fluent()
                        .update()
                        .in_col(locks)
                        .precondition(unchanged)
                        .document_id(id)
                        .object(&document)
                        .add_to_transaction(transaction)?;
                }
                Write::SetFence(id, document, unchanged) => {
                    self.db
                        .fluent()
                        .update()
                        .in_col(fences)
                        .precondition(unchanged)
                        .document_id(id)
                        .object(&document)
                        .add_to_transaction(transaction)?;
                }
                Write::UpdateExpiry(id, document, unchanged) => {
                    self.db
                        .fluent()
                        .update()
                        .fields(["expiresAtMs"])
                        .in_col(locks)
                        .precondition(unchanged)
                        .document_id(id)
                        .object(&document)
                        .add_to_transaction(transaction)?;
                }
                Write::DeleteLock(id, unchanged) => {
                    self.db
                        .fluent()
                        .delete()
                        .from(locks)
                        .precondition(unchanged)
                        .document_id(id)
                        .add_to_transaction(transaction)?;
                }
            }
        }
        Ok(())
    }

    /// Reads the document `id` of `collection` (inside a transaction when `reader` is bound to
    /// one), with the precondition that it is unchanged since.
    async fn read<T: serde::de::DeserializeOwned>(
        reader: &FirestoreDb,
        collection: &str,
        id: &str,
    ) -> Result<(Option<T>, FirestoreWritePrecondition), FirestoreError> {
        let document = reader
            .fluent()
            .select()
            .by_id_in(collection)
            .one(id)
            .await?;
        let data = document
            .as_ref()
            .map(FirestoreDb::deserialize_doc_to::<T>)
            .transpose()?;
        Ok((data, unchanged_since(document.as_ref())?))
    }

    /// Reads the lock document with `id`.
    async fn read_lock(
        &self,
        reader: &FirestoreDb,
        id: &str,
    ) -> Result<Option<LockDocument>, FirestoreError> {
        Ok(Self::read(reader, self.config.lock_collection(), id)
            .await?
            .0)
    }

    /// Every lock document carrying `lock_id` (no limit: duplicates must be seen), with ids.
    async fn query_lock_id(
        &self,
        reader: &FirestoreDb,
        lock_id: &LockId,
    ) -> Result<Vec<Found<LockDocument>>, FirestoreError> {
        let documents = reader
            .fluent()
            .select()
            .from(self.config.lock_collection())
            .filter(|q| q.for_all([q.field("lockId").eq(lock_id.as_str())]))
            .query()
            .await?;
        documents.iter().map(Found::from_document).collect()
    }

    /// Picks the one live document of `lock_id` among `found`, checking ownership (ADR-003)
    /// and refusing to act on live duplicates.
    fn resolve(found: Vec<Found<LockDocument>>, lock_id: &LockId, now: u64) -> Resolved {
        let owned: Vec<_> = found
            .into_iter()
            .filter(|found| found.data.lock_id == lock_id.as_str())
            .collect();
        if owned.is_empty() {
            return Resolved::NotHeld(Some(NotHeldReason::NotFound));
        }
        let total = owned.len();
        let mut live: Vec<_> = owned
            .into_iter()
            .filter(|found| is_live(found.data.expires_at_ms.0, now))
            .collect();
        if total > 1 {
            tracing::warn!(
                lock_id_hash = %hash_key(lock_id.as_str()),
                documents = total,
                live = live.len(),
                "syncguard: several Firestore lock documents carry one lock id; acting only if \
                 exactly one of them is live"
            );
        }
        match live.len() {
            0 => Resolved::NotHeld(Some(NotHeldReason::Expired)),
            1 => Resolved::Held(live.pop().expect("one live document")),
            _ => Resolved::NotHeld(None),
        }
    }

    /// The public view of a stored, live lock document.
    fn info(data: LockDocument) -> Result<LockInfo, LockError> {
        let lock_id = LockId::parse(&data.lock_id).map_err(|error| {
            LockError::internal(format!(
                "a Firestore lock document holds a malformed lockId: {error}"
            ))
        })?;
        Ok(LockInfo::new(
            data.key,
            lock_id,
            data.expires_at_ms.0,
            data.acquired_at_ms.0,
            Fence::new(parse_fence(&data.fence)?)?,
        ))
    }

    async fn acquire_once(&self, key: &str, ttl: Duration) -> Result<AcquireOutcome, LockError> {
        let key = normalize_key(key)?.into_owned();
        let ttl_ms = ttl_millis(ttl)?;
        let (lock_doc, fence_doc) = Self::document_ids(&key)?;
        // A plain read first: while the key is held (the common case under contention) the
        // answer is Contended at once, without waiting for a turn. The read saw a live lock
        // during this call, which is all Contended claims.
        let seen = self
            .read_lock(&self.db, &lock_doc)
            .await
            .map_err(map_error)?;
        if seen.is_some_and(|lock| is_live(lock.expires_at_ms.0, now_ms())) {
            return Ok(AcquireOutcome::Contended);
        }
        let mut hasher = std::hash::DefaultHasher::new();
        lock_doc.hash(&mut hasher);
        let gate = &self.gates[(hasher.finish() % GATES as u64) as usize];
        let _turn = gate.lock().await;
        let (key, lock_doc, fence_doc) = (&key, &lock_doc, &fence_doc);
        self.transact(false, |reader| async move {
            let (current, lock_unchanged) =
                Self::read::<LockDocument>(&reader, self.config.lock_collection(), lock_doc)
                    .await?;
            if current.is_some_and(|lock| is_live(lock.expires_at_ms.0, now_ms())) {
                return Ok((AcquireOutcome::Contended, Vec::new()));
            }
            let (counter, fence_unchanged) =
                Self::read::<FenceDocument>(&reader, self.config.fence_collection(), fence_doc)
                    .await?;
            // The authoritative time of this acquisition, taken after its reads and before the
            // commit that writes it.
            let now = now_ms();
            let previous = match &counter {
                Some(counter) => parse_fence(&counter.fence)?,
                None => 0,
            };
            let fence = Fence::new(previous.saturating_add(1))?;
            let fence_text = format!("{:015}", fence.get());
            let lock_id = LockId::generate();
            let expires_at_ms = now + ttl_ms;
            let writes = vec![
                Write::SetFence(
                    fence_doc.clone(),
                    FenceDocument {
                        fence: fence_text.clone(),
                        key_debug: Some(key.clone()),
                    },
                    fence_unchanged,
                ),
                Write::SetLock(
                    lock_doc.clone(),
                    LockDocument {
                        lock_id: lock_id.as_str().to_owned(),
                        expires_at_ms: Millis(expires_at_ms),
                        acquired_at_ms: Millis(now),
                        key: key.clone(),
                        fence: fence_text,
                    },
                    lock_unchanged,
                ),
            ];
            let lease = Lease::new(lock_id, expires_at_ms, fence);
            Ok((AcquireOutcome::Acquired(lease), writes))
        })
        .await
    }

    async fn release_once(&self, lock_id: &LockId) -> Result<ReleaseOutcome, LockError> {
        self.transact(true, |reader| async move {
            let found = self.query_lock_id(&reader, lock_id).await?;
            let now = now_ms();
            Ok(match Self::resolve(found, lock_id, now) {
                Resolved::Held(held) => (
                    ReleaseOutcome::Released,
                    vec![Write::DeleteLock(held.id, held.unchanged)],
                ),
                Resolved::NotHeld(reason) => (ReleaseOutcome::NotHeld(reason), Vec::new()),
            })
        })
        .await
    }

    async fn extend_once(
        &self,
        lock_id: &LockId,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let ttl_ms = ttl_millis(ttl)?;
        self.transact(true, |reader| async move {
            let found = self.query_lock_id(&reader, lock_id).await?;
            let now = now_ms();
            Ok(match Self::resolve(found, lock_id, now) {
                Resolved::Held(mut held) => {
                    let expires_at_ms = now + ttl_ms;
                    held.data.expires_at_ms = Millis(expires_at_ms);
                    (
                        ExtendOutcome::Extended { expires_at_ms },
                        vec![Write::UpdateExpiry(held.id, held.data, held.unchanged)],
                    )
                }
                Resolved::NotHeld(reason) => (ExtendOutcome::NotHeld(reason), Vec::new()),
            })
        })
        .await
    }

    /// The live lock document on `key`, by direct read.
    async fn live_by_key(&self, key: &str) -> Result<Option<LockDocument>, LockError> {
        let key = normalize_key(key)?;
        let (lock_doc, _) = Self::document_ids(&key)?;
        let found = self
            .read_lock(&self.db, &lock_doc)
            .await
            .map_err(map_error)?;
        let now = now_ms();
        Ok(found.filter(|data| is_live(data.expires_at_ms.0, now)))
    }

    async fn lookup_once(&self, query: Lookup<'_>) -> Result<Option<LockInfo>, LockError> {
        let found = match query {
            Lookup::Key(key) => self.live_by_key(key).await?,
            Lookup::LockId(lock_id) => {
                self.transact(true, |reader| async move {
                    let found = self.query_lock_id(&reader, lock_id).await?;
                    let now = now_ms();
                    Ok(match Self::resolve(found, lock_id, now) {
                        Resolved::Held(held) => (Some(held.data), Vec::new()),
                        Resolved::NotHeld(_) => (None, Vec::new()),
                    })
                })
                .await?
            }
        };
        found.map(Self::info).transpose()
    }
}

/// Parses a stored fence counter (15-digit decimal text) without going through floats.
fn parse_fence(text: &str) -> Result<u64, LockError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LockError::internal(format!(
            "a Firestore fence holds {text:?}, not a decimal counter; the fence documents were \
             changed by something other than syncguard"
        )));
    }
    text.parse::<u64>().map_err(|error| {
        LockError::internal(format!(
            "a Firestore fence counter {text:?} is out of range"
        ))
        .with_source(error)
    })
}

impl LockBackend for FirestoreBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.acquire_once(key, ttl))
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        Box::pin(self.release_once(lock_id))
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(self.extend_once(lock_id, ttl))
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move { Ok(self.live_by_key(key).await?.is_some()) })
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(self.lookup_once(query))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("firestore", TimeAuthority::Client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_parse_exactly() {
        assert_eq!(parse_fence("000000000000042").unwrap(), 42);
        assert_eq!(parse_fence("899999999999999").unwrap(), 899_999_999_999_999);
        for bad in ["", "-1", "1e3", "12.0", " 1"] {
            assert!(parse_fence(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            format!("{:015}", 900_000_000_000_000_u64),
            "900000000000000"
        );
    }

    #[test]
    fn keys_with_slashes_are_refused_before_io() {
        assert!(FirestoreBackend::document_ids("a/b").is_err());
        let (lock, fence) = FirestoreBackend::document_ids("job:42").unwrap();
        assert_eq!(lock, "job:42");
        assert_eq!(fence, "fence:job:42");
    }

    #[test]
    fn duplicates_are_never_acted_on_when_live() {
        let id = LockId::generate();
        let doc = |expires: u64| LockDocument {
            lock_id: id.as_str().to_owned(),
            expires_at_ms: Millis(expires),
            acquired_at_ms: Millis(0),
            key: "k".to_owned(),
            fence: "000000000000001".to_owned(),
        };
        let now = 100_000;
        let found = |id: &str, data| Found {
            id: id.to_owned(),
            data,
            unchanged: FirestoreWritePrecondition::Exists(true),
        };
        let two_live = vec![found("a", doc(now + 10)), found("b", doc(now + 10))];
        assert!(matches!(
            FirestoreBackend::resolve(two_live, &id, now),
            Resolved::NotHeld(None)
        ));
        let one_live = vec![found("a", doc(1)), found("b", doc(now + 10))];
        assert!(matches!(
            FirestoreBackend::resolve(one_live, &id, now),
            Resolved::Held(ref held) if held.id == "b"
        ));
        let expired = vec![found("a", doc(1))];
        assert!(matches!(
            FirestoreBackend::resolve(expired, &id, now),
            Resolved::NotHeld(Some(NotHeldReason::Expired))
        ));
        let foreign = vec![found(
            "a",
            LockDocument {
                lock_id: LockId::generate().as_str().to_owned(),
                ..doc(now + 10)
            },
        )];
        assert!(matches!(
            FirestoreBackend::resolve(foreign, &id, now),
            Resolved::NotHeld(Some(NotHeldReason::NotFound))
        ));
    }
}
