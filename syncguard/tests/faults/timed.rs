//! A backend wrapper that times every call, so the suite can check that each one returned
//! within the backend's configured timeouts.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use syncguard::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockError, LockId,
    LockInfo, Lookup, ReleaseOutcome,
};
use tokio::time::Instant;

/// The slowest call of each kind, and the calls over the bound.
#[derive(Default)]
pub(crate) struct CallTimes {
    worst: Mutex<BTreeMap<&'static str, Duration>>,
    calls: Mutex<usize>,
}

impl CallTimes {
    fn note(&self, what: &'static str, took: Duration) {
        let mut worst = self.worst.lock().unwrap();
        let slot = worst.entry(what).or_default();
        *slot = (*slot).max(took);
        *self.calls.lock().unwrap() += 1;
    }

    pub(crate) fn worst(&self) -> BTreeMap<&'static str, Duration> {
        self.worst.lock().unwrap().clone()
    }

    pub(crate) fn slowest(&self) -> Duration {
        self.worst().values().copied().max().unwrap_or_default()
    }

    pub(crate) fn calls(&self) -> usize {
        *self.calls.lock().unwrap()
    }
}

/// `inner`, timed into `times`.
#[derive(Clone)]
pub(crate) struct Timed {
    pub(crate) inner: Arc<dyn LockBackend>,
    pub(crate) times: Arc<CallTimes>,
}

impl Timed {
    fn time<'a, T: 'a>(
        &'a self,
        what: &'static str,
        call: impl Future<Output = T> + Send + 'a,
    ) -> BoxFuture<'a, T> {
        Box::pin(async move {
            let started = Instant::now();
            let result = call.await;
            self.times.note(what, started.elapsed());
            result
        })
    }
}

impl LockBackend for Timed {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        self.time("acquire", self.inner.acquire(key, ttl))
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        self.time("release", self.inner.release(lock_id))
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        self.time("extend", self.inner.extend(lock_id, ttl))
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        self.time("is_locked", self.inner.is_locked(key))
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        self.time("lookup", self.inner.lookup(query))
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}
