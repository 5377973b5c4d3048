//! Distributed locks for async Rust, with fencing tokens and an automatic heartbeat.
//!
//! A lock is taken on a string key from a [`LockBackend`] (PostgreSQL, Redis, Firestore, or
//! the in-process [`MemoryBackend`]). While it is held, a heartbeat extends it; if it is lost
//! anyway, the holder is told and, under [`with_lock`], the work is cancelled. Every
//! acquisition carries a [`Fence`], a per-key counter that only grows, so the resource the
//! lock protects can refuse a stale holder.
//!
//! Storage formats, key derivation and semantics follow the SyncGuard reference design, so
//! Rust and TypeScript SyncGuard services can share locks.
//!
//! # Quick start
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
//! use std::time::Duration;
//! use syncguard::{LockOptions, MemoryBackend};
//!
//! let backend = MemoryBackend::new();
//! let options = LockOptions::new("job:42").with_ttl(Duration::from_secs(30));
//!
//! let processed = syncguard::with_lock(&backend, &options, async |guard| {
//!     // Exclusive across every process sharing the backend; kept alive by the heartbeat.
//!     println!("processing job 42 with fence {}", guard.fence());
//!     Ok::<_, syncguard::LockError>(true)
//! })
//! .await?;
//! assert!(processed);
//! # Ok(()) }
//! ```
//!
//! # Layers
//!
//! - [`LockBackend`]: single-attempt operations on one store (acquire, release, extend,
//!   is_locked, lookup). Implement it to add a store; check it with the [`conformance`]
//!   suite.
//! - [`acquire`] and [`LockGuard`]: waiting with backoff ([`RetryPolicy`]), heartbeat, loss
//!   signalling, release.
//! - [`with_lock`]: work under a lock in one call.
//! - [`get_by_key`], [`get_by_id`], [`owns`]: diagnostics.
//!
//! # Features
//!
//! - `memory` (default): [`MemoryBackend`].
//! - `conformance`: the backend-agnostic [`conformance`] suite.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod error;
mod fence;
mod guard;
pub mod key;
mod lock;
mod lock_id;
#[cfg(feature = "memory")]
mod memory;
mod retry;
pub mod time;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, Lease, LockBackend, LockInfo,
    LockInfoRaw, Lookup, NotHeldReason, ReleaseOutcome, TimeAuthority, get_by_id, get_by_id_raw,
    get_by_key, get_by_key_raw, owns,
};
pub use error::{BoxError, ErrorCode, LockError, LostReason};
pub use fence::{FENCE_MAX, FENCE_WARN, Fence};
pub use guard::LockGuard;
pub use lock::{
    DEFAULT_TTL, LockOptions, OnLost, acquire, default_backend, set_default_backend, with_lock,
};
pub use lock_id::{LOCK_ID_LEN, LockId};
#[cfg(feature = "memory")]
pub use memory::MemoryBackend;
pub use retry::{Backoff, Jitter, RetryPolicy};
