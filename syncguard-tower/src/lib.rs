//! Tower middleware for [`syncguard`]: requests that share a key run one at a time across
//! every replica.
//!
//! Add one [`LockLayer`] to an axum router, a tonic server or any tower stack over `http`
//! requests. A [key function](key) picks the lock from the request (an `Idempotency-Key`
//! header, a job id in the path, a gRPC method and a metadata field); requests with the same
//! key are serialized through the shared backend (PostgreSQL, Redis, or in-process memory),
//! and the others run in parallel. While a handler runs its lock is extended by a heartbeat,
//! so long handlers keep it; if it is lost anyway, the handler is cancelled and the client told
//! (or, if you choose, only notified).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::time::Duration;
//! use axum::{Router, body::Body, routing::post};
//! use http::Request;
//! use syncguard::MemoryBackend;
//! use syncguard_tower::{HeldLock, LockLayer, key};
//! use tower::ServiceExt;
//!
//! async fn create_job(lock: HeldLock) -> String {
//!     // Exclusive per Idempotency-Key across every replica; pass the fence to the store.
//!     format!("created with fence {}", lock.fence())
//! }
//!
//! let backend = MemoryBackend::new(); // or PostgresBackend / RedisBackend, shared by replicas
//! let app = Router::new().route("/jobs", post(create_job)).layer(
//!     LockLayer::for_axum(backend.clone(), key::header("idempotency-key"))
//!         .with_ttl(Duration::from_secs(10)),
//! );
//!
//! let request = || Request::post("/jobs").header("idempotency-key", "a1").body(Body::empty()).unwrap();
//! assert_eq!(app.clone().oneshot(request()).await.unwrap().status(), 200);
//!
//! // While another replica holds the key, the request is answered 423 Locked, with Retry-After.
//! let held = syncguard::acquire(&backend, &syncguard::LockOptions::new("idempotency-key:a1")).await.unwrap();
//! let response = app.oneshot(request()).await.unwrap();
//! assert_eq!(response.status(), 423);
//! assert!(response.headers().contains_key("retry-after"));
//! held.release().await.unwrap();
//! # }
//! ```
//!
//! - **Keys**: [`MakeKey`], implemented by closures `Fn(&http::Request<B>) -> Option<String>`
//!   and by [`key::header`], [`key::method_and_path`], [`key::path_and_header`] and (feature
//!   `axum`) [`key::path_param`]. `None` lets the request through unlocked.
//! - **Options** on [`LockLayer`]: ttl, waiting (none by default), heartbeat, `max_hold`, when
//!   to release ([`ReleaseOn`]: when the response future completes, or when the body has been
//!   sent), what a lost lock does ([`syncguard::OnLost`]), the contention status.
//! - **Answers**: 423 Locked (or 409) with `Retry-After` and a JSON problem document when the
//!   key is held; 503 when the backend fails (the handler never runs without its lock); gRPC
//!   statuses with [`LockLayer::for_grpc`] (feature `grpc`): `ABORTED`, `UNAVAILABLE`.
//! - **In the handler**: [`HeldLock`] (fence, lock id, loss) from the request's extensions, or
//!   as an axum extractor.
//!
//! # Features
//! | feature | default | what |
//! |---|---|---|
//! | `axum` | yes | [`LockLayer::for_axum`], [`HeldLock`] as an axum extractor, [`key::path_param`] |
//! | `grpc` | no | [`LockLayer::for_grpc`]: rejections as `tonic::Status` |
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod extension;
mod future;
pub mod key;
mod layer;
mod response;
mod service;

pub use body::{BoxError, LockBody, ResponseBodies, Wrapped};
pub use extension::HeldLock;
#[cfg(feature = "axum")]
pub use extension::MissingLock;
pub use future::ResponseFuture;
pub use key::MakeKey;
pub use layer::{LockLayer, ReleaseOn};
pub use service::LockService;
