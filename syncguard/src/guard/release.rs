//! The end of a hold, every way it ends: [`LockGuard::release`] (awaited, its outcome
//! returned), [`LockGuard::release_in_background`] (waited for at most a second, never
//! failing) and the release of a dropped guard (in the background). Each sends the one request
//! [`Shared::let_go`] makes (as [`shutdown`](crate::shutdown) does).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::time::Instant;

use super::shutdown::Registration;
use super::state::Shared;
use super::{Heartbeat, LockGuard};
use crate::backend::{LockBackend, ReleaseOutcome};
use crate::error::{LockError, LostReason};

/// How long [`LockGuard::release_in_background`] waits for the release before leaving it to
/// the background: the caller should learn the outcome of its work promptly even when the
/// backend is slow or unreachable.
const RELEASE_WAIT: Duration = Duration::from_secs(1);

impl LockGuard {
    /// Stops the heartbeat and releases the lock. Returns `true` if this call released it,
    /// `false` if it was no longer held (expired or taken over).
    ///
    /// # Errors
    /// Backend errors as they come; the lock then expires at the end of its ttl.
    pub async fn release(mut self) -> Result<bool, LockError> {
        self.heartbeat = Heartbeat::Stopped;
        self.shared().end();
        let outcome = self.shared().let_go(self.backend.as_ref()).await;
        // If this future is dropped before here, the drop releases in the background instead.
        self.unreleased = None;
        self.shared().report_release(outcome)
    }

    /// Releases the lock, and never makes the caller wait more than a second for it nor fail
    /// because of it: what [`with_lock`](crate::with_lock), `#[locked]` and the Tower layer do
    /// at the end of the work, whose result matters more than the release's.
    ///
    /// The heartbeat stops at once. The release is waited for up to a second, then goes on in
    /// the background (the same request, not a second one), tracked by
    /// [`shutdown`](crate::shutdown) until the backend answers; a failure is logged at warn
    /// level, and the lock then expires at the end of its ttl. A lost lock is not waited for
    /// (one the backend disowned needs no release, any other is released in the background).
    /// Call [`release`](Self::release) instead to learn the outcome.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::{LockOptions, MemoryBackend};
    ///
    /// let backend = MemoryBackend::new();
    /// let guard = syncguard::acquire(&backend, "export:8", &LockOptions::default()).await?;
    /// let rows = guard.run(async { 42 }).await;
    /// guard.release_in_background().await; // at most a second; logs a failure
    /// assert_eq!(rows?, 42);
    /// # Ok(()) }
    /// ```
    pub async fn release_in_background(mut self) {
        let lost = self.is_lost();
        let Some(release) = self.take_background_release() else {
            return;
        };
        if lost {
            release.start();
            return;
        }
        // Goes on in a task if the wait runs out, or if this future is dropped meanwhile.
        let mut release = GoesOn(Some(Box::pin(release.run())));
        let Some(request) = release.0.as_mut() else {
            unreachable!("the release was just put there");
        };
        if tokio::time::timeout(RELEASE_WAIT, request).await.is_ok() {
            release.0 = None;
        } else {
            tracing::debug!(lock = %self.name(), fence = %self.fence(), "syncguard release still unanswered after a second; it goes on in the background");
        }
    }

    /// Stops the heartbeat and ends the hold, and gives the release still to be sent: `None`
    /// if a release already reached the backend, or the backend disowned the lock (a lock
    /// whose lease merely ran out locally may still be stored, so it is released).
    fn take_background_release(&mut self) -> Option<BackgroundRelease> {
        self.heartbeat = Heartbeat::Stopped;
        self.shared().end();
        let registration = self.unreleased.take()?;
        if self.shared().lost_reason() == Some(LostReason::NotHeld) {
            return None;
        }
        Some(BackgroundRelease {
            backend: Arc::clone(&self.backend),
            shared: Arc::clone(self.shared()),
            answered: false,
            _registration: registration,
        })
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.unreleased.is_some() {
            self.shared().record_outcome("dropped");
        }
        if let Some(release) = self.take_background_release() {
            release.start();
        }
    }
}

/// A release that goes on without its caller. It stays among the held locks (for
/// [`shutdown`](crate::shutdown)) until the backend answers, and says so if its task is
/// dropped first (the runtime ended).
struct BackgroundRelease {
    backend: Arc<dyn LockBackend>,
    shared: Arc<Shared>,
    answered: bool,
    _registration: Registration,
}

impl BackgroundRelease {
    /// Sends the release from a task, or (without a tokio runtime) says that it cannot.
    fn start(self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                lock = %self.shared.name,
                fence = %self.shared.fence,
                "a LockGuard was dropped outside a tokio runtime: its release cannot be sent, and the lock stays held until its ttl runs out"
            );
            return;
        };
        let mut release = Box::pin(self.run());
        // Polled once here: a release the backend answers without waiting (in-process) is
        // done now, so the key is free as soon as the guard is gone, and needs no task.
        if release
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
        {
            runtime.spawn(release);
        }
    }

    async fn run(mut self) {
        let outcome = self.let_go_while_it_matters().await;
        self.answered = true;
        if let Err(error) = self.shared.report_release(outcome) {
            tracing::warn!(%error, lock = %self.shared.name, fence = %self.shared.fence, "syncguard release failed; the lock will expire at the end of its ttl");
        }
    }

    /// The release, sent again after a failure worth retrying (the backend unreachable, slow
    /// or throttling: a burst of dropped guards can outrun a pool) for as long as the lock may
    /// still be held, so that a transient failure does not leave the key taken for the rest
    /// of its ttl. Sending it again is safe: it names this hold's lock id, and a second one
    /// that finds the lock gone changes nothing.
    async fn let_go_while_it_matters(&self) -> Result<ReleaseOutcome, LockError> {
        let mut pause = FIRST_RETRY;
        loop {
            let outcome = self.shared.let_go(self.backend.as_ref()).await;
            match &outcome {
                Err(error)
                    if error.is_retryable()
                        && Instant::now() + pause < self.shared.belief().deadline =>
                {
                    tracing::debug!(%error, lock = %self.shared.name, "syncguard release failed; sending it again in {pause:?}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LONGEST_RETRY_PAUSE);
                }
                _ => return outcome,
            }
        }
    }
}

/// The pause before a failed background release is sent again, doubling up to
/// [`LONGEST_RETRY_PAUSE`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
const LONGEST_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// A release whose caller stopped waiting for it (the wait ran out, or the caller's future
/// was dropped): dropping this hands the request under way to a task instead of cutting it
/// off.
struct GoesOn(Option<Pin<Box<dyn Future<Output = ()> + Send>>>);

impl Drop for GoesOn {
    fn drop(&mut self) {
        // Without a runtime the release is dropped, and says so (`BackgroundRelease`).
        if let Some(release) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(release);
        }
    }
}

impl Drop for BackgroundRelease {
    fn drop(&mut self) {
        if !self.answered {
            tracing::warn!(
                lock = %self.shared.name,
                fence = %self.shared.fence,
                "a LockGuard's release in the background was cut off before the backend answered (the runtime ended): the lock may stay held until its ttl runs out; call syncguard::shutdown before the runtime ends"
            );
        }
    }
}
