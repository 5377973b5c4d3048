//! What a handler learns about the lock its request holds.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use syncguard::{LockGuard, LockHandle};

/// The lock a request holds, put in the request's extensions before the handler runs.
///
/// Read it with `request.extensions().get::<HeldLock>()`, with axum's
/// `Extension<HeldLock>`, or (feature `axum`) as an extractor: `lock: HeldLock` fails the
/// request with 500 and a text naming the cause (`MissingLock`) when the route is not behind a
/// `LockLayer`, or when the layer ran the request unlocked because it had no key and the layer
/// says [`Keyless::RunUnlocked`](crate::Keyless::RunUnlocked); `lock: Option<HeldLock>`
/// accepts both.
///
/// It has the accessors of a [`syncguard::LockGuard`], as it derefs to a [`LockHandle`] on the
/// guard the layer keeps: pass [`fence`](LockHandle::fence) to whatever the handler writes to,
/// so a store can refuse a writer whose lock was taken over, and check
/// [`is_held`](LockHandle::is_held) before a side effect made from a task that may outlive the
/// request. With [`OnLost::Cancel`](syncguard::OnLost::Cancel) (the default) the handler is
/// dropped when the lock is lost; with `OnLost::Notify` it runs on and should watch
/// [`is_lost`](LockHandle::is_lost). The handler already runs in the hold's
/// [`span`](LockHandle::span); use it for tasks it spawns. After the request released the
/// lock, `is_held` is `false` and `is_lost` stays `false` (a release is no loss). Code written
/// against `syncguard` alone takes `&lock` as a `&LockHandle`. Cloning it copies no string.
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
}

impl Deref for HeldLock {
    type Target = LockHandle;

    fn deref(&self) -> &LockHandle {
        &self.handle
    }
}

impl fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HeldLock").field(&self.handle).finish()
    }
}

/// Put in the extensions of a request the layer runs unlocked
/// ([`Keyless::RunUnlocked`](crate::Keyless::RunUnlocked)): what its key function found
/// missing, for the rejection of the `HeldLock` extractor.
#[derive(Debug, Clone)]
pub(crate) struct RanUnlocked {
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    no_key: Arc<str>,
}

impl RanUnlocked {
    pub(crate) fn new(no_key: impl fmt::Display) -> Self {
        Self {
            no_key: no_key.to_string().into(),
        }
    }
}

#[cfg(feature = "axum")]
mod extract {
    use axum::extract::{FromRequestParts, OptionalFromRequestParts};
    use axum::response::{IntoResponse, Response};
    use http::StatusCode;
    use http::request::Parts;

    use super::{HeldLock, RanUnlocked};

    /// The rejection of the [`HeldLock`] extractor: the request holds no lock. Its text (the
    /// body of its `500 Internal Server Error`, and the warning logged) names the cause:
    ///
    /// - the request passed no `LockLayer` (the route is not behind one, or was added after
    ///   it);
    /// - or its layer made no key for it and runs such requests unlocked
    ///   ([`Keyless::RunUnlocked`](crate::Keyless::RunUnlocked)): the text says what was
    ///   missing (a header, ...).
    ///
    /// Extract `Option<HeldLock>` in handlers that may run without a lock.
    #[derive(Debug, Clone)]
    #[non_exhaustive]
    pub struct MissingLock {
        ran_unlocked: Option<RanUnlocked>,
    }

    impl MissingLock {
        /// What the layer's key function found missing, when the layer ran the request
        /// unlocked; `None` when the request passed no layer.
        pub fn no_key(&self) -> Option<&str> {
            self.ran_unlocked.as_ref().map(|ran| &*ran.no_key)
        }
    }

    impl std::fmt::Display for MissingLock {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self.no_key() {
                None => f.write_str(
                    "this request holds no syncguard lock because it passed no LockLayer: add the \
                     layer to this route (with Router::route_layer, after the route), or extract \
                     Option<HeldLock> if the route may run without a lock",
                ),
                Some(no_key) => write!(
                    f,
                    "this request holds no syncguard lock because its LockLayer made no key for \
                     it ({no_key}) and runs such requests unlocked (Keyless::RunUnlocked): \
                     extract Option<HeldLock> in handlers that serve them"
                ),
            }
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
            if let Some(lock) = parts.extensions.get::<HeldLock>() {
                return Ok(lock.clone());
            }
            let missing = MissingLock {
                ran_unlocked: parts.extensions.get::<RanUnlocked>().cloned(),
            };
            tracing::warn!(cause = %missing, "syncguard_tower: a handler extracted HeldLock from a request that holds no lock; answering 500");
            Err(missing)
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
