//! Distributed locks for async Rust, with fencing tokens, an automatic heartbeat and a loss
//! signal, on PostgreSQL, Redis, Firestore or in-process memory.
//!
//! - **Fencing.** Every acquisition carries a [`Fence`] that only grows from one holder to
//!   the next: pass it to the resource you write to, so that a holder whose lock was taken
//!   over (after a pause, a partition) can be refused.
//! - **Heartbeat.** While you hold a lock, it is extended every third of its ttl, so the ttl
//!   is how fast a crashed holder's lock frees up, not a limit on your work.
//! - **Loss.** If the lock is lost anyway (the backend unreachable past the lease, the hold
//!   cap reached), the holder is told at once, and work run under the lock is cancelled by
//!   default.
//!
//! # Quick start
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> syncguard::Result<()> {
//! use std::time::Duration;
//! use syncguard::{LockOptions, MemoryBackend, RetryPolicy};
//!
//! let backend = MemoryBackend::new(); // or PostgresBackend, RedisBackend, FirestoreBackend
//! let options = LockOptions::builder()
//!     .ttl(Duration::from_secs(10))
//!     .retry(RetryPolicy::wait_for(Duration::from_secs(5)))
//!     .build()?;
//! let total = syncguard::with_lock(&backend, "invoice:42", &options, async |guard| {
//!     // Exclusive across every process sharing the backend; hand the fence to the store.
//!     let _fence = guard.fence();
//!     Ok::<_, syncguard::LockError>(42)
//! })
//! .await?;
//! assert_eq!(total, 42);
//! # Ok(()) }
//! ```
//!
//! # Entry points
//! | to | use |
//! |---|---|
//! | run work under a lock | [`with_lock`] |
//! | hold a lock across code of your own | [`acquire`] (waits as the options say), [`try_acquire`] (one attempt, `None` when held), then [`LockGuard`] |
//! | lock an `async fn` | `#[locked(key = "job:{id}")]` (feature `macros`, on by default) |
//! | lock requests of an axum or tonic service | the `syncguard-tower` crate's `LockLayer` |
//! | build an integration that owns the guard in its own future | [`acquire_with_polled_heartbeat`], [`LockGuard::poll_heartbeat`], [`LockGuard::spawn_heartbeat`], [`LockHandle`] |
//! | run a background task on one replica at a time, elect a leader, see who leads | [`leader`]: [`leader::Election`] |
//! | see who holds a lock | [`get_by_key`], [`get_by_id`], [`owns`] |
//! | find the errors and log lines about a key (they name it by its hash) | [`key_hash`] |
//! | release everything on shutdown | [`shutdown`] |
//!
//! [`LockOptions`] is the policy (ttl, waiting, heartbeat, hold cap, what a loss does), apart
//! from the key: one options value serves every key. Errors are one type, [`LockError`]; the
//! ones about one lock name it by its key hash ([`LockName`], [`key_hash`]), and by its key too when the
//! options [show it](LockOptionsBuilder::show_key).
//!
//! # Backends
//! | backend | feature | made with |
//! |---|---|---|
//! | in-process memory | `memory` (default) | `MemoryBackend::new()` |
//! | PostgreSQL (sqlx) | `postgres`, `postgres-tls` | `PostgresBackend::connect(url)`, `::connect_with(url, config)`, `::new(pool, config)` |
//! | Redis (redis-rs, deadpool-redis) | `redis`, `redis-tls` | `RedisBackend::connect(url)`, `::connect_with(url, config)`, `::new(connection, config)` |
//! | Firestore | `firestore` | `FirestoreBackend::connect(project_id)`, `::connect_with(project_id, config)`, `::new(db, config)` |
//!
//! The network backends are made the same way: `connect` with the defaults,
//! `connect_with` with a `*Config` that holds every other setting (timeouts under the same
//! names on each: `with_connect_timeout`, `with_operation_timeout`), or `new` on a client of
//! yours. Each backend module re-exports the driver crate its API takes
//! (`syncguard::postgres::sqlx`, `syncguard::redis::{redis, deadpool_redis}`,
//! `syncguard::firestore::firestore`).
//!
//! Each backend's module (`syncguard::postgres`, `syncguard::redis`, `syncguard::firestore`)
//! documents its storage layout, which is that of the SyncGuard reference design, so Rust and
//! TypeScript services can share locks. Writing a backend of your own: the [`backend`] module
//! and the conformance suite (feature `conformance`). Telemetry decorators (a callback,
//! OpenTelemetry) are in [`telemetry`]; every hold also has a `tracing` span,
//! `syncguard.hold`.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
pub mod backend;
mod default_backend;
mod error;
mod far_future;
mod fence;
#[cfg(feature = "firestore")]
pub mod firestore;
mod guard;
mod inspect;
pub mod leader;
mod lock_id;
mod lock_name;
pub mod macro_support;
#[cfg(feature = "memory")]
mod memory;
mod options;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
mod retry;
pub mod telemetry;
#[cfg(any(feature = "postgres", feature = "redis", feature = "firestore"))]
mod timeouts;
#[cfg(any(feature = "postgres-tls", feature = "redis-tls"))]
mod tls;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod url_scheme;
mod with_lock;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use acquire::{acquire, acquire_with_polled_heartbeat, try_acquire};
pub use backend::{LockBackend, LockInfo, RevealedLockInfo};
pub use default_backend::{default_backend, set_default_backend};
pub use error::{BoxError, ErrorCode, LockError, LostReason, Result};
pub use fence::Fence;
pub use guard::shutdown::{ShutdownReport, shutdown};
pub use guard::{LockGuard, LockHandle};
pub use inspect::{get_by_id, get_by_key, owns};
pub use lock_id::LockId;
pub use lock_name::{LockName, key_hash};
pub use options::{LockOptions, LockOptionsBuilder, OnLost};
pub use retry::{Backoff, Jitter, RetryPolicy};
pub use with_lock::with_lock;

#[cfg(feature = "firestore")]
pub use firestore::FirestoreBackend;
#[cfg(feature = "memory")]
pub use memory::MemoryBackend;
#[cfg(feature = "postgres")]
pub use postgres::PostgresBackend;
#[cfg(feature = "redis")]
pub use redis::RedisBackend;

#[cfg(feature = "macros")]
pub use syncguard_macros::locked;
