//! The Redis backend against a real redis-server, one concern per module: the conformance
//! suite in both connection modes and in the cluster layout ([`conformance`]), the cluster
//! layout's keys ([`cluster_layout`]), the storage layout byte for byte and its
//! compatibility with the reference ([`layout`]), expired lock data ([`expiry`]), batched
//! script calls ([`batching`]), the batch as a Redis function ([`functions`]), acquires whose caller gave up ([`orphans`]), connection
//! failures and recovery in both modes ([`connection`]), prefixes, reserved keys and bad
//! stored data ([`input`]), and waiters woken by published releases, with their fallbacks
//! ([`waiting`]), and acquires that wait for a replica ([`replicas`]).
//!
//! Needs `SYNCGUARD_TEST_REDIS_URL` (a server these tests may write to) and
//! `SYNCGUARD_REDIS_SERVER_BIN` (to start private servers); `bash scripts/test-all.sh` or
//! `bash scripts/with-services.sh cargo test -p syncguard --features redis,conformance --test redis`
//! installs redis-server if missing and sets both.

#[path = "../support/frozen.rs"]
mod frozen;
#[path = "../support/servers.rs"]
mod servers;
#[path = "../support/urls.rs"]
mod urls;
#[path = "../support/waiters.rs"]
mod waiters;

mod batching;
mod cluster_layout;
mod conformance;
mod connection;
mod expiry;
mod functions;
mod holders;
mod input;
mod layout;
mod orphans;
mod replicas;
mod waiting;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use syncguard::LockId;
use syncguard::backend::{Lease, LockBackend};
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig, RedisLayout};

pub(crate) use urls::redis_url;

/// The default backend: one multiplexed connection.
pub(crate) async fn manager_backend() -> RedisBackend {
    RedisBackend::connect(&redis_url())
        .await
        .expect("connect (multiplexed)")
}

/// A backend on a deadpool-redis pool.
pub(crate) async fn pool_backend() -> RedisBackend {
    RedisBackend::connect_with(
        &redis_url(),
        RedisConfig::new().with_connection_mode(ConnectionMode::Pool { max_size: 16 }),
    )
    .await
    .expect("connect (pool)")
}

/// A backend in the cluster layout on one server (one multiplexed connection).
pub(crate) async fn cluster_layout_backend() -> RedisBackend {
    RedisBackend::connect_with(
        &redis_url(),
        RedisConfig::new().with_layout(RedisLayout::Cluster),
    )
    .await
    .expect("connect (cluster layout)")
}

/// One backend in each connection mode, for the checks that must hold in both.
pub(crate) async fn both_backends() -> [RedisBackend; 2] {
    [manager_backend().await, pool_backend().await]
}

/// A plain connection, to look at what the backend wrote.
pub(crate) async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("plain connection")
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

/// A key no other test (or run) uses.
/// A Lua script run with EVAL, not EVALSHA: `connection::script_flush_mid_run_is_recovered`
/// empties the script cache while other tests run, which would fail redis-rs's `Script`
/// between its load and its EVALSHA.
pub(crate) fn eval(script: &str, keys: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(keys.len()).arg(keys);
    cmd
}

pub(crate) fn unique(label: &str) -> String {
    format!("redis-test:{label}:{}", LockId::generate())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_takes_no_step_past_its_lease() {
    let key = format!("frozen:{}", LockId::generate());
    frozen::a_frozen_holder_takes_no_step_past_its_lease(manager_backend, &key).await;
}
