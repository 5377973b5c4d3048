//! The guard and `with_lock` when the backend misbehaves in ways that leave the lease in
//! doubt: extends whose answer is lost, releases that hang, and retry policies at their
//! extremes. All on the in-memory backend behind a fault-injecting wrapper.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use syncguard::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockInfo, Lookup, ReleaseOutcome,
};
use syncguard::{
    Backoff, ErrorCode, Jitter, LockBackend, LockError, LockId, LockOptions, LostReason,
    MemoryBackend, RetryPolicy, acquire, with_lock,
};
use tokio::time::{Instant, sleep, timeout};

/// What the wrapper does with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Fault {
    #[default]
    None,
    /// Fails without reaching the store.
    Fail,
    /// Reaches the store, then the answer is lost.
    ApplyThenFail,
    /// Never answers.
    Hang,
}

/// A memory backend (through its futures only) whose extends and releases misbehave as set.
#[derive(Clone, Default)]
struct Faulty {
    inner: MemoryBackend,
    /// The fault for extends of exactly this ttl, overriding `extends`.
    extends_of: Arc<Mutex<Option<(Duration, Fault)>>>,
    extends: Arc<Mutex<Fault>>,
    releases: Arc<Mutex<Fault>>,
    acquire_calls: Arc<AtomicUsize>,
    extend_calls: Arc<AtomicUsize>,
    release_calls: Arc<AtomicUsize>,
}

impl Faulty {
    fn set_extends(&self, fault: Fault) {
        *self.extends.lock().unwrap() = fault;
    }

    fn set_extends_of(&self, ttl: Duration, fault: Fault) {
        *self.extends_of.lock().unwrap() = Some((ttl, fault));
    }

    fn set_releases(&self, fault: Fault) {
        *self.releases.lock().unwrap() = fault;
    }

    fn extend_fault(&self, ttl: Duration) -> Fault {
        match *self.extends_of.lock().unwrap() {
            Some((of, fault)) if of == ttl => fault,
            _ => *self.extends.lock().unwrap(),
        }
    }
}

/// Runs `call` as `fault` says. The call is only made where the fault lets it reach the
/// store: the memory backend does its work when called, not when awaited.
async fn with_fault<T, F>(fault: Fault, call: impl FnOnce() -> F) -> Result<T, LockError>
where
    F: Future<Output = Result<T, LockError>>,
{
    match fault {
        Fault::None => call().await,
        Fault::Fail => Err(LockError::service_unavailable("injected outage")),
        Fault::ApplyThenFail => {
            let _applied = call().await;
            Err(LockError::network_timeout("injected: the answer was lost"))
        }
        Fault::Hang => std::future::pending().await,
    }
}

impl LockBackend for Faulty {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        self.acquire_calls.fetch_add(1, Ordering::SeqCst);
        self.inner.acquire(key, ttl)
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        self.release_calls.fetch_add(1, Ordering::SeqCst);
        let fault = *self.releases.lock().unwrap();
        Box::pin(with_fault(fault, move || self.inner.release(lock_id)))
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        self.extend_calls.fetch_add(1, Ordering::SeqCst);
        let fault = self.extend_fault(ttl);
        Box::pin(with_fault(fault, move || self.inner.extend(lock_id, ttl)))
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        self.inner.is_locked(key)
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        self.inner.lookup(query)
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

fn with_ttl(ttl: Duration) -> LockOptions {
    LockOptions::builder().ttl(ttl).build().unwrap()
}

fn with_retry(retry: RetryPolicy) -> LockOptions {
    LockOptions::builder().retry(retry).build().unwrap()
}

/// Waits until another client can take `key`, and returns how long that took.
async fn until_taken_by_another(backend: &MemoryBackend, key: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let outcome = backend.acquire(key, Duration::from_secs(30)).await.unwrap();
        if let Some(lease) = outcome.lease() {
            assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "{key} was never freed");
        sleep(Duration::from_millis(20)).await;
    }
}

