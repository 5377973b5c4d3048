// The README (with PostgreSQL and Redis examples) is the crate documentation when those
// backends are compiled in, as on docs.rs; a narrower build gets a pointer to it.
#![cfg_attr(all(feature = "postgres", feature = "redis", feature = "macros"), doc = include_str!("../../README.md"))]
#![cfg_attr(
    not(all(feature = "postgres", feature = "redis", feature = "macros")),
    doc = "Distributed locks with fencing tokens and an automatic heartbeat. See the README, or \
           build the documentation with `--all-features`."
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod error;
mod fence;
#[cfg(feature = "firestore")]
pub mod firestore;
mod guard;
pub mod key;
mod key_text;
mod lock;
mod lock_id;
#[cfg(feature = "memory")]
mod memory;
mod observe;
#[cfg(feature = "postgres")]
pub mod postgres;
mod private;
#[cfg(feature = "redis")]
pub mod redis;
mod retry;
pub mod telemetry;
pub mod time;
#[cfg(any(feature = "postgres-tls", feature = "redis-tls"))]
mod tls;

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
pub use guard::shutdown::{ShutdownReport, shutdown};
pub use lock::{
    DEFAULT_TTL, LockOptions, OnLost, acquire, default_backend, set_default_backend, with_lock,
};
pub use lock_id::{LOCK_ID_LEN, LockId};
#[cfg(feature = "memory")]
pub use memory::MemoryBackend;
pub use observe::LockObserver;
#[cfg(feature = "redis")]
pub use redis::RedisBackend;
pub use retry::{Backoff, Jitter, RetryPolicy};

#[cfg(feature = "macros")]
pub use syncguard_macros::locked;

#[doc(hidden)]
pub mod __private {
    //! Used by the code `#[locked]` generates; not public API.
    pub use crate::private::*;
}
