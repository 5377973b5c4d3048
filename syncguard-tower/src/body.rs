//! The response body: the inner service's, holding the lock until its end with
//! [`ReleaseOn::BodyEnd`](crate::ReleaseOn::BodyEnd), or the layer's own rejection document.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use syncguard::{LockError, LockGuard, LostReason};
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::retry_after::HoldTimes;

use syncguard::BoxError;

type ReleaseFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

pin_project! {
    /// The body of every response that passed through a [`LockService`](crate::LockService).
    ///
    /// Either the inner service's body, unchanged, or, with
    /// [`ReleaseOn::BodyEnd`](crate::ReleaseOn::BodyEnd), that body holding the lock: it releases
    /// the lock when the inner body reports its end (and awaits the release before reporting the
    /// end itself), or in the background when it is dropped unfinished. While it holds the lock
    /// under [`OnLost::Cancel`](syncguard::OnLost::Cancel), a lost lock ends the body with
    /// [`ErrorCode::LockLost`](syncguard::ErrorCode::LockLost). Or a rejection: a small JSON
    /// problem document (HTTP) or nothing (gRPC, where the status travels in the headers).
    pub struct LockBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            hold: Option<Box<Hold>>,
        },
        Full {
            data: Option<Bytes>,
        },
    }
}

/// The lock a streaming body holds, then releases once the inner body has ended.
enum Hold {
    Holding {
        guard: LockGuard,
        /// Completes when the lock is lost; `None` under `OnLost::Notify`.
        lost: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
        /// Where the hold's length goes when it ends with a release.
        holds: Arc<HoldTimes>,
    },
    Releasing(ReleaseFuture),
}

impl<B> LockBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body, hold: None },
        }
    }

    /// `body` holding the lock of `guard` until its end; with `cancel_on_loss`, a loss ends
    /// it with an error.
    pub(crate) fn holding(
        body: B,
        mut guard: LockGuard,
        cancel_on_loss: bool,
        holds: Arc<HoldTimes>,
    ) -> Self {
        // A body is only polled when the connection can take more data, so a slow client
        // would starve a heartbeat run from here: a task keeps the lock while it streams.
        guard.spawn_heartbeat();
        let lost = cancel_on_loss.then(|| Box::pin(guard.lost_token().cancelled_owned()));
        Self {
            kind: Kind::Inner {
                body,
                hold: Some(Box::new(Hold::Holding { guard, lost, holds })),
            },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Default for LockBody<B> {
    /// An empty body.
    fn default() -> Self {
        Self::full(Bytes::new())
    }
}

impl<B> fmt::Debug for LockBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { hold: None, .. } => "inner",
            Kind::Inner { hold: Some(_), .. } => "inner, holding the lock",
            Kind::Full { .. } => "rejection",
        };
        f.debug_tuple("LockBody").field(&kind).finish()
    }
}

/// The release at the end of a request or of its body: waited for up to a second, failures
/// logged (the lock then expires at the end of its ttl). The hold's length goes to `holds`,
/// for the `Retry-After` of the requests it made wait.
pub(crate) fn release(guard: LockGuard, holds: &HoldTimes) -> ReleaseFuture {
    holds.record(guard.held_for());
    Box::pin(guard.release_in_background())
}

/// The error that ends a body whose lock was lost, naming the lock.
fn lost(guard: &LockGuard, reason: LostReason) -> BoxError {
    tracing::warn!(lock = %guard.name(), fence = %guard.fence(), %reason, "syncguard_tower: the lock was lost while the response body streamed; ending the body with an error");
    Box::new(LockError::lock_lost(guard.name().clone(), reason))
}

