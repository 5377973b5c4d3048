//! Diagnostics: who holds a lock, and until when.

use crate::backend::{LockBackend, LockInfo, Lookup};
use crate::error::LockError;
use crate::lock_id::LockId;

/// The live lock on `key`, sanitized (its raw key, lock id and holder only through
/// [`LockInfo::reveal`]); `None` if the key is free or its lock expired.
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for an invalid key; backend
/// errors as they come.
pub async fn get_by_key<B: LockBackend + ?Sized>(
    backend: &B,
    key: &str,
) -> Result<Option<LockInfo>, LockError> {
    backend.lookup(Lookup::Key(key)).await
}

/// The live lock held by `lock_id`, sanitized; `None` if it was released or expired.
///
/// # Errors
/// Backend errors as they come.
pub async fn get_by_id<B: LockBackend + ?Sized>(
    backend: &B,
    lock_id: &LockId,
) -> Result<Option<LockInfo>, LockError> {
    backend.lookup(Lookup::LockId(lock_id)).await
}

/// Whether `lock_id` still holds a live lock.
///
/// For diagnostics and UIs only: the answer can be stale by the time it arrives, so never
/// check ownership and then act on it. Release and extend verify ownership atomically.
///
/// # Errors
/// Backend errors as they come.
pub async fn owns<B: LockBackend + ?Sized>(
    backend: &B,
    lock_id: &LockId,
) -> Result<bool, LockError> {
    Ok(get_by_id(backend, lock_id).await?.is_some())
}
