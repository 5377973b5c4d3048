//! Backend instances, each as one process has, and the faults the scenarios inject.

use std::sync::Arc;
use std::time::Duration;

use syncguard::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockInfo, Lookup,
    ReleaseOutcome,
};
use syncguard::conformance::FaultyBackend;
use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
use syncguard::{LockError, LockId, MemoryBackend, RedisBackend};

use crate::urls;

/// Which backend a scenario runs on; [`Kind::instance`] makes its "processes".
#[derive(Clone)]
pub(crate) enum Kind {
    /// One store for the scenario, shared by its instances.
    Memory(MemoryBackend),
    Postgres,
    Redis,
}

impl Kind {
    pub(crate) fn memory() -> Self {
        Self::Memory(MemoryBackend::new())
    }

    /// A backend instance, as one process has: memory shares the scenario's store.
    pub(crate) async fn instance(&self) -> Arc<dyn LockBackend> {
        match self {
            Self::Memory(store) => Arc::new(store.clone()),
            Self::Postgres => {
                let pool = PostgresBackend::pool_options()
                    .max_connections(4)
                    .acquire_timeout(Duration::from_secs(30))
                    .connect(&urls::postgres_url())
                    .await
                    .expect("connect to the test PostgreSQL");
                let config = PostgresConfig::new();
                setup_schema(&pool, &config).await.expect("setup_schema");
                Arc::new(PostgresBackend::new(pool, config).expect("valid config"))
            }
            Self::Redis => Arc::new(
                RedisBackend::connect(&urls::redis_url())
                    .await
                    .expect("connect to the test Redis"),
            ),
        }
    }

    /// An instance whose faults the test injects: a stalled heartbeat
    /// ([`FaultyBackend::stall_extends`]), or death ([`FaultyBackend::fail`], every call
    /// failing from then on).
    pub(crate) async fn faulty(&self) -> FaultyBackend {
        FaultyBackend::shared(self.instance().await)
    }
}

/// A backend that does not store holders (memory, hiding that it does).
#[derive(Clone)]
pub(crate) struct WithoutHolders(pub(crate) MemoryBackend);

impl LockBackend for WithoutHolders {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        self.0.acquire(key, ttl)
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        self.0.release(lock_id)
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        self.0.extend(lock_id, ttl)
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        self.0.is_locked(key)
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        self.0.lookup(query)
    }

    fn capabilities(&self) -> Capabilities {
        let mut capabilities = self.0.capabilities();
        capabilities.holders = false;
        capabilities
    }
}
