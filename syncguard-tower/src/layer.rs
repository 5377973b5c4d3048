//! The layer: which backend, how requests are keyed, and the lock options.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use syncguard::{LockBackend, LockOptions, OnLost, RetryPolicy};
use tower::Layer;

use crate::body::Wrapped;
use crate::service::LockService;

/// When the layer releases a request's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ReleaseOn {
    /// When the inner service's response future completes, that is once the handler has
    /// returned the response head (status and headers). The default.
    ///
    /// The lock is released (and the release awaited) before the response is handed on, so a
    /// client that sends the next request with the same key after reading the response finds
    /// the lock free. **A streaming body is sent after the release, unlocked**: if producing
    /// the body is part of the critical section (a body that streams the output of the work),
    /// use [`BodyEnd`](Self::BodyEnd).
    #[default]
    ResponseFuture,
    /// When the response body has been sent in full (it reported its end), or when it is
    /// dropped unfinished (the client went away). The lock, its heartbeat and loss detection
    /// cover the whole stream: with [`OnLost::Cancel`] a loss while streaming ends the body
    /// with an error, which aborts the response (HTTP/1 closes the connection, HTTP/2 resets
    /// the stream), because the status has already been sent.
    BodyEnd,
}

/// Settings shared by every service of one layer, and by their requests: one reference count
/// per request for all of them.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) backend: Arc<dyn LockBackend>,
    /// How every request's lock is taken and kept (ttl, waiting, heartbeat, hold cap); the key
    /// is each request's own, so the one here is empty and unused.
    pub(crate) lock: LockOptions,
    pub(crate) release: ReleaseOn,
    pub(crate) on_lost: OnLost,
    /// The HTTP status for a contended key.
    pub(crate) contended_status: StatusCode,
    /// `Some` on a gRPC layer: the status code for a contended key.
    #[cfg(feature = "grpc")]
    pub(crate) grpc_contended: Option<tonic::Code>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut config = f.debug_struct("Config");
        config
            .field("backend", &self.backend.capabilities().backend)
            .field("lock", &self.lock)
            .field("release", &self.release)
            .field("on_lost", &self.on_lost)
            .field("contended_status", &self.contended_status);
        #[cfg(feature = "grpc")]
        config.field("grpc_contended", &self.grpc_contended);
        config.finish()
    }
}

/// What the services of one layer share: each request clones it once (axum clones the service
/// for every request), so it is one reference count, not one per field.
pub(crate) struct Layered<K> {
    pub(crate) make_key: Arc<K>,
    pub(crate) config: Arc<Config>,
}

/// A [`tower::Layer`] that runs each request under the distributed lock its key names, so
/// that requests sharing a key run one at a time across every process sharing the backend.
///
/// Requests whose [key function](crate::MakeKey) returns `None` pass through unlocked.
/// For the others, the layer acquires the lock before calling the inner service (the handler
/// never runs without it), puts a [`HeldLock`](crate::HeldLock) in the request's extensions,
/// keeps the lock alive with a heartbeat, and releases it at the end ([`ReleaseOn`]).
///
/// # Default
/// | setting | default |
/// |---|---|
/// | [`ttl`](Self::with_ttl) | 30 s |
/// | [`wait`](Self::with_wait) | none: a held key is answered at once |
/// | [`heartbeat`](Self::with_heartbeat) | on: extends every third of the ttl while the request runs |
/// | [`max_hold`](Self::with_max_hold) | none |
/// | [`release`](Self::with_release) | [`ReleaseOn::ResponseFuture`] |
/// | [`on_lost`](Self::with_on_lost) | [`OnLost::Cancel`]: the handler is dropped and 503 / `UNAVAILABLE` answered |
/// | contention | `423 Locked` ([`with_contended_status`](Self::with_contended_status)); gRPC `ABORTED` |
///
/// # Constructors
/// [`new`](Self::new) for any HTTP service (hyper, tower stacks); [`for_axum`](Self::for_axum)
/// for axum routers (the same layer, whose responses carry axum's own body type, which axum
/// takes without boxing it again); [`for_grpc`](Self::for_grpc) for tonic.
///
/// # Answers
/// | situation | HTTP ([`new`](Self::new), [`for_axum`](Self::for_axum)) | gRPC ([`for_grpc`](Self::for_grpc)) |
/// |---|---|---|
/// | the key is held elsewhere (after waiting, if configured) | 423 (or 409), `Retry-After`, `application/problem+json` | `ABORTED`, `grpc-retry-pushback-ms` |
/// | the backend failed (unreachable, timeout, auth) | 503, `Retry-After: 1` | `UNAVAILABLE` |
/// | the key is invalid (empty, over 512 bytes) | 400 | `INVALID_ARGUMENT` |
/// | the lock was lost before the response (with `OnLost::Cancel`) | 503 | `UNAVAILABLE` |
///
/// `Retry-After` is the number of seconds until the holder's lease runs out, plus the 1 s
/// liveness tolerance, at least 1 and at most this layer's ttl plus 1 s (the holder's
/// heartbeat may extend it again: it is a hint, not a promise).
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use syncguard::MemoryBackend;
/// use syncguard_tower::{HeldLock, LockLayer, ReleaseOn, key};
///
/// let locks = LockLayer::for_axum(MemoryBackend::new(), key::header("idempotency-key"))
///     .with_ttl(Duration::from_secs(10))
///     .with_wait(Duration::from_secs(2))
///     .with_max_hold(Duration::from_secs(300))
///     .with_release(ReleaseOn::BodyEnd);
/// let app: Router = Router::new()
///     .route("/jobs", post(|lock: HeldLock| async move { format!("fence {}", lock.fence()) }))
///     .layer(locks);
/// ```
///
/// `M` is the body type of the responses (see [`ResponseBodies`](crate::ResponseBodies)): a
/// [`LockBody`](crate::LockBody) around the inner body by default, or axum's `Body` with
/// [`for_axum`](LockLayer::for_axum).
#[must_use]
pub struct LockLayer<K, M = Wrapped> {
    make_key: Arc<K>,
    config: Arc<Config>,
    bodies: PhantomData<fn() -> M>,
}

