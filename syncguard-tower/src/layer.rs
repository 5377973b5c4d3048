//! The layer: which backend, how requests are keyed, and the lock options.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use syncguard::{LockBackend, LockOptions};
use tower::Layer;

use crate::body::Wrapped;
use crate::config::{Answers, Config, Keyless, Layered, ReleaseOn};
#[cfg(feature = "grpc")]
use crate::protocol::Grpc;
use crate::protocol::Http;
use crate::service::LockService;

/// A [`tower::Layer`] that runs each request under the distributed lock its key names, so
/// that requests sharing a key run one at a time across every process sharing the backend.
///
/// For each request, the [key function](crate::MakeKey) gives the key; the layer acquires its
/// lock before calling the inner service (the handler never runs without it), puts a
/// [`HeldLock`](crate::HeldLock) in the request's extensions, runs the handler in the hold's
/// `syncguard.hold` tracing span, keeps the lock alive with a heartbeat, and releases it at the
/// end ([`ReleaseOn`]). A request the key function makes no key for is refused with an answer
/// and a warning naming what is missing, unless the layer says [`Keyless::RunUnlocked`] (see
/// [`key`](crate::key#when-there-is-no-key)).
///
/// How a lock is taken and kept is a [`syncguard::LockOptions`], set with
/// [`with_options`](Self::with_options); the rest are the layer's own settings.
///
/// # Default
/// | setting | default |
/// |---|---|
/// | [options](Self::with_options) | `LockOptions::builder().retry(RetryPolicy::single_attempt()).build()`, that is: |
/// | · ttl | 30 s ([`syncguard::LockOptions::DEFAULT_TTL`]) |
/// | · retry | [`RetryPolicy::single_attempt`](syncguard::RetryPolicy::single_attempt): a held key is answered at once, unless the options wait (for example [`RetryPolicy::wait_for`](syncguard::RetryPolicy::wait_for)) |
/// | · heartbeat | on: extends every third of the ttl while the request runs |
/// | · max_hold | none |
/// | · on_lost | [`OnLost::Cancel`](syncguard::OnLost::Cancel): the handler is dropped and 503 / `UNAVAILABLE` answered |
/// | · show_key | off: logs and spans name the lock by its key hash |
/// | [`release`](Self::with_release) | [`ReleaseOn::ResponseFuture`] |
/// | [`keyless`](Self::with_keyless) | [`Keyless::Refuse`]: a request without a key is refused |
/// | contention | `423 Locked` ([`with_contended_status`](Self::with_contended_status)); gRPC `ABORTED` ([`with_contended_code`][with_contended_code]) |
/// | [`max_retry_after`](Self::with_max_retry_after) | 5 s |
///
/// # Constructors
/// [`new`](Self::new) for any HTTP service (hyper, tower stacks); [`for_axum`][for_axum]
/// for axum routers (the same layer, whose responses carry axum's own body type, which axum
/// takes without boxing it again, feature `axum`); [`for_grpc`][for_grpc] for tonic (feature
/// `grpc`). The protocol is in the layer's type, `P`: an HTTP layer is a `LockLayer<K>`
/// (`LockLayer<K, Http>`), a gRPC one a `LockLayer<K, Grpc>` (see [`protocol`](crate::protocol)),
/// so that [`with_contended_status`](Self::with_contended_status) exists only on the first and
/// [`with_contended_code`][with_contended_code] only on the second.
///
/// # Answers
/// | situation | HTTP ([`new`](Self::new), [`for_axum`][for_axum]) | gRPC ([`for_grpc`][for_grpc]) |
/// |---|---|---|
/// | the key is held elsewhere (after waiting, if the options wait) | 423 (or 409), `Retry-After`, `application/problem+json` | `ABORTED`, `grpc-retry-pushback-ms` |
/// | the backend failed (unreachable, timeout, auth) | 503, `Retry-After: 1` | `UNAVAILABLE` |
/// | the key is invalid (empty, over 512 bytes) | 400 | `INVALID_ARGUMENT` |
/// | the request lacks what the key is made of ([`NoKey::missing`](crate::key::NoKey::missing)), under [`Keyless::Refuse`] | 400 | `INVALID_ARGUMENT` |
/// | the route cannot give a key ([`NoKey::misconfigured`](crate::key::NoKey::misconfigured)) | 500 | `INTERNAL` |
/// | the lock was lost before the response | 503 | `UNAVAILABLE` |
///
/// The answers without a key name what is missing (in the problem document's `detail`, or the
/// gRPC message), and so does the warning logged with each.
///
/// # `Retry-After`
/// A hint of when the holder is likely done, not a promise: in seconds, rounded up,
/// `clamp(min(lease, likely), 1 s, max_retry_after)`, where
///
/// - `lease` is the time until the holder's lease ends, plus syncguard's 1 s liveness
///   tolerance (at most the ttl plus 1 s): what the holder may take without renewing it, as
///   the refusal reported it
///   ([`LockError::holder_lease_left`](syncguard::LockError::holder_lease_left); no second
///   call to the backend). A heartbeat renews it while the handler runs, so alone it says
///   little (31 s for a 1.5 s handler under the default 30 s ttl);
/// - `likely` is the mean hold of this layer: an exponentially weighted mean (the newest hold
///   weighs 1/8) of the holds this layer's requests ended with a release, in this process. It
///   stands for the holders on other replicas too. How long the holder has held the lock
///   already is not subtracted: a refusal does not report it. Before any hold has ended,
///   `likely` is `lease`;
/// - `max_retry_after` is [`with_max_retry_after`](Self::with_max_retry_after) (5 s by
///   default).
///
/// When the refusal did not report the holder's expiry it is 1 s. gRPC's
/// `grpc-retry-pushback-ms` carries the same hint in milliseconds, unrounded.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use syncguard::{LockOptions, MemoryBackend, RetryPolicy};
/// use syncguard_tower::{HeldLock, LockLayer, ReleaseOn, key};
///
/// let options = LockOptions::builder()
///     .ttl(Duration::from_secs(10))
///     .retry(RetryPolicy::wait_for(Duration::from_secs(2)))
///     .max_hold(Duration::from_secs(300))
///     .build()?;
/// let locks = LockLayer::for_axum(MemoryBackend::new(), key::header("idempotency-key"))
///     .with_options(options)
///     .with_release(ReleaseOn::BodyEnd);
/// let app: Router = Router::new()
///     .route("/jobs", post(|lock: HeldLock| async move { format!("fence {}", lock.fence()) }))
///     .layer(locks);
/// # Ok::<(), syncguard::LockError>(())
/// ```
///
/// `P` is the protocol the layer answers in ([`Http`] or `Grpc`), `M` the body type of the
/// responses (see [`ResponseBodies`](crate::ResponseBodies)): a
/// [`LockBody`](crate::LockBody) around the inner body by default, or axum's `Body` with
/// [`for_axum`][for_axum].
///
// The constructors behind a feature: linked to the item when the feature is on, else to
// docs.rs (built with every feature), so that docs built without it have no broken links.
#[cfg_attr(feature = "axum", doc = "[for_axum]: Self::for_axum")]
#[cfg_attr(
    not(feature = "axum"),
    doc = concat!("[for_axum]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/struct.LockLayer.html#method.for_axum")
)]
#[cfg_attr(
    feature = "grpc",
    doc = "[for_grpc]: Self::for_grpc",
    doc = "[with_contended_code]: Self::with_contended_code"
)]
#[cfg_attr(
    not(feature = "grpc"),
    doc = concat!("[for_grpc]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/struct.LockLayer.html#method.for_grpc"),
    doc = concat!("[with_contended_code]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/struct.LockLayer.html#method.with_contended_code")
)]
#[must_use]
pub struct LockLayer<K, P = Http, M = Wrapped> {
    make_key: Arc<K>,
    config: Arc<Config>,
    kind: PhantomData<fn() -> (P, M)>,
}

