//! One logical operation: its reads (direct, or in a read-only snapshot), then its writes in
//! one commit conditioned on what was read, run again on a conflict within the retry budget.

use std::future::Future;
use std::time::Duration;

use firestore::errors::FirestoreError;
use firestore::{
    FirestoreConsistencySelector, FirestoreDb, FirestoreTransaction, FirestoreTransactionMode,
    FirestoreTransactionOptions, FirestoreWritePrecondition,
};

use super::FirestoreBackend;
use super::documents::{FenceDocument, Found, LockDocument, unchanged_since};
use super::error::{is_aborted, is_conflict, map_error};
use crate::error::LockError;
use crate::lock_id::LockId;

/// A write planned from a snapshot, committed only if the document is still as it was read.
pub(super) enum Write {
    SetLock(String, LockDocument, FirestoreWritePrecondition),
    SetFence(String, FenceDocument, FirestoreWritePrecondition),
    /// Only the named fields of a lock document (the others, including fields this library
    /// does not know, stay as they are).
    UpdateLock(
        String,
        LockDocument,
        &'static [&'static str],
        FirestoreWritePrecondition,
    ),
    DeleteLock(String, FirestoreWritePrecondition),
}

/// Why a transaction body stopped.
pub(super) enum TxError {
    Store(FirestoreError),
    Lock(LockError),
    /// The commit found a document changed since it was read (or the transaction aborted).
    Conflict(FirestoreError),
    /// The commit request was sent and failed otherwise: it may have been applied (the
    /// connection lost while the answer was on its way, say).
    Commit(FirestoreError),
}

/// Why a transaction failed, and whether a commit of it was sent: a commit that was sent and
/// not answered with success may have been applied, whatever the error says.
pub(super) struct TxFailure {
    pub(super) error: LockError,
    pub(super) commit_sent: bool,
}

impl From<TxFailure> for LockError {
    fn from(failure: TxFailure) -> Self {
        failure.error
    }
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

impl FirestoreBackend {
    /// Runs `body`'s reads (in a read-only transaction, a consistent snapshot that takes no
    /// document locks, when `snapshot`; as direct reads otherwise), then commits the writes it
    /// planned in one transaction, each conditioned on its document being unchanged since it
    /// was read; runs it all again on a conflict, within the retry budget.
    pub(super) async fn transact<T, F, Fut>(&self, snapshot: bool, body: F) -> Result<T, LockError>
    where
        F: Fn(FirestoreDb) -> Fut,
        Fut: Future<Output = Result<(T, Vec<Write>), TxError>>,
    {
        Ok(self.transact_tracking_commit(snapshot, body).await?)
    }

    /// [`transact`](Self::transact), its failure saying whether a commit was sent (see
    /// [`TxFailure`]).
    pub(super) async fn transact_tracking_commit<T, F, Fut>(
        &self,
        snapshot: bool,
        body: F,
    ) -> Result<T, TxFailure>
    where
        F: Fn(FirestoreDb) -> Fut,
        Fut: Future<Output = Result<(T, Vec<Write>), TxError>>,
    {
        let mut commit_sent = false;
        let fail = |error, commit_sent| Err(TxFailure { error, commit_sent });
        let mut retries = 0;
        loop {
            let conflict = match self.attempt(snapshot, &body).await {
                Ok(value) => return Ok(value),
                // Refused whole; still, a commit ran, and a later failure counts as one after
                // a commit, in doubt (an acquire that gives up then costs one more query).
                Err(TxError::Conflict(error)) => {
                    commit_sent = true;
                    error
                }
                Err(TxError::Store(error)) if is_aborted(&error) => error,
                Err(TxError::Store(error)) => return fail(map_error(error), commit_sent),
                Err(TxError::Commit(error)) => return fail(map_error(error), true),
                Err(TxError::Lock(error)) => return fail(error, commit_sent),
            };
            if retries >= self.config.max_transaction_retries() {
                return fail(
                    if is_aborted(&conflict) {
                        map_error(conflict)
                    } else {
                        LockError::service_unavailable(format!(
                            "the lock documents kept changing under {} attempts; try again",
                            retries + 1
                        ))
                        .with_source(super::error::driver_error(conflict))
                    },
                    commit_sent,
                );
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
                TxError::Commit(error)
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
                Write::UpdateLock(id, document, fields, unchanged) => {
                    self.db
                        .fluent()
                        .update()
                        .fields(fields)
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
    pub(super) async fn read<T: serde::de::DeserializeOwned>(
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
    pub(super) async fn read_lock(
        &self,
        reader: &FirestoreDb,
        id: &str,
    ) -> Result<Option<LockDocument>, FirestoreError> {
        Ok(Self::read(reader, self.config.lock_collection(), id)
            .await?
            .0)
    }

    /// Every lock document carrying `lock_id` (no limit: duplicates must be seen), with ids.
    pub(super) async fn query_lock_id(
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
}
