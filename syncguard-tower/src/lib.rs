//! Tower middleware for [`syncguard`]: requests that share a key run one at a time across
//! every replica.
//!
//! Add one [`LockLayer`] to an axum router, a tonic server or any tower stack over `http`
//! requests. A [key function](key) picks the lock from the request (an order id in the path,
//! an `Idempotency-Key` header, a gRPC method and a metadata field); requests with the same
//! key are serialized through the shared backend (PostgreSQL, Redis, or in-process memory),
//! and the others run in parallel. While a handler runs its lock is extended by a heartbeat,
//! so long handlers keep it; if it is lost anyway, the handler is cancelled and the client told
//! (or, if you choose, only notified).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
//! use std::time::Duration;
//! use axum::{Router, body::Body, routing::post};
//! use http::Request;
//! use syncguard::{LockOptions, MemoryBackend, RetryPolicy};
//! use syncguard_tower::{HeldLock, LockLayer, key};
//! use tower::ServiceExt;
//!
//! async fn pay(lock: HeldLock) -> String {
//!     // Exclusive per order across every replica; pass the fence to the store.
//!     format!("paid with fence {}", lock.fence())
//! }
//!
//! async fn refund(lock: HeldLock) -> String {
//!     format!("refunded with fence {}", lock.fence())
//! }
//!
//! let backend = MemoryBackend::new(); // or PostgresBackend / RedisBackend, shared by replicas
//! let options = LockOptions::builder()
//!     .ttl(Duration::from_secs(10))
//!     .retry(RetryPolicy::single_attempt()) // a held key is answered at once
//!     .build()?;
//! let app = Router::new()
//!     .route("/orders/{id}/pay", post(pay))
//!     .route("/orders/{id}/refund", post(refund))
//!     // One request at a time per order: both routes lock "order:<id>".
//!     .route_layer(
//!         LockLayer::for_axum(backend.clone(), key::resource("order", "id")).with_options(options),
//!     );
//!
//! let post = |path: &str| Request::post(path).body(Body::empty()).unwrap();
//! assert_eq!(app.clone().oneshot(post("/orders/42/pay")).await.unwrap().status(), 200);
//!
//! // While order 42 is held (a payment of it in progress, on any replica), its refund is
//! // answered 423 Locked, with Retry-After; another order's runs.
//! let held = syncguard::acquire(&backend, "order:42", &LockOptions::default()).await?;
//! let response = app.clone().oneshot(post("/orders/42/refund")).await.unwrap();
//! assert_eq!(response.status(), 423);
//! assert!(response.headers().contains_key("retry-after"));
//! assert_eq!(app.oneshot(post("/orders/43/refund")).await.unwrap().status(), 200);
//! held.release().await?;
//! # Ok(()) }
//! ```
//!
//! - **Keys**: [`MakeKey`], implemented by (feature `axum`) [`key::resource`] (a lock per
//!   resource: `key::resource("order", "id")` locks `/orders/42/pay` and `/orders/42/refund`
//!   on `order:42`, and `/users/{id}` with `key::resource("user", "id")` on `user:42`) and
//!   [`key::route_param`] (per route and id), by [`key::header`], [`key::method_and_path`],
//!   [`key::path_and_header`], and by closures returning `Option<String>` or
//!   `Result<String, key::NoKey>`.
//! - **No key, no run**: a request its key function makes no key for is refused (400 when the
//!   request lacks a header, 500 when the route lacks the parameter) with an answer and a
//!   warning that name what is missing; it runs unlocked only if the layer says
//!   [`Keyless::RunUnlocked`].
//! - **Options**: how a lock is taken and kept is a [`syncguard::LockOptions`]
//!   ([`LockLayer::with_options`]: ttl, waiting, heartbeat, `max_hold`, what a lost lock does,
//!   whether logs show raw keys); by default a held key is answered at once. The layer's own
//!   settings: when to release ([`ReleaseOn`]: when the response future completes, or when
//!   the body has been sent) and the contention status (an HTTP status on an HTTP layer, a
//!   gRPC code on a gRPC one: the [protocol](protocol) is in the layer's type).
//! - **Answers**: 423 Locked (or 409) with `Retry-After` (when the holder is likely done, from
//!   the holds the layer has seen, at most 5 s by default: [how it is
//!   computed](LockLayer#retry-after)) and a JSON problem document when the key is held; 503 when the backend fails (the handler never runs without its lock); gRPC
//!   statuses with [`LockLayer::for_grpc`] (feature `grpc`): `ABORTED`, `UNAVAILABLE`.
//! - **In the handler**: [`HeldLock`] (fence, lock id, expiry, loss: it derefs to a
//!   [`syncguard::LockHandle`], whose accessors a guard has too) from the request's
//!   extensions, or as an axum extractor.
//! - **Observability**: the handler runs in the hold's `syncguard.hold` tracing span (key hash,
//!   fence, outcome), and every warning the layer logs names the lock (`lock = key hash …`,
//!   with the key itself only under [`show_key`](syncguard::LockOptionsBuilder::show_key)).
//!
//! # `syncguard`
//!
//! The options, the lock's types and the errors are [`syncguard`]'s: depend on `syncguard`
//! (with the backend's feature, for example `syncguard = { version = "...", features =
//! ["postgres"] }`) and name them from there (`syncguard::LockOptions`,
//! `syncguard::RetryPolicy`, `syncguard::LockHandle`, which [`HeldLock`] derefs to). This
//! crate re-exports [`syncguard`] itself, at the version it was built with.
//!
//! # Features
//! | feature | default | what |
//! |---|---|---|
//! | `axum` | yes | [`LockLayer::for_axum`], [`HeldLock`] as an axum extractor, [`key::resource`], [`key::route_param`] |
//! | `grpc` | no | [`LockLayer::for_grpc`]: rejections as `tonic::Status` |
//!
// The links to items behind a feature: to the item when the feature is on, else to docs.rs
// (built with every feature), so that docs built without it have no broken links.
#![cfg_attr(
    feature = "axum",
    doc = "[`LockLayer::for_axum`]: LockLayer::for_axum",
    doc = "[`key::resource`]: key::resource",
    doc = "[`key::route_param`]: key::route_param"
)]
#![cfg_attr(
    not(feature = "axum"),
    doc = concat!("[`LockLayer::for_axum`]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/struct.LockLayer.html#method.for_axum"),
    doc = concat!("[`key::resource`]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/key/fn.resource.html"),
    doc = concat!("[`key::route_param`]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/key/fn.route_param.html")
)]
#![cfg_attr(feature = "grpc", doc = "[`LockLayer::for_grpc`]: LockLayer::for_grpc")]
#![cfg_attr(
    not(feature = "grpc"),
    doc = concat!("[`LockLayer::for_grpc`]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/struct.LockLayer.html#method.for_grpc")
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The modules import one way only: `layer` (the `LockLayer` and its settings) → `service`
// (keys the request, starts the acquisition) → `future` (acquire, run under the lock,
// release) → `response` (the rejections) → `body` (`LockBody`); all of them read `config`
// (what one layer's services share), and `key`, `extension` and `protocol` import none of
// them.
mod body;
mod config;
mod extension;
mod future;
pub mod key;
mod layer;
pub mod protocol;
mod response;
mod retry_after;
mod service;

pub use body::{LockBody, ResponseBodies, Wrapped};
pub use config::{Keyless, ReleaseOn};
pub use extension::HeldLock;
#[cfg(feature = "axum")]
pub use extension::MissingLock;
pub use future::ResponseFuture;
pub use key::MakeKey;
pub use layer::LockLayer;
pub use service::LockService;

pub use syncguard;