impl<K, P, M> Clone for LockLayer<K, P, M> {
    fn clone(&self) -> Self {
        Self {
            make_key: Arc::clone(&self.make_key),
            config: Arc::clone(&self.config),
            kind: PhantomData,
        }
    }
}

impl<K, P, M> fmt::Debug for LockLayer<K, P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<K> LockLayer<K, Http> {
    /// A layer for HTTP services (axum, hyper, tower-http stacks) that locks each request on
    /// the key `make_key` gives, in `backend`.
    ///
    /// On an axum router, [`for_axum`][for_axum] (feature `axum`) does the same with less work
    /// per response.
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
    ///
    #[cfg_attr(feature = "axum", doc = "[for_axum]: LockLayer::for_axum")]
    #[cfg_attr(
        not(feature = "axum"),
        doc = concat!("[for_axum]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/struct.LockLayer.html#method.for_axum")
    )]
    pub fn new<B: LockBackend + 'static>(backend: B, make_key: K) -> Self {
        Self::build(Arc::new(backend), make_key)
    }
}

#[cfg(feature = "axum")]
impl<K> LockLayer<K, Http, axum::body::Body> {
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
    /// middleware that must run before routing: one service, nothing boxed or cloned per
    /// request by axum. Every
    /// request that carries a key is then locked, including those no route matches (they get
    /// their 404 under the lock). [`key::resource`](crate::key::resource) and
    /// [`key::route_param`](crate::key::route_param) need the route matched, so they need
    /// `Router::route_layer`. Wrap `router.with_state(())`, as
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

impl<K, P, M> LockLayer<K, P, M> {
    fn build(backend: Arc<dyn LockBackend>, make_key: K) -> Self {
        Self {
            kind: PhantomData,
            make_key: Arc::new(make_key),
            config: Arc::new(Config::new(backend)),
        }
    }

