//! The service: keys each request, and hands it to a [`ResponseFuture`].

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tower::Service;

use syncguard::BoxError;

use crate::body::{ResponseBodies, Wrapped};
use crate::config::{Config, Keyless, Layered};
use crate::extension::RanUnlocked;
use crate::future::{AcquireFuture, ResponseFuture};
use crate::key::MakeKey;
use crate::response::Rejection;

/// The service [`LockLayer`](crate::LockLayer) wraps around an inner service: each request
/// runs under the lock of the key its key function gives, or is refused when there is none
/// (unless the layer says [`Keyless::RunUnlocked`]). See the layer for the behaviour and the
/// options.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use http::{Request, Response};
/// use syncguard::MemoryBackend;
/// use syncguard_tower::{HeldLock, LockLayer, key};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// let service = ServiceBuilder::new()
///     .layer(LockLayer::new(MemoryBackend::new(), key::method_and_path()))
///     .service(service_fn(|request: Request<String>| async move {
///         let fence = request.extensions().get::<HeldLock>().unwrap().fence();
///         Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::from(fence.to_string())))
///     }));
/// let response = service.oneshot(Request::new(String::new())).await.unwrap();
/// assert_eq!(response.status(), 200);
/// # }
/// ```
#[must_use]
pub struct LockService<S, K, M = Wrapped> {
    inner: S,
    layered: Arc<Layered<K>>,
    bodies: PhantomData<fn() -> M>,
}

impl<S, K, M> LockService<S, K, M> {
    pub(crate) fn new(inner: S, layered: Arc<Layered<K>>) -> Self {
        Self {
            inner,
            layered,
            bodies: PhantomData,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K, M> Clone for LockService<S, K, M> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), Arc::clone(&self.layered))
    }
}

impl<S: fmt::Debug, K, M> fmt::Debug for LockService<S, K, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("inner", &self.inner)
            .field("config", &self.layered.config)
            .finish_non_exhaustive()
    }
}

impl<S, K, M, ReqBody, ResBody> Service<Request<ReqBody>> for LockService<S, K, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: MakeKey<ReqBody>,
    M: ResponseBodies<ResBody>,
    ResBody: http_body::Body<Data = Bytes>,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, ResBody, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let Layered { make_key, config } = &*self.layered;
        let key = match make_key.make_key(&request) {
            Ok(key) => key,
            Err(no_key) if config.keyless == Keyless::RunUnlocked && !no_key.is_misconfigured() => {
                tracing::debug!(reason = %no_key, "syncguard_tower: no lock key for this request; running it unlocked, as the layer's Keyless::RunUnlocked says");
                request.extensions_mut().insert(RanUnlocked::new(&no_key));
                return ResponseFuture::unlocked(self.inner.call(request), Arc::clone(config));
            }
            Err(no_key) => {
                // Never the handler without its lock: the answer and the warning say why.
                tracing::warn!(reason = %no_key, "syncguard_tower: no lock key for this request, so it is refused without running the handler");
                return ResponseFuture::rejected(Rejection::NoKey(no_key), Arc::clone(config));
            }
        };
        // The service that was polled ready goes with the request; a clone stays for the next.
        let ready = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, ready);
        let acquire = acquire(key, Arc::clone(config));
        ResponseFuture::acquiring(acquire, ready, request, Arc::clone(config))
    }
}

/// Takes the lock on `key` for one request, or says what to answer instead. The response
/// future runs the lock's heartbeat itself (see [`ResponseFuture`]).
fn acquire(key: String, config: Arc<Config>) -> AcquireFuture {
    Box::pin(async move {
        match syncguard::acquire_with_polled_heartbeat(&config.backend, &key, &config.options).await
        {
            Ok(guard) => Ok(guard),
            Err(error) => Err(Rejection::from_acquire_error(&error, &key, &config)),
        }
    })
}