/// Which body type the responses of a [`LockService`](crate::LockService) have, given the
/// inner service's body type `B`.
///
/// - [`Wrapped`] (the default): a [`LockBody<B>`] around the inner body. Works with any body.
/// - `axum::body::Body` (feature `axum`, [`LockLayer::for_axum`][for_axum]):
///   axum's own body type. axum boxes every response body that is not already its `Body`, so
///   on an axum router this saves a box and a layer of indirection per response; the inner
///   body is handed on as it is when it is axum's `Body`.
///
/// Sealed: implemented only by this crate.
///
// Linked to docs.rs (built with every feature) when the `axum` feature is off, so that docs
// built without it have no broken link.
#[cfg_attr(feature = "axum", doc = "[for_axum]: crate::LockLayer::for_axum")]
#[cfg_attr(
    not(feature = "axum"),
    doc = concat!("[for_axum]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/struct.LockLayer.html#method.for_axum")
)]
pub trait ResponseBodies<B>: sealed::Sealed {
    /// The body type of the responses.
    type Body;

    /// The inner service's body, handed on.
    #[doc(hidden)]
    fn inner(body: B) -> Self::Body;

    /// A body of the layer's own (a rejection, or a body holding the lock).
    #[doc(hidden)]
    fn wrap(body: LockBody<B>) -> Self::Body;
}

/// The default [`ResponseBodies`]: responses carry a [`LockBody`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Wrapped;

impl<B> ResponseBodies<B> for Wrapped {
    type Body = LockBody<B>;

    fn inner(body: B) -> LockBody<B> {
        LockBody::inner(body)
    }

    fn wrap(body: LockBody<B>) -> LockBody<B> {
        body
    }
}

#[cfg(feature = "axum")]
impl<B> ResponseBodies<B> for axum::body::Body
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Body = axum::body::Body;

    fn inner(body: B) -> axum::body::Body {
        // No allocation when `B` is axum's `Body` already (axum checks the type).
        axum::body::Body::new(body)
    }

    fn wrap(body: LockBody<B>) -> axum::body::Body {
        axum::body::Body::new(body)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Wrapped {}
    #[cfg(feature = "axum")]
    impl Sealed for axum::body::Body {}
}

impl<B> Body for LockBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Full { data } => Poll::Ready(data.take().map(|data| Ok(Frame::data(data)))),
            KindProj::Inner { body, hold } => {
                let Some(held) = hold.as_deref_mut() else {
                    return body.poll_frame(cx).map_err(Into::into);
                };
                let (guard, lost) = match held {
                    Hold::Releasing(releasing) => {
                        ready!(releasing.as_mut().poll(cx));
                        *hold = None;
                        return Poll::Ready(None);
                    }
                    Hold::Holding { guard, lost, .. } => (guard, lost),
                };
                // The lease is read from the clock before every poll of the body, and the lost
                // future polled for its wake-up: after a stall the body sends nothing more once
                // the lease has run out, whatever woke this task.
                if let Some(lost_lock) = lost.as_mut()
                    && (guard.is_lost() || lost_lock.as_mut().poll(cx).is_ready())
                {
                    let reason = guard.lost_reason().unwrap_or(LostReason::NotHeld);
                    let error = self::lost(guard, reason);
                    *hold = None; // the lost lock needs no release
                    return Poll::Ready(Some(Err(error)));
                }
                // The body is part of the hold: what it logs belongs to the hold's span.
                let frame = {
                    let _entered = guard.span().enter();
                    ready!(body.poll_frame(cx))
                };
                match frame {
                    Some(Ok(frame)) => Poll::Ready(Some(Ok(frame))),
                    Some(Err(error)) => {
                        *hold = None; // releases in the background
                        Poll::Ready(Some(Err(error.into())))
                    }
                    None => {
                        // A body that ended after its lock could have passed to someone else
                        // was not sent under the lock: the client must not take it as whole.
                        if let Some(reason) = guard.lost_reason() {
                            let error = self::lost(guard, reason);
                            *hold = None;
                            return Poll::Ready(Some(Err(error)));
                        }
                        let Some(Hold::Holding { guard, holds, .. }) =
                            hold.take().map(|held| *held)
                        else {
                            unreachable!("the body holds its lock until its end");
                        };
                        // The end is reported once the release is done.
                        let mut releasing = release(guard, &holds);
                        if releasing.as_mut().poll(cx).is_pending() {
                            *hold = Some(Box::new(Hold::Releasing(releasing)));
                            return Poll::Pending;
                        }
                        Poll::Ready(None)
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            // While holding, the end is reported only after the release.
            Kind::Inner { body, hold } => hold.is_none() && body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
