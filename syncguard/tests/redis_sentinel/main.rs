//! The Redis backend through Sentinel (`redis+sentinel://`, feature `redis-sentinel`): the
//! conformance suite on the shared Sentinel group ([`conformance`]), URLs and settings
//! ([`connection`]), and failovers of groups of the tests' own, planned and by `kill -9`,
//! followed without a restart by the connection, the release subscriber and waiting for the
//! replica ([`failover`]).
//!
//! Needs `SYNCGUARD_TEST_REDIS_SENTINEL_URL` and `SYNCGUARD_REDIS_SERVER_BIN`; `bash
//! scripts/test-all.sh` or `bash scripts/with-services.sh cargo test -p syncguard --features
//! redis-sentinel,conformance --test redis_sentinel` starts the shared group and sets both.

#[path = "../support/sentinels.rs"]
mod sentinels;
#[path = "../support/urls.rs"]
mod urls;

mod connection;
mod failover;

use std::time::Duration;

use syncguard::LockId;
use syncguard::backend::{Lease, LockBackend};
use syncguard::redis::RedisBackend;

/// A backend through the shared Sentinel group.
pub(crate) async fn backend() -> RedisBackend {
    RedisBackend::connect(&urls::redis_sentinel_url())
        .await
        .expect("connect through the Sentinels")
}

/// A key no other test (or run) uses.
pub(crate) fn unique(label: &str) -> String {
    format!("sentinel-test:{label}:{}", LockId::generate())
}

/// Acquires a key that must be free.
pub(crate) async fn acquired(backend: &RedisBackend, key: &str, ttl: Duration) -> Lease {
    match backend.acquire(key, ttl).await {
        Ok(outcome) => outcome
            .lease()
            .unwrap_or_else(|| panic!("expected to acquire {key:?}, it is contended")),
        Err(error) => panic!("expected to acquire {key:?}, got {error}"),
    }
}

mod conformance {
    syncguard::conformance_tests!(async { crate::backend().await });
}