impl<K, M> Clone for LockLayer<K, M> {
    fn clone(&self) -> Self {
        Self {
            make_key: Arc::clone(&self.make_key),
            config: Arc::clone(&self.config),
            bodies: PhantomData,
        }
    }
}

impl<K, M> fmt::Debug for LockLayer<K, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<K> LockLayer<K> {
    /// A layer for HTTP services (axum, hyper, tower-http stacks) that locks each request on
    /// the key `make_key` gives, in `backend`.
    ///
    /// On an axum router, [`for_axum`](LockLayer::for_axum) does the same with less work per
    /// response.
    ///
    /// `make_key` is a built-in from [`key`](crate::key) or a closure
    /// `Fn(&http::Request<B>) -> Option<String>` (annotate the argument's type, for example
    /// `|request: &axum::extract::Request| ...`).
    ///
    /// ```
    /// use syncguard::MemoryBackend;
    /// use syncguard_tower::{LockLayer, key};
    ///
    /// let layer = LockLayer::new(MemoryBackend::new(), key::method_and_path());
    /// # let _ = layer;
    /// ```
    pub fn new<B: LockBackend + 'static>(backend: B, make_key: K) -> Self {
        Self::build(Arc::new(backend), make_key)
    }

    /// A layer for gRPC services (tonic), which answers with gRPC statuses: `ABORTED` when the
    /// key is held elsewhere, `UNAVAILABLE` when the backend failed or the lock was lost,
    /// `INVALID_ARGUMENT` for an invalid key. Add it with `tonic::transport::Server::layer`.
    ///
    /// ```
    /// use syncguard::MemoryBackend;
    /// use syncguard_tower::{LockLayer, key};
    ///
    /// // Calls of one method for one job id (sent as metadata) run one at a time.
    /// let layer = LockLayer::for_grpc(MemoryBackend::new(), key::path_and_header("x-job-id"));
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "grpc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
    pub fn for_grpc<B: LockBackend + 'static>(backend: B, make_key: K) -> Self {
        let mut layer = Self::build(Arc::new(backend), make_key);
        layer.config().grpc_contended = Some(tonic::Code::Aborted);
        layer
    }
}

