//! Running work under a guard.

use std::future::Future;
use std::task::Poll;

use tracing::Instrument as _;

use super::LockGuard;
use crate::error::{LockError, LostReason};
use crate::options::OnLost;

impl LockGuard {
    /// Runs `work` under this lock, in the hold's span, and says whether it stayed under the
    /// lock: what [`with_lock`](crate::with_lock), `#[locked]` and the Tower layer do with
    /// the work they are given.
    ///
    /// With [`OnLost::Cancel`] (the options' default) a loss drops `work` at once and returns
    /// [`ErrorCode::LockLost`](crate::ErrorCode::LockLost), and the lease is checked against the
    /// clock before every poll of `work`: after a stall (a frozen runtime, a blocked thread) the
    /// work takes no further step once its lease has run out, whatever the runtime wakes first.
    /// With [`OnLost::Notify`] the work runs on (it can watch [`lost`](crate::LockHandle::lost)).
    /// Either way, work that finishes when the lock is lost (its lease ran out while it ran, even
    /// unnoticed because its thread was blocked) gets `LockLost`, not its output: its side
    /// effects were not exclusive throughout, and the [fence](crate::LockHandle::fence) is what
    /// lets a resource refuse them.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::{LockOptions, MemoryBackend};
    ///
    /// let backend = MemoryBackend::new();
    /// let guard = syncguard::acquire(&backend, "export:7", &LockOptions::default()).await?;
    /// let rows = guard.run(async { 42 }).await?;
    /// guard.release_in_background().await;
    /// assert_eq!(rows, 42);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ErrorCode::LockLost`](crate::ErrorCode::LockLost) when the lock was lost before `work`
    /// finished.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LockError> {
        let work = work.instrument(self.shared().span.clone());
        let output = match self.shared().on_lost {
            OnLost::Notify => work.await,
            OnLost::Cancel => {
                let lost = self.lost();
                tokio::pin!(work, lost);
                let polled = std::future::poll_fn(|cx| {
                    // The lease before every step of the work, read from the clock rather than
                    // from whichever timer or task the runtime happens to run first: after a
                    // stall (a frozen runtime, a blocked thread) the work must not take one
                    // more step once the lease has run out.
                    if let Some(reason) = self.shared().loss() {
                        return Poll::Ready(Err(reason));
                    }
                    if let Poll::Ready(reason) = lost.as_mut().poll(cx) {
                        return Poll::Ready(Err(reason));
                    }
                    // A finished work is judged below, by the lease at the moment it finished.
                    work.as_mut().poll(cx).map(Ok)
                })
                .await;
                match polled {
                    Ok(output) => output,
                    Err(reason) => return Err(self.lost_error(reason)),
                }
            }
        };
        match self.lost_reason() {
            Some(reason) => Err(self.lost_error(reason)),
            None => Ok(output),
        }
    }

    /// The error for work whose lock was lost.
    pub(crate) fn lost_error(&self, reason: LostReason) -> LockError {
        LockError::lock_lost(self.shared().name.clone(), reason)
    }
}
