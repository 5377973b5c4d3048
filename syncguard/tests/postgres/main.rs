//! The PostgreSQL backend against a real PostgreSQL server, one concern per module: the
//! conformance suite ([`conformance`]), `setup_schema` and upgrades of older tables
//! ([`schema`]), connecting and the errors of real failures ([`connection`]), the storage
//! layout and its compatibility with the reference ([`reference`]), locks with a holder
//! ([`holders`]), the plain statement for free keys ([`plain_acquire`]), faults through a
//! TCP proxy of the tests' own ([`faults`]), and waiters woken by release notifications
//! ([`waiting`]).
//!
//! Needs `SYNCGUARD_TEST_POSTGRES_URL` (a server these tests may create tables in);
//! `bash scripts/test-all.sh` or
//! `bash scripts/with-services.sh cargo test -p syncguard --features postgres,conformance --test postgres`
//! installs PostgreSQL if missing and sets it.

#[path = "../../benches/support/mod.rs"]
mod bench_support;
#[path = "../support/frozen.rs"]
mod frozen;
#[path = "../support/min_hold_partition.rs"]
mod min_hold_partition;
#[path = "../support/pg_reference.rs"]
mod pg_reference;
#[path = "../support/proxy.rs"]
mod proxy;
#[path = "../support/urls.rs"]
mod urls;

mod conformance;
mod connection;
mod faults;
mod holders;
mod plain_acquire;
mod reference;
mod schema;
mod waiting;

use std::time::Duration;

use sqlx::PgPool;
use syncguard::LockId;
use syncguard::backend::LockBackend;
use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};

pub(crate) use urls::postgres_url;

pub(crate) async fn pool(max_connections: u32) -> PgPool {
    PostgresBackend::pool_options()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&postgres_url())
        .await
        .expect("connect to the test PostgreSQL")
}

pub(crate) async fn backend_with(config: PostgresConfig) -> PostgresBackend {
    let pool = pool(70).await;
    setup_schema(&pool, &config).await.expect("setup_schema");
    PostgresBackend::new(pool, config).expect("valid config")
}

pub(crate) async fn backend() -> PostgresBackend {
    backend_with(PostgresConfig::new()).await
}

/// Takes the lock on `key`, which must be free (`why` says why it should be), and releases it.
pub(crate) async fn takes_and_releases(backend: &PostgresBackend, key: &str, why: &str) {
    let lease = backend
        .acquire(key, Duration::from_secs(30))
        .await
        .unwrap()
        .lease()
        .unwrap_or_else(|| panic!("{key}: {why}"));
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

/// A table-name suffix no other test (or run) uses.
pub(crate) fn unique(label: &str) -> String {
    format!(
        "{label}_{}",
        LockId::generate().as_str().to_lowercase().replace('-', "_")
    )
    .chars()
    .take(30)
    .collect()
}