#[cfg(feature = "axum")]
impl<K> LockLayer<K, axum::body::Body> {
    /// [`new`](LockLayer::new) for axum routers: the responses carry axum's own `Body`, so
    /// axum takes them as they are, where it would box a [`LockBody`](crate::LockBody) (one
    /// allocation and one indirection per response; the handler's body is handed on
    /// untouched). The answers and options are those of [`new`](LockLayer::new).
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use syncguard::MemoryBackend;
    /// use syncguard_tower::{LockLayer, key};
    ///
    /// let app: Router = Router::new()
    ///     .route("/jobs", post(|| async { "done" }))
    ///     .layer(LockLayer::for_axum(MemoryBackend::new(), key::header("idempotency-key")));
    /// ```
    ///
    /// # Around the whole router
    /// `Router::layer` wraps every route, and axum then boxes and clones the layered route for
    /// each request. When the key needs no route matching (a header, the method and path, a
    /// closure over the request), the layer can instead go around the router, as axum does for
    /// middleware that must run before routing: one service, nothing boxed, about 850
    /// instructions and two allocations less per request (see the README's figures). Every
    /// request that carries a key is then locked, including those no route matches (they get
    /// their 404 under the lock). [`key::path_param`](crate::key::path_param) needs the route
    /// matched, so it needs `Router::route_layer`. Wrap `router.with_state(())`, as
    /// `axum::serve` does with a bare router: it turns the handlers into routes once, where a
    /// wrapped router would do it for every request.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> std::io::Result<()> {
    /// use axum::{Router, ServiceExt, extract::Request, routing::post};
    /// use syncguard::MemoryBackend;
    /// use syncguard_tower::{HeldLock, LockLayer, key};
    /// use tower::Layer;
    ///
    /// let router = Router::new().route("/jobs", post(|lock: HeldLock| async move {
    ///     format!("fence {}", lock.fence())
    /// }));
    /// let app = LockLayer::for_axum(MemoryBackend::new(), key::header("idempotency-key"))
    ///     .layer(router.with_state(()));
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let server = axum::serve(listener, ServiceExt::<Request>::into_make_service(app));
    /// # drop(server); Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn for_axum<B: LockBackend + 'static>(backend: B, make_key: K) -> Self {
        Self::build(Arc::new(backend), make_key)
    }
}

impl<K, M> LockLayer<K, M> {
    fn build(backend: Arc<dyn LockBackend>, make_key: K) -> Self {
        Self {
            bodies: PhantomData,
            make_key: Arc::new(make_key),
            config: Arc::new(Config {
                backend,
                lock: LockOptions::new(String::new())
                    .with_ttl(syncguard::DEFAULT_TTL)
                    .with_retry(RetryPolicy::single_attempt())
                    .with_heartbeat(true),
                release: ReleaseOn::default(),
                on_lost: OnLost::Cancel,
                contended_status: StatusCode::LOCKED,
                #[cfg(feature = "grpc")]
                grpc_contended: None,
            }),
        }
    }

