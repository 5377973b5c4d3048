//! Backend instances, each as one process has, and the faults the scenarios inject.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use syncguard::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockInfo, LockObserver,
    Lookup, ReleaseNotifier, ReleaseOutcome,
};
use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
use syncguard::{LockError, LockId, MemoryBackend, RedisBackend};
use tokio::time::sleep;

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

    /// An instance whose faults the test injects.
    pub(crate) async fn faulty(&self) -> Faulty {
        Faulty::new(self.instance().await)
    }
}

/// What a [`Faulty`] instance does wrong, switched by the test.
#[derive(Default)]
pub(crate) struct Faults {
    /// Extends hang (the heartbeat stalls) while set.
    stalled: AtomicBool,
    /// Every operation fails from then on: the process is gone.
    dead: AtomicBool,
}

/// A backend instance with faults: stalled extends, or death.
#[derive(Clone)]
pub(crate) struct Faulty {
    inner: Arc<dyn LockBackend>,
    faults: Arc<Faults>,
}

impl Faulty {
    pub(crate) fn new(inner: Arc<dyn LockBackend>) -> Self {
        Self {
            inner,
            faults: Arc::default(),
        }
    }

    pub(crate) fn stall(&self, stalled: bool) {
        self.faults.stalled.store(stalled, Ordering::SeqCst);
    }

    pub(crate) fn kill(&self) {
        self.faults.dead.store(true, Ordering::SeqCst);
    }

    pub(crate) fn alive(&self) -> Result<(), LockError> {
        if self.faults.dead.load(Ordering::SeqCst) {
            Err(LockError::service_unavailable("the process is gone"))
        } else {
            Ok(())
        }
    }
}

impl LockBackend for Faulty {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(async move {
            self.alive()?;
            self.inner.acquire(key, ttl).await
        })
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        Box::pin(async move {
            self.alive()?;
            self.inner.release(lock_id).await
        })
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(async move {
            self.alive()?;
            while self.faults.stalled.load(Ordering::SeqCst) {
                sleep(Duration::from_millis(10)).await;
            }
            self.inner.extend(lock_id, ttl).await
        })
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            self.alive()?;
            self.inner.is_locked(key).await
        })
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(async move {
            self.alive()?;
            self.inner.lookup(query).await
        })
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn acquire_as<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(async move {
            self.alive()?;
            self.inner.acquire_as(key, ttl, holder).await
        })
    }

    fn extend_by<'a>(
        &'a self,
        lock_id: &'a LockId,
        by: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(async move {
            self.alive()?;
            self.inner.extend_by(lock_id, by).await
        })
    }

    fn observer(&self) -> Option<Arc<dyn LockObserver>> {
        self.inner.observer()
    }

    fn release_notifier(&self) -> Option<ReleaseNotifier> {
        self.inner.release_notifier()
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
