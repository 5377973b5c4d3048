//! The release of a dropped guard.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};

use super::let_go::let_go;
use super::shutdown::Registration;
use super::state::Shared;
use super::{Keeper, LockGuard};
use crate::backend::LockBackend;
use crate::error::LostReason;

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.keeper = Keeper::Stopped;
        self.shared.end();
        let Some(registration) = self.unreleased.take() else {
            return;
        };
        self.shared.record_outcome("dropped");
        // A lock the backend already disowned needs no release; one whose lease merely ran
        // out locally (backend unreachable) may still be stored, so release it.
        if self.shared.lost_reason() == Some(LostReason::NotHeld) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                lock = %self.shared.name,
                fence = %self.shared.fence,
                "a LockGuard was dropped outside a tokio runtime: its release cannot be sent, and the lock stays held until its ttl runs out"
            );
            return;
        };
        let release = BackgroundRelease {
            backend: Arc::clone(&self.backend),
            shared: Arc::clone(&self.shared),
            answered: false,
            _registration: registration,
        };
        let mut release = Box::pin(release.run());
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
}

/// The release of a dropped guard, in a task of its own. It stays among the held locks (for
/// [`shutdown`](crate::shutdown)) until the backend answers, and says so if its task is
/// dropped first (the runtime ended).
struct BackgroundRelease {
    backend: Arc<dyn LockBackend>,
    shared: Arc<Shared>,
    answered: bool,
    _registration: Registration,
}

impl BackgroundRelease {
    async fn run(mut self) {
        let outcome = let_go(self.backend.as_ref(), &self.shared).await;
        self.answered = true;
        if let Err(error) = self.shared.report_release(outcome) {
            tracing::warn!(%error, lock = %self.shared.name, fence = %self.shared.fence, "release of a dropped LockGuard failed; the lock will expire at the end of its ttl");
        }
    }
}

impl Drop for BackgroundRelease {
    fn drop(&mut self) {
        if !self.answered {
            tracing::warn!(
                lock = %self.shared.name,
                fence = %self.shared.fence,
                "the release of a dropped LockGuard was cut off before the backend answered (the runtime ended): the lock may stay held until its ttl runs out; call syncguard::shutdown before the runtime ends"
            );
        }
    }
}