    fn config(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    fn lock_options(mut self, set: impl FnOnce(LockOptions) -> LockOptions) -> Self {
        let lock = &mut self.config().lock;
        *lock = set(std::mem::replace(lock, LockOptions::new(String::new())));
        self
    }

    /// How long a lock lives without an extend: how quickly the key frees up when the replica
    /// holding it crashes. With the heartbeat on it does not limit the handler's run time.
    ///
    /// # Panics
    /// If `ttl` is under 1 ms or over 365 days.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use syncguard_tower::{LockLayer, key};
    /// let layer = LockLayer::new(syncguard::MemoryBackend::new(), key::method_and_path())
    ///     .with_ttl(Duration::from_secs(5));
    /// # let _ = layer;
    /// ```
    pub fn with_ttl(self, ttl: Duration) -> Self {
        if let Err(error) = syncguard::time::ttl_millis(ttl) {
            panic!("LockLayer::with_ttl: {error}");
        }
        self.lock_options(|lock| lock.with_ttl(ttl))
    }

    /// Waits up to `wait` for a held key to free up (retrying with syncguard's default
    /// exponential backoff and jitter) before answering "locked". `Duration::ZERO` is the
    /// default: one attempt, no wait.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use syncguard_tower::{LockLayer, key};
    /// let layer = LockLayer::new(syncguard::MemoryBackend::new(), key::method_and_path())
    ///     .with_wait(Duration::from_secs(3));
    /// # let _ = layer;
    /// ```
    pub fn with_wait(self, wait: Duration) -> Self {
        let retry = if wait.is_zero() {
            RetryPolicy::single_attempt()
        } else {
            RetryPolicy::new()
                .with_max_retries(u32::MAX)
                .with_timeout(wait)
        };
        self.with_retry(retry)
    }

    /// Waits as `retry` says (retries, delays, backoff, jitter, timeout) for a held key.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use syncguard_tower::{LockLayer, key};
    /// use syncguard::RetryPolicy;
    /// let layer = LockLayer::new(syncguard::MemoryBackend::new(), key::method_and_path())
    ///     .with_retry(RetryPolicy::new().with_base_delay(Duration::from_millis(20)));
    /// # let _ = layer;
    /// ```
    pub fn with_retry(self, retry: RetryPolicy) -> Self {
        self.lock_options(|lock| lock.with_retry(retry))
    }

    /// Whether to extend the lock while the request runs (default on). Without it, a request
    /// that outlives the ttl loses its lock.
    ///
    /// The extends run in the request's own task, when its response future is polled: a
    /// handler that blocks its thread instead of awaiting (move such work to
    /// `tokio::task::spawn_blocking`) delays them, and loses the lock if it blocks past the
    /// ttl. While a [`ReleaseOn::BodyEnd`] body streams, a task of its own keeps the lock.
    ///
    /// ```
    /// # use syncguard_tower::{LockLayer, key};
    /// let layer = LockLayer::new(syncguard::MemoryBackend::new(), key::method_and_path())
    ///     .with_heartbeat(false);
    /// # let _ = layer;
    /// ```
    pub fn with_heartbeat(self, heartbeat: bool) -> Self {
        self.lock_options(|lock| lock.with_heartbeat(heartbeat))
    }

    /// Stops extending once a request has held its lock this long; the lock then runs out and
    /// counts as lost (see [`with_on_lost`](Self::with_on_lost)). A guard against handlers
    /// that hang.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use syncguard_tower::{LockLayer, key};
    /// let layer = LockLayer::new(syncguard::MemoryBackend::new(), key::method_and_path())
    ///     .with_max_hold(Duration::from_secs(60));
    /// # let _ = layer;
    /// ```
    pub fn with_max_hold(self, max_hold: Duration) -> Self {
        self.lock_options(|lock| lock.with_max_hold(max_hold))
    }

    /// When to release the lock: see [`ReleaseOn`].
    ///
    /// ```
    /// # use syncguard_tower::{LockLayer, ReleaseOn, key};
    /// let layer = LockLayer::new(syncguard::MemoryBackend::new(), key::method_and_path())
    ///     .with_release(ReleaseOn::BodyEnd);
    /// # let _ = layer;
    /// ```
    pub fn with_release(mut self, release: ReleaseOn) -> Self {
        self.config().release = release;
        self
    }

    /// What a lost lock does to the request: [`OnLost::Cancel`] (default) drops the handler
    /// and answers 503 / `UNAVAILABLE` (or, while a [`ReleaseOn::BodyEnd`] body streams, ends
    /// it with an error); [`OnLost::Notify`] lets it run on, and the handler can watch
    /// [`HeldLock::is_lost`](crate::HeldLock::is_lost). Either way, a handler that finishes
    /// when its lock is lost (also when its lease ran out while its thread was blocked) does
    /// not get its response through: the layer answers 503 / `UNAVAILABLE`, as the response
    /// was not made under the lock throughout.
    ///
    /// ```
    /// # use syncguard_tower::{LockLayer, key};
    /// use syncguard::OnLost;
    /// let layer = LockLayer::new(syncguard::MemoryBackend::new(), key::method_and_path())
    ///     .with_on_lost(OnLost::Notify);
    /// # let _ = layer;
    /// ```
    pub fn with_on_lost(mut self, on_lost: OnLost) -> Self {
        self.config().on_lost = on_lost;
        self
    }

    /// The HTTP status for a key held elsewhere: `423 Locked` by default, or for example
    /// `409 Conflict`. No effect on a [`for_grpc`](Self::for_grpc) layer.
    ///
    /// ```
    /// # use syncguard_tower::{LockLayer, key};
    /// use http::StatusCode;
    /// let layer = LockLayer::new(syncguard::MemoryBackend::new(), key::method_and_path())
    ///     .with_contended_status(StatusCode::CONFLICT);
    /// # let _ = layer;
    /// ```
    pub fn with_contended_status(mut self, status: StatusCode) -> Self {
        self.config().contended_status = status;
        self
    }

    /// The gRPC status code for a key held elsewhere: `ABORTED` by default (the client may
    /// retry the whole call), or for example `RESOURCE_EXHAUSTED` or `FAILED_PRECONDITION`.
    /// No effect on an HTTP layer.
    ///
    /// ```
    /// # use syncguard_tower::{LockLayer, key};
    /// let layer = LockLayer::for_grpc(syncguard::MemoryBackend::new(), key::path_and_header("x-id"))
    ///     .with_contended_code(tonic::Code::FailedPrecondition);
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "grpc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
    pub fn with_contended_code(mut self, code: tonic::Code) -> Self {
        let config = self.config();
        if config.grpc_contended.is_some() {
            config.grpc_contended = Some(code);
        }
        self
    }
}

impl<S, K, M> Layer<S> for LockLayer<K, M> {
    type Service = LockService<S, K, M>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService::new(
            inner,
            Arc::new(Layered {
                make_key: Arc::clone(&self.make_key),
                config: Arc::clone(&self.config),
            }),
        )
    }
}
