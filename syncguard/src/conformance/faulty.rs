//! A backend decorator for tests and benchmarks: it counts the operations it passes on, and
//! fails or slows them on command, as an unreachable store or a dead process would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::sleep;

use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockInfo, LockObserver,
    Lookup, ReleaseNotifier, ReleaseOutcome,
};
use crate::error::LockError;
use crate::lock_id::LockId;

/// Wraps a backend to count what passes through it and to inject faults into it: every call
/// failing (a store out of reach, or the process gone), every call slowed down, or extends
/// (heartbeats) stalled. Clones share the switches and the counts.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// use syncguard::MemoryBackend;
/// use syncguard::backend::LockBackend;
/// use syncguard::conformance::FaultyBackend;
///
/// let backend = FaultyBackend::new(MemoryBackend::new());
/// backend.acquire("job:1", Duration::from_secs(5)).await.unwrap();
/// assert_eq!(backend.operations(), 1);
/// assert!(backend.is_locked("job:1").await.unwrap());
/// assert_eq!(backend.reads(), 1);
///
/// backend.fail(true);
/// let error = backend.acquire("job:2", Duration::from_secs(5)).await.unwrap_err();
/// assert!(error.to_string().contains("injected"));
/// # }
/// ```
#[derive(Clone)]
pub struct FaultyBackend {
    inner: Arc<dyn LockBackend>,
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    failing: AtomicBool,
    slow: AtomicBool,
    slow_acquire_replies: AtomicBool,
    extends_stalled: AtomicBool,
    /// Acquires (plain and as a holder).
    acquires: AtomicU64,
    /// Acquires, releases and extends (both kinds).
    operations: AtomicU64,
    /// Lookups and `is_locked` calls.
    reads: AtomicU64,
}

impl std::fmt::Debug for FaultyBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyBackend")
            .field("failing", &self.state.failing.load(Ordering::Relaxed))
            .field("operations", &self.operations())
            .finish_non_exhaustive()
    }
}

/// How long a call waits first while the backend is [slow](FaultyBackend::slow), and an
/// acquire's answer while [acquire replies are slow](FaultyBackend::slow_acquire_replies).
const SLOW_CALL: Duration = Duration::from_millis(700);

/// How often a stalled extend looks whether it may go on.
const STALL_CHECK: Duration = Duration::from_millis(10);

impl FaultyBackend {
    /// `inner`, with no fault switched on.
    pub fn new(inner: impl LockBackend + 'static) -> Self {
        Self::shared(Arc::new(inner))
    }

    /// [`new`](Self::new) for a backend that is already shared.
    pub fn shared(inner: Arc<dyn LockBackend>) -> Self {
        Self {
            inner,
            state: Arc::default(),
        }
    }

    /// While `failing`, every call fails with
    /// [`ErrorCode::ServiceUnavailable`](crate::ErrorCode::ServiceUnavailable) before it
    /// reaches the store (so it changes nothing).
    pub fn fail(&self, failing: bool) {
        self.state.failing.store(failing, Ordering::SeqCst);
    }

    /// While `slow`, every call waits 700 ms before it goes on.
    pub fn slow(&self, slow: bool) {
        self.state.slow.store(slow, Ordering::SeqCst);
    }

    /// While `slow`, acquires (plain and as a holder) reach the store at once and their answers
    /// come 700 ms later, as behind a network that holds up replies: a caller that gives up
    /// meanwhile leaves the lock taken.
    pub fn slow_acquire_replies(&self, slow: bool) {
        self.state
            .slow_acquire_replies
            .store(slow, Ordering::SeqCst);
    }

    /// While `stalled`, extends (the heartbeat's among them) hang before they reach the store,
    /// as they would behind a stalled network; they go on once it is switched off.
    pub fn stall_extends(&self, stalled: bool) {
        self.state.extends_stalled.store(stalled, Ordering::SeqCst);
    }

    /// Acquires (plain and as a holder) passed on to the wrapped backend so far, whatever
    /// they answered.
    pub fn acquires(&self) -> u64 {
        self.state.acquires.load(Ordering::Relaxed)
    }

    /// Acquires, releases and extends passed on to the wrapped backend so far, whatever they
    /// answered.
    pub fn operations(&self) -> u64 {
        self.state.operations.load(Ordering::Relaxed)
    }

    /// Lookups and `is_locked` calls passed on to the wrapped backend so far: what a caller
    /// read besides taking and keeping locks.
    pub fn reads(&self) -> u64 {
        self.state.reads.load(Ordering::Relaxed)
    }

    /// The faults that apply to every call.
    async fn gate(&self) -> Result<(), LockError> {
        if self.state.slow.load(Ordering::SeqCst) {
            sleep(SLOW_CALL).await;
        }
        if self.state.failing.load(Ordering::SeqCst) {
            Err(LockError::service_unavailable(
                "the store cannot be reached (a fault injected by FaultyBackend)",
            ))
        } else {
            Ok(())
        }
    }

    async fn extend_gate(&self) -> Result<(), LockError> {
        while self.state.extends_stalled.load(Ordering::SeqCst) {
            sleep(STALL_CHECK).await;
        }
        self.gate().await
    }

    /// An acquire's answer, held up while acquire replies are slow.
    async fn acquire_reply(
        &self,
        outcome: Result<AcquireOutcome, LockError>,
    ) -> Result<AcquireOutcome, LockError> {
        if self.state.slow_acquire_replies.load(Ordering::SeqCst) {
            sleep(SLOW_CALL).await;
        }
        outcome
    }

    fn count(&self, acquire: bool) {
        if acquire {
            self.state.acquires.fetch_add(1, Ordering::Relaxed);
        }
        self.state.operations.fetch_add(1, Ordering::Relaxed);
    }
}

impl LockBackend for FaultyBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(async move {
            self.gate().await?;
            self.count(true);
            let outcome = self.inner.acquire(key, ttl).await;
            self.acquire_reply(outcome).await
        })
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        Box::pin(async move {
            self.gate().await?;
            self.count(false);
            self.inner.release(lock_id).await
        })
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(async move {
            self.extend_gate().await?;
            self.count(false);
            self.inner.extend(lock_id, ttl).await
        })
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            self.gate().await?;
            self.state.reads.fetch_add(1, Ordering::Relaxed);
            self.inner.is_locked(key).await
        })
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(async move {
            self.gate().await?;
            self.state.reads.fetch_add(1, Ordering::Relaxed);
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
            self.gate().await?;
            self.count(true);
            let outcome = self.inner.acquire_as(key, ttl, holder).await;
            self.acquire_reply(outcome).await
        })
    }

    fn extend_by<'a>(
        &'a self,
        lock_id: &'a LockId,
        by: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(async move {
            self.extend_gate().await?;
            self.count(false);
            self.inner.extend_by(lock_id, by).await
        })
    }

    fn expire_at<'a>(
        &'a self,
        lock_id: &'a LockId,
        expires_at_ms: u64,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(async move {
            self.extend_gate().await?;
            self.count(false);
            self.inner.expire_at(lock_id, expires_at_ms).await
        })
    }

    fn observer(&self) -> Option<Arc<dyn LockObserver>> {
        self.inner.observer()
    }

    fn release_notifier(&self) -> Option<ReleaseNotifier> {
        self.inner.release_notifier()
    }
}