// Case 2: an extend whose answer was lost may have been applied, and may still be applied
// later: the guard's lease is no longer than its ttl from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_whose_answer_was_lost_shortens_the_lease_the_guard_believes() {
    let backend = Faulty::default();
    let ttl = Duration::from_secs(3);
    let short = Duration::from_millis(300);
    let guard = acquire(&backend, "lost-answer", &with_ttl(ttl))
        .await
        .unwrap();
    backend.set_extends_of(short, Fault::ApplyThenFail);
    let error = guard.extend(short).await.unwrap_err();
    assert!(error.is_retryable(), "{error}");
    // Then the heartbeat fails: only the short extend's lease is certain.
    backend.set_extends(Fault::Fail);
    let reason = timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost within the short extend's ttl, not the heartbeat's");
    assert_eq!(reason, LostReason::LeaseExpired);
    // The store did apply it: another client gets the key once it runs out (tolerance
    // included), well before the 3 s the heartbeat's last extend would have given.
    let freed = until_taken_by_another(&backend.inner, "lost-answer", Duration::from_secs(5)).await;
    assert!(freed < Duration::from_secs(3), "{freed:?}");
}

// Case 2, with the heartbeat healthy: the short extend may still land later, so the
// heartbeat keeps to its ttl, and the lock is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_lost_answer_the_heartbeat_keeps_to_the_shorter_lease() {
    let backend = Faulty::default();
    let ttl = Duration::from_secs(3);
    let short = Duration::from_millis(600);
    let guard = acquire(&backend, "lost-answer:kept", &with_ttl(ttl))
        .await
        .unwrap();
    backend.set_extends_of(short, Fault::ApplyThenFail);
    guard.extend(short).await.unwrap_err();
    let extends_before = backend.extend_calls.load(Ordering::SeqCst);
    sleep(Duration::from_secs(2)).await;
    assert!(!guard.is_lost(), "{:?}", guard.lost_reason());
    let extends = backend.extend_calls.load(Ordering::SeqCst) - extends_before;
    // Every third of 600 ms: about 10 in 2 s; neither one every 1 s (the 3 s lease's pace)
    // nor a busy loop.
    assert!((4..=40).contains(&extends), "{extends} extends in 2 s");
    assert!(guard.release().await.unwrap());
}

// Case 5: a zero base delay retries (at least a millisecond apart) until the timeout.
#[tokio::test(start_paused = true)]
async fn a_zero_base_delay_retries_until_the_timeout() {
    let backend = Faulty::default();
    let _holder = acquire(&backend, "retry:zero", &LockOptions::default())
        .await
        .unwrap();
    let policy = RetryPolicy::new()
        .with_base_delay(Duration::ZERO)
        .with_max_retries(u32::MAX)
        .with_timeout(Duration::from_millis(100));
    let started = Instant::now();
    let error = acquire(&backend, "retry:zero", &with_retry(policy))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::AcquisitionTimeout, "{error}");
    let attempts = error.attempts().unwrap();
    // One every millisecond at the most (virtual time: exact).
    assert!((50..=102).contains(&attempts), "{attempts} attempts");
    assert_eq!(started.elapsed(), Duration::from_millis(100));
}

// Case 5: a zero base delay still waits for a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_base_delay_gets_the_lock_when_it_is_released() {
    let backend = Faulty::default();
    let holder = acquire(&backend, "retry:zero:won", &LockOptions::default())
        .await
        .unwrap();
    let releaser = tokio::spawn(async move {
        sleep(Duration::from_millis(200)).await;
        holder.release().await
    });
    let policy = RetryPolicy::new()
        .with_base_delay(Duration::ZERO)
        .with_backoff(Backoff::Fixed)
        .with_max_retries(u32::MAX)
        .with_timeout(Duration::from_secs(10));
    let guard = acquire(&backend, "retry:zero:won", &with_retry(policy))
        .await
        .unwrap();
    assert!(releaser.await.unwrap().unwrap());
    assert!(guard.release().await.unwrap());
}

