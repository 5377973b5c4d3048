//! The guard, the waiting helper and `with_lock` on the in-memory backend, with a
//! fault-injecting wrapper where a test needs the backend to misbehave.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use syncguard::__private::{
    AcquiredNow, acquire_driven, acquire_driven_now, detach_keeper, poll_keeper,
};
use syncguard::{
    AcquireOutcome, Backoff, BoxFuture, Capabilities, ErrorCode, ExtendOutcome, Jitter,
    LockBackend, LockError, LockGuard, LockId, LockInfo, LockOptions, Lookup, LostReason,
    MemoryBackend, NotHeldReason, ReleaseOutcome, RetryPolicy, acquire, with_lock,
};
use tokio::time::{Instant, sleep, timeout};

/// A memory backend whose extends can be made to fail, and which counts the calls it gets.
#[derive(Clone, Default)]
struct Flaky {
    inner: MemoryBackend,
    failing_extends: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl LockBackend for Flaky {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.acquire(key, ttl)
    }
    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.release(lock_id)
    }
    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.failing_extends.load(Ordering::SeqCst) {
            return Box::pin(async { Err(LockError::service_unavailable("injected outage")) });
        }
        self.inner.extend(lock_id, ttl)
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

fn quick_retry() -> RetryPolicy {
    RetryPolicy::new()
        .with_base_delay(Duration::from_millis(20))
        .with_max_retries(u32::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_gets_the_lock_when_the_holder_releases() {
    let backend = MemoryBackend::new();
    let holder = acquire(&backend, &LockOptions::new("wait:1"))
        .await
        .unwrap();
    let waiter = {
        let backend = backend.clone();
        tokio::spawn(async move {
            acquire(
                &backend,
                &LockOptions::new("wait:1").with_retry(quick_retry()),
            )
            .await
        })
    };
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "must wait while the lock is held");
    let first_fence = holder.fence();
    assert!(holder.release().await.unwrap());
    let second = waiter.await.unwrap().unwrap();
    assert!(second.fence() > first_fence);
    assert!(second.release().await.unwrap());
}

#[tokio::test]
async fn waiting_gives_up_at_the_timeout() {
    let backend = MemoryBackend::new();
    let _holder = acquire(&backend, &LockOptions::new("wait:2"))
        .await
        .unwrap();
    let started = Instant::now();
    let options = LockOptions::new("wait:2")
        .with_retry(quick_retry().with_timeout(Duration::from_millis(500)));
    let error = acquire(&backend, &options).await.unwrap_err();
    let waited = started.elapsed();
    assert!(error.is_contended(), "{error}");
    assert!(error.is_retryable());
    assert!(waited >= Duration::from_millis(450), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    let LockError::AcquisitionTimeout { attempts, .. } = error else {
        unreachable!()
    };
    assert!(attempts > 2, "{attempts}");
}

#[tokio::test]
async fn retries_are_counted_and_single_attempt_fails_at_once() {
    let backend = Flaky::default();
    let _holder = acquire(&backend, &LockOptions::new("wait:3"))
        .await
        .unwrap();
    let counted = LockOptions::new("wait:3").with_retry(
        RetryPolicy::new()
            .with_max_retries(3)
            .with_backoff(Backoff::Fixed)
            .with_jitter(Jitter::None)
            .with_base_delay(Duration::from_millis(10))
            .with_timeout(Duration::from_secs(30)),
    );
    let before = backend.calls.load(Ordering::SeqCst);
    let error = acquire(&backend, &counted).await.unwrap_err();
    assert!(matches!(
        error,
        LockError::AcquisitionTimeout { attempts: 4, .. }
    ));
    assert_eq!(backend.calls.load(Ordering::SeqCst) - before, 4);

    let once = LockOptions::new("wait:3").with_retry(RetryPolicy::single_attempt());
    let error = acquire(&backend, &once).await.unwrap_err();
    assert!(matches!(
        error,
        LockError::AcquisitionTimeout { attempts: 1, .. }
    ));
}

#[tokio::test]
async fn bad_options_fail_before_any_backend_call() {
    let backend = Flaky::default();
    for options in [
        LockOptions::new(""),
        LockOptions::new("x".repeat(513)),
        LockOptions::new("ok").with_ttl(Duration::ZERO),
        LockOptions::new("ok").with_ttl(Duration::from_secs(400 * 24 * 3600)),
    ] {
        let error = acquire(&backend, &options).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{options:?}");
    }
    assert_eq!(backend.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_rides_out_a_short_outage() {
    let backend = Flaky::default();
    let options = LockOptions::new("hb:outage").with_ttl(Duration::from_millis(1500));
    let guard = acquire(&backend, &options).await.unwrap();
    backend.failing_extends.store(true, Ordering::SeqCst);
    sleep(Duration::from_millis(700)).await; // a failed extend at ~500 ms, retries after
    backend.failing_extends.store(false, Ordering::SeqCst);
    sleep(Duration::from_millis(3000)).await;
    assert!(!guard.is_lost(), "{:?}", guard.lost_reason());
    assert!(
        guard.release().await.unwrap(),
        "still held after the outage"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_reports_loss_when_the_outage_outlasts_the_lease() {
    let backend = Flaky::default();
    let options = LockOptions::new("hb:down").with_ttl(Duration::from_millis(600));
    let guard = acquire(&backend, &options).await.unwrap();
    backend.failing_extends.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let reason = timeout(Duration::from_secs(10), guard.lost())
        .await
        .unwrap();
    assert_eq!(reason, LostReason::LeaseExpired);
    // Declared lost no later than the lease's end (plus scheduling slack), never after.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let calls_when_lost = backend.calls.load(Ordering::SeqCst);
    sleep(Duration::from_millis(300)).await;
    assert_eq!(
        backend.calls.load(Ordering::SeqCst),
        calls_when_lost,
        "the heartbeat stops once the lock is lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_stops_the_heartbeat() {
    let backend = MemoryBackend::new();
    let options = LockOptions::new("hb:cap")
        .with_ttl(Duration::from_millis(300))
        .with_max_hold(Duration::from_millis(1200));
    let started = Instant::now();
    let guard = acquire(&backend, &options).await.unwrap();
    let reason = timeout(Duration::from_secs(10), guard.lost())
        .await
        .unwrap();
    let held = started.elapsed();
    assert_eq!(reason, LostReason::MaxHoldReached);
    assert!(held >= Duration::from_millis(1000), "{held:?}");
    assert!(held < Duration::from_secs(4), "{held:?}");
    // The heartbeat stopped: once the tolerance passes, the key is free.
    sleep(Duration::from_millis(1500)).await;
    assert!(
        !syncguard::LockBackend::is_locked(&backend, "hb:cap")
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_extend_without_heartbeat_moves_the_deadline() {
    let backend = MemoryBackend::new();
    let options = LockOptions::new("hb:manual")
        .with_ttl(Duration::from_millis(300))
        .with_heartbeat(false);
    let guard = acquire(&backend, &options).await.unwrap();
    let first = guard.expires_at_ms();
    assert!(guard.extend(Duration::from_secs(3)).await.unwrap());
    assert!(guard.expires_at_ms() >= first + 2000);
    sleep(Duration::from_millis(1200)).await;
    assert!(!guard.is_lost(), "the manual extend must move the deadline");
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_guard_releases_in_the_background() {
    let backend = MemoryBackend::new();
    let guard = acquire(&backend, &LockOptions::new("drop:1"))
        .await
        .unwrap();
    drop(guard);
    let deadline = Instant::now() + Duration::from_secs(5);
    while syncguard::LockBackend::is_locked(&backend, "drop:1")
        .await
        .unwrap()
    {
        assert!(Instant::now() < deadline, "not released after drop");
        sleep(Duration::from_millis(10)).await;
    }
}

#[derive(Debug)]
enum JobError {
    Lock(LockError),
    Failed(&'static str),
}

impl From<LockError> for JobError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

#[tokio::test]
async fn with_lock_converts_errors_and_releases_on_every_path() {
    let backend = MemoryBackend::new();
    let options = LockOptions::new("job:errors").with_retry(RetryPolicy::single_attempt());

    let value = with_lock(&backend, &options, async |guard| {
        Ok::<_, JobError>(guard.fence().get())
    })
    .await
    .unwrap();
    assert_eq!(value, 1);

    let failed = with_lock(&backend, &options, async |_| {
        Err::<(), _>(JobError::Failed("boom"))
    })
    .await;
    assert!(matches!(failed, Err(JobError::Failed("boom"))));

    let _holder = syncguard::acquire(&backend, &options).await.unwrap();
    let busy = with_lock(&backend, &options, async |_| Ok::<_, JobError>(())).await;
    assert!(
        matches!(busy, Err(JobError::Lock(ref e)) if e.is_contended()),
        "{busy:?}"
    );
}

/// Runs the keeper of a driven guard for `duration`, as an owner future does while its work
/// is pending; the loss, if the lock was lost.
async fn drive(guard: &mut LockGuard, duration: Duration) -> Option<LostReason> {
    let work = sleep(duration);
    tokio::pin!(work);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(reason) = poll_keeper(guard, cx) {
            return Poll::Ready(Some(reason));
        }
        work.as_mut().poll(cx).map(|()| None)
    })
    .await
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test]
async fn a_driven_guard_heartbeats_in_its_owners_task() {
    let backend = MemoryBackend::new();
    let options = LockOptions::new("(the key comes apart)").with_ttl(Duration::from_millis(300));
    let tasks = alive_tasks();
    let mut guard = acquire_driven(Arc::new(backend.clone()), "driven:1".to_owned(), &options)
        .await
        .unwrap();
    // Well past the lease and the 1 s tolerance: only extends keep the key held.
    assert_eq!(drive(&mut guard, Duration::from_millis(1600)).await, None);
    assert_eq!(alive_tasks(), tasks, "no keeper task");
    assert!(backend.is_locked("driven:1").await.unwrap());
    assert!(guard.release().await.unwrap());
    assert_eq!(alive_tasks(), tasks, "no release task");
}

#[tokio::test]
async fn a_driven_guard_reports_its_loss() {
    let backend = Flaky::default();
    let options = LockOptions::new("(the key comes apart)").with_ttl(Duration::from_millis(600));
    let mut guard = acquire_driven(Arc::new(backend.clone()), "driven:2".to_owned(), &options)
        .await
        .unwrap();
    backend.failing_extends.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let lost = drive(&mut guard, Duration::from_secs(10)).await;
    assert_eq!(lost, Some(LostReason::LeaseExpired));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(guard.is_lost());
    assert!(guard.lost_token().is_cancelled());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_keeper_keeps_the_lock_with_nobody_polling() {
    let backend = MemoryBackend::new();
    let options = LockOptions::new("(the key comes apart)").with_ttl(Duration::from_millis(300));
    let tasks = alive_tasks();
    let mut guard = acquire_driven(Arc::new(backend.clone()), "driven:3".to_owned(), &options)
        .await
        .unwrap();
    // Driven for a while (its timer armed), then handed over to a task.
    assert_eq!(drive(&mut guard, Duration::from_millis(150)).await, None);
    detach_keeper(&mut guard);
    assert_eq!(alive_tasks(), tasks + 1);
    sleep(Duration::from_millis(1600)).await;
    assert!(!guard.is_lost(), "{:?}", guard.lost_reason());
    assert!(backend.is_locked("driven:3").await.unwrap());
    assert!(guard.release().await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive_tasks() > tasks {
        assert!(
            Instant::now() < deadline,
            "the keeper task outlived its guard"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_token_asked_for_after_the_loss_is_already_cancelled() {
    let backend = MemoryBackend::new();
    let options = LockOptions::new("lost:late")
        .with_ttl(Duration::from_millis(200))
        .with_heartbeat(false);
    let guard = acquire(&backend, &options).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !guard.is_lost() {
        assert!(Instant::now() < deadline, "the lease never ran out");
        sleep(Duration::from_millis(10)).await;
    }
    assert!(guard.lost_token().is_cancelled());
    let reason = timeout(Duration::from_secs(1), guard.lost()).await.unwrap();
    assert_eq!(reason, LostReason::LeaseExpired);
}

#[test]
fn guards_can_be_shared_and_sent() {
    fn shareable<T: Send + Sync>() {}
    shareable::<LockGuard>();
}

#[tokio::test]
async fn memory_answers_at_once_as_its_futures_do() {
    let backend = MemoryBackend::new();
    let ttl = Duration::from_secs(10);
    let first = backend
        .try_acquire_now("now:1", ttl)
        .unwrap()
        .unwrap()
        .lease()
        .unwrap();
    assert!(backend.acquire("now:1", ttl).await.unwrap().is_contended());
    assert!(
        backend
            .try_acquire_now("now:1", ttl)
            .unwrap()
            .unwrap()
            .is_contended()
    );
    let second = backend
        .acquire("now:2", ttl)
        .await
        .unwrap()
        .lease()
        .unwrap();
    // At most one release of a lock succeeds, whichever way each is made.
    let now = |lock_id| backend.try_release_now(lock_id).unwrap().unwrap();
    assert!(now(&second.lock_id).is_released());
    assert!(
        !backend
            .release(&second.lock_id)
            .await
            .unwrap()
            .is_released()
    );
    assert!(backend.release(&first.lock_id).await.unwrap().is_released());
    assert_eq!(
        now(&first.lock_id),
        ReleaseOutcome::NotHeld(Some(NotHeldReason::NotFound))
    );
    // One fence counter for both ways.
    let again = backend
        .try_acquire_now("now:1", ttl)
        .unwrap()
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(again.fence.get(), first.fence.get() + 1);
    // Invalid arguments fail alike, and so does everything behind an `Arc<dyn LockBackend>`.
    let shared: Arc<dyn LockBackend> = Arc::new(backend.clone());
    for (key, ttl) in [("", ttl), ("now:3", Duration::ZERO)] {
        let at_once = shared.try_acquire_now(key, ttl).unwrap().unwrap_err();
        let awaited = backend.acquire(key, ttl).await.unwrap_err();
        assert_eq!(at_once.code(), ErrorCode::InvalidArgument);
        assert_eq!(awaited.code(), ErrorCode::InvalidArgument);
    }
    assert!(
        shared
            .try_acquire_now("now:1", ttl)
            .unwrap()
            .unwrap()
            .is_contended()
    );
}

#[tokio::test]
async fn a_backend_without_answers_at_once_is_awaited() {
    let backend = Flaky::default();
    assert!(
        backend
            .try_acquire_now("later:1", Duration::from_secs(1))
            .is_none()
    );
    assert!(backend.try_release_now(&LockId::generate()).is_none());
    let guard = acquire(&backend, &LockOptions::new("later:1"))
        .await
        .unwrap();
    assert!(guard.release().await.unwrap());
    assert_eq!(
        backend.calls.load(Ordering::SeqCst),
        2,
        "acquire and release"
    );
    // Dropped: released by a task, soon.
    drop(
        acquire(&backend, &LockOptions::new("later:1"))
            .await
            .unwrap(),
    );
    timeout(Duration::from_secs(2), async {
        while backend.is_locked("later:1").await.unwrap() {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("released in the background");
}

#[tokio::test]
async fn a_dropped_guard_on_memory_is_released_during_the_drop() {
    let backend = MemoryBackend::new();
    let guard = acquire(&backend, &LockOptions::new("drop:1"))
        .await
        .unwrap();
    drop(guard);
    // Nothing else has run since the drop.
    assert!(!backend.is_locked("drop:1").await.unwrap());
}

#[tokio::test]
async fn driven_acquisition_at_once_decides_what_it_can() {
    let memory: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    let once = LockOptions::new("").with_retry(RetryPolicy::single_attempt());
    let AcquiredNow::Acquired(guard) = acquire_driven_now(&memory, "now:d".into(), &once) else {
        panic!("a free key is taken at once");
    };
    assert_eq!(guard.key(), "now:d");
    match acquire_driven_now(&memory, "now:d".into(), &once) {
        AcquiredNow::Failed(error, key) => {
            assert!(error.is_contended(), "{error}");
            assert_eq!(key, "now:d");
        }
        other => panic!("a held key without a wait fails at once: {other:?}"),
    }
    // A wait is left to the awaited acquisition, which takes the key once it is released.
    let waiting = LockOptions::new("").with_retry(quick_retry());
    let AcquiredNow::Later(key) = acquire_driven_now(&memory, "now:d".into(), &waiting) else {
        panic!("a held key with a wait is decided later");
    };
    let backend = Arc::clone(&memory);
    let later = tokio::spawn(async move { acquire_driven(backend, key, &waiting).await });
    assert!(guard.release().await.unwrap());
    let guard = later.await.unwrap().unwrap();
    assert_eq!(guard.fence().get(), 2);
    match acquire_driven_now(&memory, String::new().into(), &once) {
        AcquiredNow::Failed(error, _) => assert_eq!(error.code(), ErrorCode::InvalidArgument),
        other => panic!("an empty key fails at once: {other:?}"),
    }
    // A backend that cannot answer at once leaves it all to the awaited acquisition.
    let flaky: Arc<dyn LockBackend> = Arc::new(Flaky::default());
    assert!(matches!(
        acquire_driven_now(&flaky, "now:d".into(), &once),
        AcquiredNow::Later(key) if key == "now:d"
    ));
}