    fn config_mut(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// How every request's lock is taken and kept: ttl, waiting
    /// ([`retry`](syncguard::LockOptionsBuilder::retry)), heartbeat, `max_hold`, what a lost
    /// lock does ([`on_lost`](syncguard::LockOptionsBuilder::on_lost)), and whether logs and
    /// spans show the raw key ([`show_key`](syncguard::LockOptionsBuilder::show_key)).
    ///
    /// The options replace the layer's defaults as a whole, and `LockOptions`' own default
    /// retry policy waits up to 5 s: say [`RetryPolicy::single_attempt`] to keep answering a
    /// held key at once, or [`RetryPolicy::wait_for`] to wait for it (the request then waits
    /// in the layer, without running, until the key is free or the wait is over). To change
    /// some of the layer's defaults only, start from [`options`](Self::options).
    ///
    /// - **Heartbeat.** The extends run in the request's own task, when its response future
    ///   is polled: a handler that blocks its thread instead of awaiting (move such work to
    ///   `tokio::task::spawn_blocking`) delays them, and loses the lock if it blocks past the
    ///   ttl. While a [`ReleaseOn::BodyEnd`] body streams, a task of its own keeps the lock.
    /// - **Loss.** [`OnLost::Cancel`](syncguard::OnLost::Cancel) (the default) drops the
    ///   handler and answers 503 / `UNAVAILABLE` (or, while a [`ReleaseOn::BodyEnd`] body
    ///   streams, ends it with an error); [`OnLost::Notify`](syncguard::OnLost::Notify) lets
    ///   it run on, and the handler can watch its [`HeldLock`](crate::HeldLock)'s
    ///   [`is_lost`](syncguard::LockHandle::is_lost).
    ///   Either way, a handler that finishes when its lock is lost (also when its lease ran
    ///   out while its thread was blocked) does not get its response through: the layer
    ///   answers 503 / `UNAVAILABLE`, as the response was not made under the lock throughout.
    ///
    /// [`RetryPolicy::single_attempt`]: syncguard::RetryPolicy::single_attempt
    /// [`RetryPolicy::wait_for`]: syncguard::RetryPolicy::wait_for
    ///
    /// ```
    /// use std::time::Duration;
    /// use syncguard::{LockOptions, OnLost, RetryPolicy};
    /// use syncguard_tower::{LockLayer, key};
    ///
    /// let layer = LockLayer::new(syncguard::MemoryBackend::new(), key::method_and_path());
    /// // The layer's defaults, with a shorter ttl and a hold cap: held keys still answered at once.
    /// let options = layer
    ///     .options()
    ///     .to_builder()
    ///     .ttl(Duration::from_secs(5))
    ///     .max_hold(Duration::from_secs(60))
    ///     .build()?;
    /// let layer = layer.with_options(options);
    ///
    /// // Or options of its own: wait up to 3 s for a held key; let a handler that lost its
    /// // lock run on.
    /// let patient = LockOptions::builder()
    ///     .retry(RetryPolicy::wait_for(Duration::from_secs(3)))
    ///     .on_lost(OnLost::Notify)
    ///     .build()?;
    /// let layer = layer.with_options(patient);
    /// # let _ = layer;
    /// # Ok::<(), syncguard::LockError>(())
    /// ```
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.config_mut().options = options;
        self
    }

    /// The options every request's lock is taken and kept with (see
    /// [`with_options`](Self::with_options)).
    pub fn options(&self) -> &LockOptions {
        &self.config.options
    }

