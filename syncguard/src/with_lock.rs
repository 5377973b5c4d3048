//! Running work under a lock, from acquire to release.

use crate::acquire;
use crate::backend::LockBackend;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::options::LockOptions;

/// Runs `work` under the lock on `key`: acquires it (waiting as `options` say), keeps it alive
/// while the work runs, and releases it on every path, errors included.
///
/// It returns the work's result only if the lock was held until the work finished: see
/// [`LockGuard::run`] for what a loss does (with the default [`OnLost::Cancel`](crate::OnLost)
/// the work is dropped at once and [`ErrorCode::LockLost`](crate::ErrorCode::LockLost)
/// returned). The final release is [`LockGuard::release_in_background`]: waited for up to a
/// second, then left to the background, its errors logged, not returned. The work runs in the
/// hold's `syncguard.hold` span.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use syncguard::{LockOptions, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let options = LockOptions::default();
/// let fence = syncguard::with_lock(&backend, "report:daily", &options, async |guard| {
///     // ... the work, exclusive across every process sharing the backend ...
///     Ok::<_, syncguard::LockError>(guard.fence())
/// })
/// .await?;
/// println!("ran with fence {fence}");
/// # Ok(()) }
/// ```
///
/// # Errors
/// The work's own error, or a [`LockError`] converted into `E`: acquisition failures as in
/// [`acquire`], and [`ErrorCode::LockLost`](crate::ErrorCode::LockLost) when the lock was lost
/// before the work finished.
pub async fn with_lock<B, F, T, E>(
    backend: &B,
    key: &str,
    options: &LockOptions,
    work: F,
) -> Result<T, E>
where
    B: LockBackend + Clone + 'static,
    F: AsyncFnOnce(&LockGuard) -> Result<T, E>,
    E: From<LockError>,
{
    let guard = acquire(backend, key, options).await?;
    let result = guard.run(work(&guard)).await;
    guard.release_in_background().await;
    result.unwrap_or_else(|lost| Err(lost.into()))
}