// Case 5: the other extremes behave as `RetryPolicy` documents.
#[tokio::test(start_paused = true)]
async fn retry_extremes_behave_as_documented() {
    let backend = Faulty::default();
    let _holder = acquire(&backend, "retry:edges", &LockOptions::default())
        .await
        .unwrap();
    // Attempts made and time waited; a single attempt must be `Contended`, a wait
    // `AcquisitionTimeout` counting the attempts the backend saw.
    let attempt = async |policy: RetryPolicy| {
        let started = Instant::now();
        let calls = backend.acquire_calls.load(Ordering::SeqCst);
        let result = acquire(&backend, "retry:edges", &with_retry(policy)).await;
        let made = backend.acquire_calls.load(Ordering::SeqCst) - calls;
        match result
            .as_ref()
            .map_err(|error| (error.code(), error.attempts()))
        {
            Err((ErrorCode::Contended, None)) => {
                assert_eq!(made, 1, "{policy:?}");
                (1, started.elapsed())
            }
            Err((ErrorCode::AcquisitionTimeout, Some(attempts))) => {
                assert!(
                    attempts >= 2,
                    "{policy:?}: a wait of one attempt is Contended"
                );
                assert_eq!(usize::try_from(attempts).unwrap(), made, "{policy:?}");
                (attempts, started.elapsed())
            }
            other => panic!("{policy:?}: {other:?}"),
        }
    };
    let fixed = RetryPolicy::new()
        .with_backoff(Backoff::Fixed)
        .with_jitter(Jitter::None);

    // No retries, however long the timeout: one attempt, at once (`Contended`).
    let once = fixed
        .with_max_retries(0)
        .with_timeout(Duration::from_secs(3600));
    assert_eq!(attempt(once).await, (1, Duration::ZERO));
    // A zero timeout, however many retries: one attempt (`Contended`).
    let no_time = fixed
        .with_max_retries(u32::MAX)
        .with_timeout(Duration::ZERO);
    assert_eq!(attempt(no_time).await, (1, Duration::ZERO));
    // A timeout shorter than one delay: the first attempt and one at the timeout.
    let short = fixed
        .with_base_delay(Duration::from_secs(10))
        .with_timeout(Duration::from_millis(250));
    assert_eq!(attempt(short).await, (2, Duration::from_millis(250)));
    // Huge delays and retries saturate; the timeout still ends the wait.
    for jitter in [Jitter::None, Jitter::Equal, Jitter::Full] {
        let huge = RetryPolicy::new()
            .with_base_delay(Duration::MAX)
            .with_max_retries(u32::MAX)
            .with_jitter(jitter)
            .with_timeout(Duration::from_millis(400));
        let (attempts, waited) = attempt(huge).await;
        assert!((2..=3).contains(&attempts), "{jitter:?}: {attempts}");
        assert_eq!(waited, Duration::from_millis(400), "{jitter:?}");
    }
    // Exponential growth from a small delay: counted attempts, the timeout not reached.
    let counted = fixed
        .with_base_delay(Duration::from_millis(10))
        .with_max_retries(3)
        .with_timeout(Duration::from_secs(3600));
    assert_eq!(attempt(counted).await, (4, Duration::from_millis(30)));
}

// Case 6: when the backend already said the lock is not held, `with_lock` returns the loss
// at once and sends no release (which here would hang forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_the_backend_disowned_is_reported_without_a_release() {
    let backend = Faulty::default();
    backend.set_releases(Fault::Hang);
    let thief = backend.inner.clone();
    let options = with_ttl(Duration::from_millis(600));
    let started = Instant::now();
    let result = timeout(
        Duration::from_secs(10),
        with_lock(&backend, "late:not-held", &options, async |guard| {
            assert!(thief.release(guard.lock_id()).await?.is_released());
            sleep(Duration::from_secs(3600)).await;
            Ok::<_, LockError>(())
        }),
    )
    .await
    .expect("with_lock must not wait on the release");
    assert_eq!(
        result.as_ref().err().and_then(LockError::lost_reason),
        Some(LostReason::NotHeld),
        "{result:?}"
    );
    // Noticed at the first heartbeat (200 ms), with a generous margin.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(backend.release_calls.load(Ordering::SeqCst), 0);
}

// Case 6: a lease that ran out (the backend unreachable) is reported at once; the release is
// left to the background, where it may hang without holding anyone up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ran_out_is_reported_without_waiting_for_the_release() {
    let backend = Faulty::default();
    backend.set_extends(Fault::Hang);
    backend.set_releases(Fault::Hang);
    let options = with_ttl(Duration::from_millis(600));
    let started = Instant::now();
    let result = timeout(
        Duration::from_secs(10),
        with_lock(&backend, "late:expired", &options, async |_| {
            sleep(Duration::from_secs(3600)).await;
            Ok::<_, LockError>(())
        }),
    )
    .await
    .expect("with_lock must not wait on the release");
    assert_eq!(
        result.as_ref().err().and_then(LockError::lost_reason),
        Some(LostReason::LeaseExpired),
        "{result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The release went to the background (the lock may still be stored).
    sleep(Duration::from_millis(200)).await;
    assert_eq!(backend.release_calls.load(Ordering::SeqCst), 1);
}

// Case 6: a successful run whose release hangs returns after a short, bounded wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_final_release_is_waited_for_briefly() {
    let backend = Faulty::default();
    backend.set_releases(Fault::Hang);
    let started = Instant::now();
    let result = with_lock(
        &backend,
        "late:release",
        &LockOptions::default(),
        async |guard| Ok::<_, LockError>(guard.fence()),
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
}
