//! The protocol a [`LockLayer`](crate::LockLayer) answers in, as its type says: each answer
//! setting exists only on the layer whose answers it changes.
//!
//! | layer | made by | answers | its own setting |
//! |---|---|---|---|
//! | `LockLayer<K, Http>` (`LockLayer<K>`) | [`new`](crate::LockLayer::new), [`for_axum`][for_axum] | HTTP statuses and problem documents | [`with_contended_status`](crate::LockLayer::with_contended_status) |
//! | `LockLayer<K, Grpc>` | [`for_grpc`][for_grpc] (feature `grpc`) | gRPC statuses | [`with_contended_code`][with_contended_code] |
//!
//! Every other setting ([`with_options`](crate::LockLayer::with_options), ...) is the same on
//! both.
//!
//! ```
//! use http::StatusCode;
//! use syncguard::MemoryBackend;
//! use syncguard_tower::protocol::Http;
//! use syncguard_tower::{LockLayer, key};
//!
//! let layer: LockLayer<key::MethodAndPath, Http> =
//!     LockLayer::new(MemoryBackend::new(), key::method_and_path())
//!         .with_contended_status(StatusCode::CONFLICT);
//! # let _ = layer;
//! ```
//!
//! A gRPC layer has no HTTP status to set:
//!
//! ```compile_fail,E0599
//! # use syncguard::MemoryBackend;
//! # use syncguard_tower::{LockLayer, key};
//! let layer = LockLayer::for_grpc(MemoryBackend::new(), key::path_and_header("x-job-id"))
//!     .with_contended_status(http::StatusCode::CONFLICT);
//! ```
//!
//! and an HTTP layer no gRPC code:
//!
//! ```compile_fail,E0599
//! # use syncguard::MemoryBackend;
//! # use syncguard_tower::{LockLayer, key};
//! let layer = LockLayer::new(MemoryBackend::new(), key::method_and_path())
//!     .with_contended_code(tonic::Code::FailedPrecondition);
//! ```
// The items behind the `grpc` feature: linked to the item when the feature is on, else to
// docs.rs (built with every feature), so that docs built without it have no broken links.
#![cfg_attr(feature = "axum", doc = "[for_axum]: crate::LockLayer::for_axum")]
#![cfg_attr(
    not(feature = "axum"),
    doc = concat!("[for_axum]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/struct.LockLayer.html#method.for_axum")
)]
#![cfg_attr(
    feature = "grpc",
    doc = "[for_grpc]: crate::LockLayer::for_grpc",
    doc = "[with_contended_code]: crate::LockLayer::with_contended_code"
)]
#![cfg_attr(
    not(feature = "grpc"),
    doc = concat!("[for_grpc]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/struct.LockLayer.html#method.for_grpc"),
    doc = concat!("[with_contended_code]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/struct.LockLayer.html#method.with_contended_code")
)]

/// The protocol of a layer that answers in HTTP (423 or 409 with a problem document, 503,
/// 400, 500): [`LockLayer::new`](crate::LockLayer::new) and `for_axum`. Only named, never a
/// value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Http {}

/// The protocol of a layer that answers in gRPC statuses (`ABORTED`, `UNAVAILABLE`,
/// `INVALID_ARGUMENT`, `INTERNAL`): `LockLayer::for_grpc`. Only named, never a value.
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Grpc {}
