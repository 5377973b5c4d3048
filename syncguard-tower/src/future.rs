//! The response future: acquire, run the inner service under the lock, release.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use syncguard::{LockGuard, OnLost};
use tower::Service;

use crate::body::{LockBody, ResponseBodies, Wrapped, release};
use crate::config::{Config, ReleaseOn};
use crate::extension::HeldLock;
use crate::response::Rejection;

pub(crate) type AcquireFuture =
    Pin<Box<dyn Future<Output = Result<LockGuard, Rejection>> + Send + 'static>>;
type ReleaseFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

pin_project! {
    /// The response future of [`LockService`](crate::LockService).
    ///
    /// A small state machine that owns the request's [`LockGuard`] for as long as the request
    /// runs: it acquires the lock, calls the inner service with the lock's
    /// [`HeldLock`] in the request's extensions, polls the inner future inside the hold's
    /// `syncguard.hold` span, runs the lock's heartbeat itself while the inner future is
    /// pending ([`LockGuard::poll_heartbeat`]; the inner future is dropped if the lock is lost),
    /// then releases the lock (or hands it to the body, with [`ReleaseOn::BodyEnd`]).
    /// Dropping it at any point releases the lock in the background.
    pub struct ResponseFuture<S, ReqBody, ResBody, M = Wrapped>
    where
        S: Service<Request<ReqBody>>,
        M: ResponseBodies<ResBody>,
    {
        #[pin]
        state: State<S, S::Future, ReqBody, Result<Response<M::Body>, S::Error>>,
        config: Arc<Config>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, F, ReqBody, Out> {
        // Waiting for the lock; the inner service (already ready) and the request wait too.
        Acquiring {
            acquire: AcquireFuture,
            pending: Option<(S, Request<ReqBody>)>,
        },
        // The inner service runs; `guard` is `None` for a request without a key.
        Running {
            #[pin]
            inner: F,
            guard: Option<LockGuard>,
        },
        // Refused before the inner service was called (no key).
        Rejected {
            rejection: Option<Rejection>,
        },
        // The inner service answered; the release is on its way to the backend.
        Releasing {
            release: ReleaseFuture,
            output: Option<Out>,
        },
        Done,
    }
}

impl<S, ReqBody, ResBody, M> ResponseFuture<S, ReqBody, ResBody, M>
where
    S: Service<Request<ReqBody>>,
    M: ResponseBodies<ResBody>,
{
    pub(crate) fn unlocked(inner: S::Future, config: Arc<Config>) -> Self {
        Self {
            state: State::Running { inner, guard: None },
            config,
        }
    }

    /// Answers `rejection` without calling the inner service.
    pub(crate) fn rejected(rejection: Rejection, config: Arc<Config>) -> Self {
        Self {
            state: State::Rejected {
                rejection: Some(rejection),
            },
            config,
        }
    }

    /// Waits for `acquire`, then runs `request` on `service` (polled ready).
    pub(crate) fn acquiring(
        acquire: AcquireFuture,
        service: S,
        request: Request<ReqBody>,
        config: Arc<Config>,
    ) -> Self {
        Self {
            state: State::Acquiring {
                acquire,
                pending: Some((service, request)),
            },
            config,
        }
    }
}

/// Calls `service` with `request` under the lock of `guard`, in the hold's span.
fn call_locked<S, ReqBody>(
    service: &mut S,
    mut request: Request<ReqBody>,
    guard: &LockGuard,
) -> S::Future
where
    S: Service<Request<ReqBody>>,
{
    request.extensions_mut().insert(HeldLock::new(guard));
    let _entered = guard.span().enter();
    service.call(request)
}

impl<S, ReqBody, ResBody, M> Future for ResponseFuture<S, ReqBody, ResBody, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body,
    M: ResponseBodies<ResBody>,
{
    type Output = Result<Response<M::Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquiring { acquire, pending } => {
                    match ready!(acquire.as_mut().poll(cx)) {
                        Ok(guard) => {
                            let (mut service, request) = pending
                                .take()
                                .expect("ResponseFuture polled after completion");
                            let inner = call_locked(&mut service, request, &guard);
                            this.state.set(State::Running {
                                inner,
                                guard: Some(guard),
                            });
                        }
                        Err(rejection) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(rejection
                                .into_response(this.config)
                                .map(M::wrap)));
                        }
                    }
                }
                StateProj::Rejected { rejection } => {
                    let rejection = rejection
                        .take()
                        .expect("ResponseFuture polled after completion");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(rejection.into_response(this.config).map(M::wrap)));
                }
                StateProj::Running { inner, guard } => {
                    let cancel = this.config.options.on_lost() != OnLost::Notify;
                    // The lease is read from the clock before every poll of the handler (no
                    // timer is armed for it): after a stall (a frozen runtime, a blocked
                    // thread) the handler takes no further step once its lease has run out,
                    // whatever woke this task.
                    if let Some(held) = guard.as_ref().filter(|_| cancel)
                        && let Some(reason) = held.lost_reason()
                    {
                        tracing::warn!(lock = %held.name(), fence = %held.fence(), %reason, "syncguard_tower: the lock was lost while the handler ran; cancelling it");
                        this.state.set(State::Done); // drops the handler and the guard
                        return Poll::Ready(Ok(Rejection::Lost(reason)
                            .into_response(this.config)
                            .map(M::wrap)));
                    }
                    // The inner future goes first: a handler that answers at once never arms
                    // the heartbeat's timer. It runs in the hold's span, so that what the
                    // handler logs is attributed to the hold.
                    let polled = {
                        let _entered = guard.as_ref().map(|guard| guard.span().enter());
                        inner.poll(cx)
                    };
                    if let Poll::Ready(result) = polled {
                        let Some(guard) = guard.take() else {
                            this.state.set(State::Done);
                            return Poll::Ready(result.map(|r| r.map(M::inner)));
                        };
                        // A handler that finished after its lock could have passed to someone
                        // else did not run under the lock: its response does not stand.
                        if let Some(reason) = guard.lost_reason() {
                            tracing::warn!(lock = %guard.name(), fence = %guard.fence(), %reason, "syncguard_tower: the lock was lost before the handler finished; answering as lost");
                            this.state.set(State::Done); // drops the response and the guard
                            return Poll::Ready(Ok(Rejection::Lost(reason)
                                .into_response(this.config)
                                .map(M::wrap)));
                        }
                        let output = match (this.config.release, result) {
                            (ReleaseOn::BodyEnd, Ok(response))
                                if !response.body().is_end_stream() =>
                            {
                                let cancel = this.config.options.on_lost() != OnLost::Notify;
                                this.state.set(State::Done);
                                let holds = Arc::clone(&this.config.holds);
                                return Poll::Ready(Ok(response.map(|body| {
                                    M::wrap(LockBody::holding(body, guard, cancel, holds))
                                })));
                            }
                            (_, result) => result.map(|r| r.map(M::inner)),
                        };
                        this.state.set(State::Releasing {
                            release: release(guard, &this.config.holds),
                            output: Some(output),
                        });
                        continue;
                    }
                    let Some(held) = guard.as_mut() else {
                        return Poll::Pending;
                    };
                    // The heartbeat runs here, in the request's own task: a timer for the next
                    // extend, extends inline when it fires.
                    // A loss it records is answered above.
                    if held.poll_heartbeat(cx).is_ready() && cancel {
                        continue;
                    }
                    return Poll::Pending;
                }
                StateProj::Releasing { release, output } => {
                    ready!(release.as_mut().poll(cx));
                    let output = output
                        .take()
                        .expect("ResponseFuture polled after completion");
                    this.state.set(State::Done);
                    return Poll::Ready(output);
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

impl<S, ReqBody, ResBody, M> fmt::Debug for ResponseFuture<S, ReqBody, ResBody, M>
where
    S: Service<Request<ReqBody>>,
    M: ResponseBodies<ResBody>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Acquiring { .. } => "acquiring",
            State::Rejected { .. } => "rejected",
            State::Running { guard: None, .. } => "running unlocked",
            State::Running { guard: Some(_), .. } => "running",
            State::Releasing { .. } => "releasing",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
