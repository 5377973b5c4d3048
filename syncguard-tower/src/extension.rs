//! What a handler learns about the lock its request holds.

use std::fmt;
use std::time::Duration;

use syncguard::{Fence, LockGuard, LockHandle, LockId, LockName, LostReason};
use tokio_util::sync::CancellationToken;

/// The lock a request holds, put in the request's extensions before the handler runs.
///
/// Read it with `request.extensions().get::<HeldLock>()`, with axum's
/// `Extension<HeldLock>`, or (feature `axum`) as an extractor: `lock: HeldLock` fails the
/// request with 500 when the route is not behind a `LockLayer` or its key function returned
/// `None`; `lock: Option<HeldLock>` accepts both.
///
/// It has the accessors of [`syncguard::LockGuard`] (a [`LockHandle`] on the guard the layer
/// keeps): pass [`fence`](Self::fence) to whatever the handler writes to, so a store can refuse
/// a writer whose lock was taken over. Cloning it copies no string.
///
/// ```
/// use axum::{Router, routing::post};
/// use syncguard::MemoryBackend;
/// use syncguard_tower::{HeldLock, LockLayer, key};
///
/// async fn run_job(lock: HeldLock) -> String {
///     format!("ran with fence {}", lock.fence())
/// }
///
/// let app: Router = Router::new()
///     .route("/jobs", post(run_job))
///     .layer(LockLayer::for_axum(MemoryBackend::new(), key::header("idempotency-key")));
/// ```
#[derive(Clone)]
pub struct HeldLock {
    handle: LockHandle,
}

impl HeldLock {
    pub(crate) fn new(guard: &LockGuard) -> Self {
        Self {
            handle: guard.handle(),
        }
    }

    /// The read-only [`LockHandle`] this wraps, for code written against `syncguard` alone.
    pub fn handle(&self) -> &LockHandle {
        &self.handle
    }

    /// The (NFC-normalized) key of the lock.
    pub fn key(&self) -> &str {
        self.handle.key()
    }

    /// How logs and errors name the lock: its key hash, and its key if the layer's options
    /// [show keys](syncguard::LockOptionsBuilder::show_key).
    pub fn name(&self) -> &LockName {
        self.handle.name()
    }

    /// The lock id of this acquisition.
    pub fn lock_id(&self) -> &LockId {
        self.handle.lock_id()
    }

    /// The fencing token of this acquisition; it only grows from one holder to the next.
    pub fn fence(&self) -> Fence {
        self.handle.fence()
    }

    /// The ttl each extend asks for.
    pub fn ttl(&self) -> Duration {
        self.handle.ttl()
    }

    /// The latest authoritative expiry (Unix ms of the backend's time authority).
    pub fn expires_at_ms(&self) -> u64 {
        self.handle.expires_at_ms()
    }

    /// How long the lock has been held.
    pub fn held_for(&self) -> Duration {
        self.handle.held_for()
    }

    /// Whether the lock can still be relied on: held, not lost, and not yet released at the
    /// end of the request. Check this before a side effect, also from a task that may outlive
    /// the request.
    pub fn is_held(&self) -> bool {
        self.handle.is_held()
    }

    /// Whether the lock is lost, as of now (also when its lease ran out while nothing looked).
    /// With [`OnLost::Cancel`](syncguard::OnLost::Cancel) (the default) the handler is dropped
    /// when that happens; with `OnLost::Notify` it runs on and should check
    /// [`is_held`](Self::is_held) before side effects. After the request released the lock
    /// this stays `false`: a release is no loss.
    pub fn is_lost(&self) -> bool {
        self.handle.is_lost()
    }

    /// Why the lock is lost, as of now; `None` while it is held (and after the release).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.handle.lost_reason()
    }

    /// Completes with the reason when the lock is lost; never while it is held, nor after the
    /// release.
    pub async fn lost(&self) -> LostReason {
        self.handle.lost().await
    }

    /// A token cancelled when the lock is lost (not when it is released).
    pub fn lost_token(&self) -> CancellationToken {
        self.handle.lost_token()
    }

    /// The hold's `syncguard.hold` tracing span. The handler already runs in it; use it for
    /// tasks the handler spawns (`task.instrument(lock.span().clone())`).
    pub fn span(&self) -> &tracing::Span {
        self.handle.span()
    }
}

impl fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HeldLock").field(&self.handle).finish()
    }
}

#[cfg(feature = "axum")]
mod extract {
    use axum::extract::{FromRequestParts, OptionalFromRequestParts};
    use axum::response::{IntoResponse, Response};
    use http::StatusCode;
    use http::request::Parts;

    use super::HeldLock;

    /// The rejection of the [`HeldLock`] extractor: the request holds no lock.
    ///
    /// Answers `500 Internal Server Error`: the route is not behind a `LockLayer`, or the key
    /// function returned `None` for this request. Extract `Option<HeldLock>` where both are
    /// expected.
    #[derive(Debug, Clone, Copy, Default)]
    #[non_exhaustive]
    pub struct MissingLock;

    impl std::fmt::Display for MissingLock {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(
                "this request holds no syncguard lock: put the route behind a LockLayer, or \
                 extract Option<HeldLock> if its key function may return None",
            )
        }
    }

    impl std::error::Error for MissingLock {}

    impl IntoResponse for MissingLock {
        fn into_response(self) -> Response {
            (StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
        }
    }

    impl<S: Send + Sync> FromRequestParts<S> for HeldLock {
        type Rejection = MissingLock;

        async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, MissingLock> {
            parts
                .extensions
                .get::<HeldLock>()
                .cloned()
                .ok_or(MissingLock)
        }
    }

    impl<S: Send + Sync> OptionalFromRequestParts<S> for HeldLock {
        type Rejection = std::convert::Infallible;

        async fn from_request_parts(
            parts: &mut Parts,
            _state: &S,
        ) -> Result<Option<Self>, Self::Rejection> {
            Ok(parts.extensions.get::<HeldLock>().cloned())
        }
    }
}

#[cfg(feature = "axum")]
pub use extract::MissingLock;