    /// What to do with a request its key function made no key for because the request lacks
    /// what the key is made of: [`Keyless::Refuse`] it (the default: 400, naming what is
    /// missing), or [`Keyless::RunUnlocked`], the explicit "no key, no lock". Requests of a
    /// route that cannot give a key are refused (500) either way.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use axum::{Router, body::Body, routing::post};
    /// use http::Request;
    /// use syncguard_tower::{HeldLock, Keyless, LockLayer, key};
    /// use tower::ServiceExt;
    ///
    /// // An optional Idempotency-Key: requests without one run, unlocked.
    /// let app = Router::new()
    ///     .route("/payments", post(|lock: Option<HeldLock>| async move { lock.is_some().to_string() }))
    ///     .layer(
    ///         LockLayer::for_axum(syncguard::MemoryBackend::new(), key::header("idempotency-key"))
    ///             .with_keyless(Keyless::RunUnlocked),
    ///     );
    /// let response = app.oneshot(Request::post("/payments").body(Body::empty()).unwrap()).await;
    /// assert_eq!(response.unwrap().status(), 200);
    /// # }
    /// ```
    pub fn with_keyless(mut self, keyless: Keyless) -> Self {
        self.config_mut().keyless = keyless;
        self
    }

    /// The longest `Retry-After` the layer answers a contended request with (gRPC:
    /// `grpc-retry-pushback-ms`): 5 s by default, at least 1 s. See [the hint's
    /// computation](Self#retry-after).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use syncguard_tower::{LockLayer, key};
    /// // Handlers that take about a minute: let clients wait up to 30 s between tries.
    /// let layer = LockLayer::new(syncguard::MemoryBackend::new(), key::method_and_path())
    ///     .with_max_retry_after(Duration::from_secs(30));
    /// # let _ = layer;
    /// ```
    pub fn with_max_retry_after(mut self, max: Duration) -> Self {
        self.config_mut().max_retry_after = max;
        self
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
        self.config_mut().release = release;
        self
    }
}

impl<K, M> LockLayer<K, Http, M> {
    /// The HTTP status for a key held elsewhere: `423 Locked` by default, or for example
    /// `409 Conflict`. (A gRPC layer answers with a gRPC code instead:
    /// [`with_contended_code`][with_contended_code].)
    ///
    /// ```
    /// # use syncguard_tower::{LockLayer, key};
    /// use http::StatusCode;
    /// let layer = LockLayer::new(syncguard::MemoryBackend::new(), key::method_and_path())
    ///     .with_contended_status(StatusCode::CONFLICT);
    /// # let _ = layer;
    /// ```
    ///
    #[cfg_attr(
        feature = "grpc",
        doc = "[with_contended_code]: LockLayer::with_contended_code"
    )]
    #[cfg_attr(
        not(feature = "grpc"),
        doc = concat!("[with_contended_code]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/struct.LockLayer.html#method.with_contended_code")
    )]
    pub fn with_contended_status(mut self, status: StatusCode) -> Self {
        self.config_mut().answers = Answers::Http { contended: status };
        self
    }
}

#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
impl<K> LockLayer<K, Grpc> {
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
    pub fn for_grpc<B: LockBackend + 'static>(backend: B, make_key: K) -> Self {
        let mut layer = Self::build(Arc::new(backend), make_key);
        layer.config_mut().answers = Answers::Grpc {
            contended: tonic::Code::Aborted,
        };
        layer
    }

    /// The gRPC status code for a key held elsewhere: `ABORTED` by default (the client may
    /// retry the whole call), or for example `RESOURCE_EXHAUSTED` or `FAILED_PRECONDITION`.
    /// (An HTTP layer answers with an HTTP status instead:
    /// [`with_contended_status`](LockLayer::with_contended_status).)
    ///
    /// ```
    /// # use syncguard_tower::{LockLayer, key};
    /// let layer = LockLayer::for_grpc(syncguard::MemoryBackend::new(), key::path_and_header("x-id"))
    ///     .with_contended_code(tonic::Code::FailedPrecondition);
    /// # let _ = layer;
    /// ```
    pub fn with_contended_code(mut self, code: tonic::Code) -> Self {
        self.config_mut().answers = Answers::Grpc { contended: code };
        self
    }
}

impl<S, K, P, M> Layer<S> for LockLayer<K, P, M> {
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
