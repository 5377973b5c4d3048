//! The guard, the waiting helper and `with_lock` on the in-memory backend, with a
//! fault-injecting wrapper where a test needs the backend to misbehave.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use syncguard::backend::key::hash_key;
use syncguard::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockInfo, Lookup, ReleaseOutcome,
};
use syncguard::{
    Backoff, ErrorCode, Jitter, LockBackend, LockError, LockGuard, LockId, LockOptions, LostReason,
    MemoryBackend, OnLost, RetryPolicy, acquire, acquire_with_polled_heartbeat, try_acquire,
    with_lock,
};
use tokio::time::{Instant, sleep, timeout};

#[path = "support/frozen.rs"]
mod frozen;

/// A memory backend whose extends can be made to fail, whose releases can be made slow (not
/// answered when first polled) or very slow (answered after 1.5 s), and which counts the calls
/// it gets.
#[derive(Clone, Default)]
struct Flaky {
    inner: MemoryBackend,
    failing_extends: Arc<AtomicBool>,
    failing_releases: Arc<AtomicBool>,
    slow_releases: Arc<AtomicBool>,
    very_slow_releases: Arc<AtomicBool>,
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
        if self.failing_releases.load(Ordering::SeqCst) {
            return Box::pin(async { Err(LockError::service_unavailable("injected outage")) });
        }
        let slow = self.slow_releases.load(Ordering::SeqCst);
        let very_slow = self.very_slow_releases.load(Ordering::SeqCst);
        if slow || very_slow {
            let delay = Duration::from_millis(if very_slow { 1500 } else { 50 });
            return Box::pin(async move {
                sleep(delay).await;
                self.inner.release(lock_id).await
            });
        }
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

fn options(
    build: impl FnOnce(syncguard::LockOptionsBuilder) -> syncguard::LockOptionsBuilder,
) -> LockOptions {
    build(LockOptions::builder())
        .build()
        .expect("valid options")
}

fn ttl(ttl: Duration) -> LockOptions {
    options(|o| o.ttl(ttl))
}

#[test]
fn options_are_validated_when_built() {
    let day = Duration::from_secs(24 * 3600);
    for bad in [
        Duration::ZERO,
        Duration::from_micros(500),
        day * 365 + Duration::from_millis(1),
        day * 400,
        Duration::MAX,
    ] {
        let error = LockOptions::builder().ttl(bad).build().unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "ttl {bad:?}");
        assert!(error.to_string().contains("ttl"), "{error}");
        // A valid base does not make a bad ttl acceptable.
        let error = LockOptions::default().to_builder().ttl(bad).build();
        assert_eq!(error.unwrap_err().code(), ErrorCode::InvalidArgument);
    }
    for good in [Duration::from_millis(1), Duration::from_secs(1), day * 365] {
        assert_eq!(ttl(good).ttl(), good);
    }

    let default = LockOptions::default();
    assert_eq!(default.ttl(), LockOptions::DEFAULT_TTL);
    assert_eq!(default.retry(), &RetryPolicy::new());
    assert!(default.heartbeat());
    assert_eq!(default.max_hold(), None);
    assert_eq!(default.on_lost(), OnLost::Cancel);
    assert!(!default.show_key());
    assert_eq!(LockOptions::builder().build().unwrap(), default);

    let custom = options(|o| {
        o.ttl(Duration::from_secs(5))
            .retry(RetryPolicy::wait_for(Duration::from_secs(2)))
            .heartbeat(false)
            .max_hold(Duration::from_secs(60))
            .on_lost(OnLost::Notify)
            .show_key(true)
    });
    assert_eq!(custom.ttl(), Duration::from_secs(5));
    assert_eq!(custom.retry().timeout(), Duration::from_secs(2));
    assert!(!custom.heartbeat());
    assert_eq!(custom.max_hold(), Some(Duration::from_secs(60)));
    assert_eq!(custom.on_lost(), OnLost::Notify);
    assert!(custom.show_key());
    // `to_builder` starts from the options, changing only what it is told.
    let changed = custom
        .to_builder()
        .ttl(Duration::from_secs(7))
        .build()
        .unwrap();
    assert_eq!(changed.ttl(), Duration::from_secs(7));
    assert_eq!(
        changed
            .to_builder()
            .ttl(Duration::from_secs(5))
            .build()
            .unwrap(),
        custom
    );
}

#[test]
fn wait_for_is_a_deadline_and_zero_is_one_attempt() {
    let policy = RetryPolicy::wait_for(Duration::from_secs(3));
    assert_eq!(policy.timeout(), Duration::from_secs(3));
    assert_eq!(policy.max_retries(), u32::MAX);
    assert_eq!(RetryPolicy::wait_for(Duration::ZERO).max_retries(), 0);
    assert_eq!(RetryPolicy::single_attempt().max_retries(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_gets_the_lock_when_the_holder_releases() {
    let backend = MemoryBackend::new();
    let holder = acquire(&backend, "wait:1", &LockOptions::default())
        .await
        .unwrap();
    let waiter = {
        let backend = backend.clone();
        tokio::spawn(async move {
            acquire(&backend, "wait:1", &options(|o| o.retry(quick_retry()))).await
        })
    };
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "must wait while the lock is held");
    let first_fence = holder.fence();
    assert!(holder.release().await.unwrap());
    let second = waiter.await.unwrap().unwrap();
    assert_eq!(second.fence().get(), first_fence.get() + 1);
    assert!(second.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_takes_a_lock_released_within_the_wait() {
    let backend = Flaky::default();
    let holder = acquire(&backend, "wait:for", &LockOptions::default())
        .await
        .unwrap();
    let fence = holder.fence();
    let released = tokio::spawn(async move {
        sleep(Duration::from_millis(400)).await;
        holder.release().await
    });
    let patient = options(|o| o.retry(RetryPolicy::wait_for(Duration::from_secs(10))));
    let started = Instant::now();
    let guard = acquire(&backend, "wait:for", &patient).await.unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(350), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert!(released.await.unwrap().unwrap());
    assert_eq!(guard.fence().get(), fence.get() + 1);
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn waiting_gives_up_at_the_timeout() {
    let backend = MemoryBackend::new();
    let _holder = acquire(&backend, "wait:2", &LockOptions::default())
        .await
        .unwrap();
    let started = Instant::now();
    let options = options(|o| o.retry(quick_retry().with_timeout(Duration::from_millis(500))));
    let error = acquire(&backend, "wait:2", &options).await.unwrap_err();
    let waited = started.elapsed();
    assert!(error.is_contended(), "{error}");
    assert!(error.is_retryable());
    assert_eq!(error.code(), ErrorCode::AcquisitionTimeout);
    assert!(waited >= Duration::from_millis(450), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    let (attempts, elapsed) = (error.attempts().unwrap(), error.waited().unwrap());
    let lock = error.lock().unwrap();
    assert!(attempts > 2, "{attempts}");
    assert!(elapsed >= Duration::from_millis(450) && elapsed <= waited);
    assert_eq!(lock.key_hash(), hash_key("wait:2"));
    assert!(
        error
            .to_string()
            .contains(&format!("after {attempts} attempts in")),
        "{error}"
    );
}

#[tokio::test]
async fn retries_are_counted_and_single_attempt_is_contended_at_once() {
    let backend = Flaky::default();
    let _holder = acquire(&backend, "wait:3", &LockOptions::default())
        .await
        .unwrap();
    let counted = options(|o| {
        o.retry(
            RetryPolicy::new()
                .with_max_retries(3)
                .with_backoff(Backoff::Fixed)
                .with_jitter(Jitter::None)
                .with_base_delay(Duration::from_millis(10))
                .with_timeout(Duration::from_secs(30)),
        )
    });
    let before = backend.calls.load(Ordering::SeqCst);
    let error = acquire(&backend, "wait:3", &counted).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::AcquisitionTimeout, "{error}");
    assert_eq!(error.attempts(), Some(4), "{error}");
    assert_eq!(backend.calls.load(Ordering::SeqCst) - before, 4);

    for once in [
        RetryPolicy::single_attempt(),
        RetryPolicy::wait_for(Duration::ZERO),
        // A zero timeout is one attempt, whatever the retries.
        quick_retry().with_timeout(Duration::ZERO),
    ] {
        let before = backend.calls.load(Ordering::SeqCst);
        let started = Instant::now();
        let error = acquire(&backend, "wait:3", &options(|o| o.retry(once)))
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::Contended, "{once:?}: {error}");
        assert!(error.is_contended() && error.is_retryable());
        assert_eq!(error.lock().unwrap().key_hash(), hash_key("wait:3"));
        assert_eq!(backend.calls.load(Ordering::SeqCst) - before, 1, "{once:?}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}

#[tokio::test]
async fn try_acquire_is_one_attempt_and_contention_is_none() {
    let backend = Flaky::default();
    let patient = options(|o| o.retry(RetryPolicy::wait_for(Duration::from_secs(60))));
    let holder = try_acquire(&backend, "try:1", &patient)
        .await
        .unwrap()
        .expect("a free key is taken");
    let stored = syncguard::get_by_key(&backend, "try:1").await.unwrap();
    let before = backend.calls.load(Ordering::SeqCst);
    let started = Instant::now();
    let second = try_acquire(&backend, "try:1", &patient).await;
    assert!(matches!(second, Ok(None)), "{second:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the policy's wait is ignored"
    );
    assert_eq!(
        backend.calls.load(Ordering::SeqCst) - before,
        1,
        "one attempt"
    );
    assert!(holder.is_held());
    assert_eq!(
        syncguard::get_by_key(&backend, "try:1").await.unwrap(),
        stored
    );
    // Bad input is still an error, with no backend call.
    let before = backend.calls.load(Ordering::SeqCst);
    let error = try_acquire(&backend, "", &patient).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument);
    assert_eq!(backend.calls.load(Ordering::SeqCst), before);

    let fence = holder.fence();
    assert!(holder.release().await.unwrap());
    let next = try_acquire(&backend, "try:1", &patient)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.fence().get(), fence.get() + 1);
    assert!(next.release().await.unwrap());
}

#[tokio::test]
async fn bad_keys_fail_before_any_backend_call() {
    let backend = Flaky::default();
    let options = LockOptions::default();
    for key in [String::new(), "x".repeat(513), "job:\0".to_owned()] {
        let error = acquire(&backend, &key, &options).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{key:?}");
        let error = try_acquire(&backend, &key, &options).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{key:?}");
        let error = with_lock(&backend, &key, &options, async |_| Ok::<_, LockError>(()))
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{key:?}");
        let error = acquire_with_polled_heartbeat(&backend, &key, &options)
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{key:?}");
    }
    assert_eq!(backend.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn errors_name_the_lock_and_show_the_key_only_when_asked() {
    let backend = MemoryBackend::new();
    let key = "user:42:export";
    let _holder = acquire(&backend, key, &LockOptions::default())
        .await
        .unwrap();
    let once = options(|o| o.retry(RetryPolicy::single_attempt()));

    let hidden = acquire(&backend, key, &once).await.unwrap_err();
    let name = hidden.lock().expect("names the lock");
    assert_eq!(name.key_hash(), hash_key(key));
    assert_eq!(name.key(), None);
    let text = hidden.to_string();
    assert!(text.contains(&hash_key(key)), "{text}");
    assert!(!text.contains(key), "{text}");

    let shown = acquire(
        &backend,
        key,
        &once.to_builder().show_key(true).build().unwrap(),
    )
    .await
    .unwrap_err();
    let name = shown.lock().expect("names the lock");
    assert_eq!(name.key(), Some(key));
    assert_eq!(name.key_hash(), hash_key(key));
    let text = shown.to_string();
    assert!(text.contains(&format!("{key:?}")), "{text}");
    assert!(text.contains(&hash_key(key)), "{text}");

    // Errors about no lock in particular name none.
    assert!(LockError::invalid_argument("x").lock().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_rides_out_a_short_outage() {
    let backend = Flaky::default();
    let guard = acquire(&backend, "hb:outage", &ttl(Duration::from_millis(1500)))
        .await
        .unwrap();
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
    let guard = acquire(&backend, "hb:down", &ttl(Duration::from_millis(600)))
        .await
        .unwrap();
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
    let options = options(|o| {
        o.ttl(Duration::from_millis(300))
            .max_hold(Duration::from_millis(1200))
    });
    let started = Instant::now();
    let guard = acquire(&backend, "hb:cap", &options).await.unwrap();
    let reason = timeout(Duration::from_secs(10), guard.lost())
        .await
        .unwrap();
    let held = started.elapsed();
    assert_eq!(reason, LostReason::MaxHoldReached);
    assert!(held >= Duration::from_millis(1000), "{held:?}");
    assert!(held < Duration::from_secs(4), "{held:?}");
    // The heartbeat stopped: once the tolerance passes, the key is free.
    sleep(Duration::from_millis(1500)).await;
    assert!(!backend.is_locked("hb:cap").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_extend_without_heartbeat_moves_the_deadline() {
    let backend = MemoryBackend::new();
    let options = options(|o| o.ttl(Duration::from_millis(300)).heartbeat(false));
    let guard = acquire(&backend, "hb:manual", &options).await.unwrap();
    let first = guard.expires_at_ms();
    assert!(guard.extend(Duration::from_secs(3)).await.unwrap());
    assert!(guard.expires_at_ms() >= first + 2000);
    sleep(Duration::from_millis(1200)).await;
    assert!(!guard.is_lost(), "the manual extend must move the deadline");
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_guard_releases_in_the_background() {
    let backend = Flaky::default();
    backend.slow_releases.store(true, Ordering::SeqCst);
    let guard = acquire(&backend, "drop:bg", &LockOptions::default())
        .await
        .unwrap();
    drop(guard);
    // The release was not answered during the drop: a task finishes it.
    assert!(backend.is_locked("drop:bg").await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.is_locked("drop:bg").await.unwrap() {
        assert!(Instant::now() < deadline, "not released after drop");
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_dropped_guard_on_memory_is_released_during_the_drop() {
    let backend = MemoryBackend::new();
    let guard = acquire(&backend, "drop:1", &LockOptions::default())
        .await
        .unwrap();
    drop(guard);
    // Nothing else has run since the drop.
    assert!(!backend.is_locked("drop:1").await.unwrap());
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
    let options = options(|o| o.retry(RetryPolicy::single_attempt()));

    let value = with_lock(&backend, "job:errors", &options, async |guard| {
        Ok::<_, JobError>(guard.fence().get())
    })
    .await
    .unwrap();
    assert_eq!(value, 1);
    assert!(!backend.is_locked("job:errors").await.unwrap());

    let failed = with_lock(&backend, "job:errors", &options, async |_| {
        Err::<(), _>(JobError::Failed("boom"))
    })
    .await;
    assert!(matches!(failed, Err(JobError::Failed("boom"))));
    assert!(!backend.is_locked("job:errors").await.unwrap());

    let _holder = acquire(&backend, "job:errors", &options).await.unwrap();
    let busy = with_lock(&backend, "job:errors", &options, async |_| {
        Ok::<_, JobError>(())
    })
    .await;
    assert!(
        matches!(&busy, Err(JobError::Lock(error)) if error.code() == ErrorCode::Contended),
        "{busy:?}"
    );
}

#[tokio::test]
async fn run_takes_on_lost_from_the_options() {
    let backend = MemoryBackend::new();
    // Cancel (the default): the work is dropped at once.
    let guard = acquire(&backend, "run:cancel", &ttl(Duration::from_millis(600)))
        .await
        .unwrap();
    assert!(
        backend
            .release(guard.lock_id())
            .await
            .unwrap()
            .is_released()
    );
    let result = timeout(
        Duration::from_secs(10),
        guard.run(sleep(Duration::from_secs(3600))),
    )
    .await
    .expect("cancelled on the loss");
    let error = result.expect_err("expected LockLost");
    assert_eq!(error.lost_reason(), Some(LostReason::NotHeld), "{error}");
    assert_eq!(error.lock().unwrap().key_hash(), hash_key("run:cancel"));
    guard.release_in_background().await;

    // Notify: the work runs to its end, and its result is still replaced by the loss.
    let notify = options(|o| o.ttl(Duration::from_millis(600)).on_lost(OnLost::Notify));
    let guard = acquire(&backend, "run:notify", &notify).await.unwrap();
    assert!(
        backend
            .release(guard.lock_id())
            .await
            .unwrap()
            .is_released()
    );
    let result = guard
        .run(async {
            let reason = guard.lost().await;
            assert!(guard.is_lost());
            reason
        })
        .await;
    assert_eq!(
        result.as_ref().err().and_then(LockError::lost_reason),
        Some(LostReason::NotHeld),
        "{result:?}"
    );
    guard.release_in_background().await;

    // Held throughout: the output, and `release_in_background` frees the key.
    let guard = acquire(&backend, "run:ok", &LockOptions::default())
        .await
        .unwrap();
    assert_eq!(guard.run(async { 7 }).await.unwrap(), 7);
    guard.release_in_background().await;
    assert!(!backend.is_locked("run:ok").await.unwrap());
}

/// The lock on `key` held on a backend whose releases take 1.5 s from now on, and the calls
/// the backend has had so far.
async fn held_with_very_slow_releases(key: &str) -> (Flaky, LockGuard, usize) {
    let backend = Flaky::default();
    let guard = acquire(&backend, key, &LockOptions::default())
        .await
        .unwrap();
    backend.very_slow_releases.store(true, Ordering::SeqCst);
    let calls = backend.calls.load(Ordering::SeqCst);
    (backend, guard, calls)
}

/// `release_in_background` makes its caller wait at most a second, then leaves the same
/// release request to the background: the backend gets one release, not a second one sent
/// when the guard is dropped.
#[tokio::test(start_paused = true)]
async fn release_in_background_waits_a_second_and_sends_one_release() {
    let (backend, guard, calls) = held_with_very_slow_releases("background:1").await;
    let started = Instant::now();
    guard.release_in_background().await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_millis(1500),
        "{waited:?}"
    );
    assert!(backend.is_locked("background:1").await.unwrap());
    sleep(Duration::from_secs(1)).await;
    assert!(!backend.is_locked("background:1").await.unwrap());
    assert_eq!(
        backend.calls.load(Ordering::SeqCst),
        calls + 1,
        "one release"
    );
}

/// A caller that stops waiting for `release_in_background` (its future dropped, as a
/// request's is when the client goes away) leaves the release to the background: the key is
/// freed by the one request already sent, not left held until its ttl runs out.
#[tokio::test(start_paused = true)]
async fn release_in_background_goes_on_when_its_caller_stops_waiting() {
    let (backend, guard, calls) = held_with_very_slow_releases("background:2").await;
    let waited = timeout(Duration::from_millis(100), guard.release_in_background()).await;
    assert!(waited.is_err(), "the caller stopped waiting");
    sleep(Duration::from_secs(2)).await;
    assert!(!backend.is_locked("background:2").await.unwrap());
    assert_eq!(
        backend.calls.load(Ordering::SeqCst),
        calls + 1,
        "one release"
    );
}

#[tokio::test]
async fn the_handle_agrees_with_its_guard() {
    let backend = MemoryBackend::new();
    let options = options(|o| o.ttl(Duration::from_secs(10)).show_key(true));
    let guard = acquire(&backend, "handle:1", &options).await.unwrap();
    let handle = guard.handle();
    assert_eq!(handle.key(), guard.key());
    assert_eq!(handle.name(), guard.name());
    assert_eq!(handle.name().key(), Some("handle:1"));
    assert_eq!(handle.lock_id(), guard.lock_id());
    assert_eq!(handle.fence(), guard.fence());
    assert_eq!(handle.ttl(), guard.ttl());
    assert_eq!(handle.expires_at_ms(), guard.expires_at_ms());
    let stored = syncguard::get_by_id(&backend, guard.lock_id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(guard.expires_at_ms(), stored.expires_at_ms);
    sleep(Duration::from_millis(30)).await;
    assert!(handle.held_for() >= Duration::from_millis(30));
    assert!(guard.held_for() >= Duration::from_millis(30));
    assert!(handle.held_for().abs_diff(guard.held_for()) < Duration::from_millis(500));
    assert!(handle.is_held() && guard.is_held());
    assert!(guard.extend(Duration::from_secs(60)).await.unwrap());
    assert_eq!(handle.expires_at_ms(), guard.expires_at_ms());
    assert!(handle.expires_at_ms() >= stored.expires_at_ms + 40_000);
    assert_eq!(handle.span().id(), guard.span().id());
    assert!(guard.release().await.unwrap());
    assert!(!handle.is_held());
    assert!(!handle.is_lost());
    assert_eq!(handle.lost_reason(), None);
    assert!(!handle.lost_token().is_cancelled());
}

/// Runs the heartbeat of a polled guard for `duration`, as an owner future does while its work
/// is pending; the loss, if the lock was lost.
async fn drive(guard: &mut LockGuard, duration: Duration) -> Option<LostReason> {
    let work = sleep(duration);
    tokio::pin!(work);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(reason) = guard.poll_heartbeat(cx) {
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
async fn a_polled_heartbeat_runs_in_its_owners_task() {
    let backend = MemoryBackend::new();
    let tasks = alive_tasks();
    let mut guard =
        acquire_with_polled_heartbeat(&backend, "polled:1", &ttl(Duration::from_millis(300)))
            .await
            .unwrap();
    // Well past the lease and the 1 s tolerance: only extends keep the key held.
    assert_eq!(drive(&mut guard, Duration::from_millis(1600)).await, None);
    assert_eq!(alive_tasks(), tasks, "no heartbeat task");
    assert!(backend.is_locked("polled:1").await.unwrap());
    assert!(guard.release().await.unwrap());
    assert_eq!(alive_tasks(), tasks, "no release task");
}

#[tokio::test]
async fn a_polled_heartbeat_reports_the_loss() {
    let backend = Flaky::default();
    let mut guard =
        acquire_with_polled_heartbeat(&backend, "polled:2", &ttl(Duration::from_millis(600)))
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
async fn a_spawned_heartbeat_keeps_the_lock_with_nobody_polling() {
    let backend = MemoryBackend::new();
    let tasks = alive_tasks();
    let mut guard =
        acquire_with_polled_heartbeat(&backend, "polled:3", &ttl(Duration::from_millis(300)))
            .await
            .unwrap();
    // Polled for a while (its timer armed), then handed over to a task.
    assert_eq!(drive(&mut guard, Duration::from_millis(150)).await, None);
    guard.spawn_heartbeat();
    assert_eq!(alive_tasks(), tasks + 1);
    // A second hand-over changes nothing.
    guard.spawn_heartbeat();
    assert_eq!(alive_tasks(), tasks + 1);
    sleep(Duration::from_millis(1600)).await;
    assert!(!guard.is_lost(), "{:?}", guard.lost_reason());
    assert!(backend.is_locked("polled:3").await.unwrap());
    assert!(guard.release().await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive_tasks() > tasks {
        assert!(
            Instant::now() < deadline,
            "the heartbeat task outlived its guard"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn acquiring_with_a_polled_heartbeat_waits_as_the_options_say() {
    let backend = MemoryBackend::new();
    let once = options(|o| o.retry(RetryPolicy::single_attempt()));
    let guard = acquire_with_polled_heartbeat(&backend, "now:p", &once)
        .await
        .unwrap();
    assert_eq!(guard.key(), "now:p");
    let error = acquire_with_polled_heartbeat(&backend, "now:p", &once)
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Contended, "{error}");
    // With a wait, it takes the key once it is released.
    let waiting = options(|o| o.retry(quick_retry()));
    let later = {
        let backend = backend.clone();
        tokio::spawn(
            async move { acquire_with_polled_heartbeat(&backend, "now:p", &waiting).await },
        )
    };
    sleep(Duration::from_millis(100)).await;
    assert!(!later.is_finished(), "waits while the key is held");
    assert!(guard.release().await.unwrap());
    let guard = later.await.unwrap().unwrap();
    assert_eq!(guard.fence().get(), 2);
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_token_asked_for_after_the_loss_is_already_cancelled() {
    let backend = MemoryBackend::new();
    let options = options(|o| o.ttl(Duration::from_millis(200)).heartbeat(false));
    let guard = acquire(&backend, "lost:late", &options).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !guard.is_lost() {
        assert!(Instant::now() < deadline, "the lease never ran out");
        sleep(Duration::from_millis(10)).await;
    }
    assert!(guard.lost_token().is_cancelled());
    let reason = timeout(Duration::from_secs(1), guard.lost()).await.unwrap();
    assert_eq!(reason, LostReason::TtlElapsed, "the heartbeat was off");
}

/// A lease that ran out says what happened and what to change: with the heartbeat off, that
/// nothing was extending it (a longer ttl, or the heartbeat on); with the heartbeat on but its
/// extends failing, that it expired before it could be extended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ran_out_says_whether_the_heartbeat_was_off() {
    let backend = Flaky::default();
    let off = options(|o| o.ttl(Duration::from_millis(300)).heartbeat(false));
    // A hold cap under the ttl caps nothing without a heartbeat: the ttl still ended it.
    let off_capped = options(|o| {
        o.ttl(Duration::from_millis(600))
            .heartbeat(false)
            .max_hold(Duration::from_millis(100))
    });
    let on = ttl(Duration::from_millis(600));
    let ttl_elapsed = "the ttl ran out with the heartbeat off, so nothing extended the lease; give a longer ttl, or turn the heartbeat on";
    let cases = [
        (off, LostReason::TtlElapsed, ttl_elapsed),
        (off_capped, LostReason::TtlElapsed, ttl_elapsed),
        (
            on,
            LostReason::LeaseExpired,
            "the lease expired before it could be extended",
        ),
    ];
    for (options, reason, says) in cases {
        // The heartbeat, where on, fails: only the ttl decides.
        backend.failing_extends.store(true, Ordering::SeqCst);
        let work = async |_: &LockGuard| {
            sleep(Duration::from_secs(3600)).await;
            Ok::<_, LockError>(())
        };
        let error = timeout(
            Duration::from_secs(10),
            with_lock(&backend, &format!("lapse:{reason:?}"), &options, work),
        )
        .await
        .expect("lost at the end of the lease")
        .unwrap_err();
        assert_eq!(error.lost_reason(), Some(reason), "{error}");
        let text = error.to_string();
        assert!(
            text.ends_with(&format!("lost while held: {says}")),
            "{text}"
        );
    }
}

#[test]
fn guards_and_handles_can_be_shared_and_sent() {
    fn shareable<T: Send + Sync>() {}
    shareable::<LockGuard>();
    shareable::<syncguard::LockHandle>();
}

#[tokio::test]
async fn a_shared_backend_is_a_backend() {
    let shared: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    let guard = acquire(&shared, "shared:1", &LockOptions::default())
        .await
        .unwrap();
    assert!(shared.is_locked("shared:1").await.unwrap());
    let once = options(|o| o.retry(RetryPolicy::single_attempt()));
    assert!(
        try_acquire(&shared, "shared:1", &once)
            .await
            .unwrap()
            .is_none()
    );
    assert!(guard.release().await.unwrap());
    assert!(!shared.is_locked("shared:1").await.unwrap());
}

/// A tracing layer that records spans (name, fields as recorded, whether closed) and events
/// (message, and the span they were in).
mod recorder {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Subscriber};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
    use tracing_subscriber::registry::LookupSpan;

    #[derive(Debug, Clone, Default)]
    pub(crate) struct SpanRecord {
        pub(crate) name: &'static str,
        pub(crate) fields: BTreeMap<&'static str, String>,
        pub(crate) closed: bool,
    }

    #[derive(Debug, Clone)]
    pub(crate) struct EventRecord {
        pub(crate) message: String,
        /// The index in `spans` of the span the event was in.
        pub(crate) span: Option<usize>,
    }

    #[derive(Default)]
    struct Log {
        spans: Vec<SpanRecord>,
        /// Open span ids (ids are reused once closed) to indexes in `spans`.
        open: BTreeMap<u64, usize>,
        events: Vec<EventRecord>,
    }

    #[derive(Clone, Default)]
    pub(crate) struct Recorder(Arc<Mutex<Log>>);

    impl Recorder {
        /// Records what happens on this thread until the returned guard is dropped.
        pub(crate) fn install() -> (Self, tracing::subscriber::DefaultGuard) {
            let recorder = Self::default();
            let subscriber = tracing_subscriber::registry().with(recorder.clone());
            (recorder, tracing::subscriber::set_default(subscriber))
        }

        pub(crate) fn spans(&self, name: &str) -> Vec<SpanRecord> {
            let log = self.0.lock().unwrap();
            log.spans
                .iter()
                .filter(|s| s.name == name)
                .cloned()
                .collect()
        }

        /// The events with this message, each with the span it was in.
        pub(crate) fn events(&self, message: &str) -> Vec<(EventRecord, Option<SpanRecord>)> {
            let log = self.0.lock().unwrap();
            log.events
                .iter()
                .filter(|e| e.message == message)
                .map(|e| (e.clone(), e.span.map(|i| log.spans[i].clone())))
                .collect()
        }
    }

    struct Fields<'a>(&'a mut BTreeMap<&'static str, String>);

    impl Visit for Fields<'_> {
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name(), value.to_owned());
        }
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.0.insert(field.name(), format!("{value:?}"));
        }
    }

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
            let mut record = SpanRecord {
                name: attrs.metadata().name(),
                ..SpanRecord::default()
            };
            attrs.record(&mut Fields(&mut record.fields));
            let mut log = self.0.lock().unwrap();
            log.spans.push(record);
            let index = log.spans.len() - 1;
            log.open.insert(id.into_u64(), index);
        }

        fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
            let mut log = self.0.lock().unwrap();
            if let Some(&index) = log.open.get(&id.into_u64()) {
                values.record(&mut Fields(&mut log.spans[index].fields));
            }
        }

        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            let mut fields = BTreeMap::new();
            event.record(&mut Fields(&mut fields));
            let span = ctx.event_span(event).map(|span| span.id().into_u64());
            let mut log = self.0.lock().unwrap();
            let span = span.and_then(|id| log.open.get(&id).copied());
            log.events.push(EventRecord {
                message: fields.remove("message").unwrap_or_default(),
                span,
            });
        }

        fn on_close(&self, id: Id, _: Context<'_, S>) {
            let mut log = self.0.lock().unwrap();
            if let Some(index) = log.open.remove(&id.into_u64()) {
                log.spans[index].closed = true;
            }
        }
    }
}

use recorder::Recorder;

const HOLD: &str = "syncguard.hold";

/// Lets the runtime drop what the ended holds left behind (their aborted heartbeat tasks hold
/// the span too), then checks that every hold span is closed.
async fn hold_spans_close(recorder: &Recorder) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while recorder.spans(HOLD).iter().any(|s| !s.closed) {
        assert!(
            Instant::now() < deadline,
            "a hold span outlived its hold: {:?}",
            recorder.spans(HOLD)
        );
        sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn with_lock_runs_the_work_in_a_hold_span_that_records_its_outcome() {
    let (recorder, _default) = Recorder::install();
    let backend = MemoryBackend::new();
    let options = ttl(Duration::from_millis(300));
    let fence = with_lock(&backend, "span:1", &options, async |guard| {
        tracing::info!("inside the work");
        assert_eq!(tracing::Span::current().id(), guard.span().id());
        // Long enough for heartbeat extends (every 100 ms).
        sleep(Duration::from_millis(450)).await;
        Ok::<_, LockError>(guard.fence())
    })
    .await
    .unwrap();

    hold_spans_close(&recorder).await;
    let spans = recorder.spans(HOLD);
    assert_eq!(spans.len(), 1, "{spans:?}");
    let hold = &spans[0];
    assert_eq!(hold.fields["key_hash"], hash_key("span:1"));
    assert_eq!(hold.fields["fence"], fence.to_string());
    assert_eq!(
        hold.fields.get("outcome").map(String::as_str),
        Some("released")
    );
    assert!(
        !hold.fields.contains_key("key"),
        "the raw key without show_key: {hold:?}"
    );

    let work = recorder.events("inside the work");
    assert_eq!(work.len(), 1);
    assert_eq!(work[0].1.as_ref().map(|s| s.name), Some(HOLD), "{work:?}");
    let beats = recorder.events("syncguard heartbeat extended the lock");
    assert!(!beats.is_empty(), "the heartbeat extended the lock");
    for (_, span) in &beats {
        let span = span.as_ref().expect("heartbeat events are in the hold");
        assert_eq!(span.name, HOLD);
        assert_eq!(span.fields["key_hash"], hash_key("span:1"));
    }
}

#[tokio::test(flavor = "current_thread")]
async fn hold_spans_show_the_key_only_when_asked_and_record_every_ending() {
    let (recorder, _default) = Recorder::install();
    let backend = MemoryBackend::new();
    let shown = options(|o| o.show_key(true).ttl(Duration::from_millis(600)));

    // Shown key; lost: the lock was released behind the holder's back.
    let thief = backend.clone();
    let lost = with_lock(&backend, "span:lost", &shown, async |guard| {
        assert!(thief.release(guard.lock_id()).await?.is_released());
        sleep(Duration::from_secs(3600)).await;
        Ok::<_, LockError>(())
    })
    .await
    .unwrap_err();
    assert!(lost.is_lock_lost(), "{lost}");

    // Dropped without a release.
    let guard = acquire(&backend, "span:dropped", &LockOptions::default())
        .await
        .unwrap();
    drop(guard);

    // Released, but the backend no longer held it.
    let guard = acquire(&backend, "span:not-held", &LockOptions::default())
        .await
        .unwrap();
    assert!(
        backend
            .release(guard.lock_id())
            .await
            .unwrap()
            .is_released()
    );
    assert!(!guard.release().await.unwrap());

    hold_spans_close(&recorder).await;
    let spans = recorder.spans(HOLD);
    let outcome_of = |key: &str| {
        let span = spans
            .iter()
            .find(|s| s.fields["key_hash"] == hash_key(key))
            .unwrap_or_else(|| panic!("no hold span for {key}: {spans:?}"));
        (
            span.fields.get("outcome").cloned(),
            span.fields.get("key").cloned(),
        )
    };
    assert_eq!(
        outcome_of("span:lost"),
        (Some("lost".into()), Some("span:lost".into()))
    );
    assert_eq!(outcome_of("span:dropped"), (Some("dropped".into()), None));
    assert_eq!(outcome_of("span:not-held"), (Some("not_held".into()), None));

    // The loss is logged in the hold, naming the lock.
    let warned = recorder.events("syncguard lock lost");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(
        warned[0].1.as_ref().map(|s| s.fields["key_hash"].clone()),
        Some(hash_key("span:lost"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_takes_no_step_past_its_lease() {
    let store = MemoryBackend::new();
    let make = move || std::future::ready(store.clone());
    frozen::a_frozen_holder_takes_no_step_past_its_lease(make, "frozen:holder").await;
}

/// A dropped guard's release that fails for a while (the backend unreachable, a pool outrun
/// by a burst of drops) is sent again while the lock may still be held, so the key frees up
/// once the backend answers, not at the end of the ttl.
#[tokio::test]
async fn a_dropped_guards_release_is_sent_again_after_a_transient_failure() {
    let backend = Flaky::default();
    let guard = acquire(&backend, "drop:retry", &ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    backend.failing_releases.store(true, Ordering::SeqCst);
    drop(guard);
    sleep(Duration::from_millis(500)).await;
    assert!(
        backend.inner.is_locked("drop:retry").await.unwrap(),
        "held while every release fails"
    );
    backend.failing_releases.store(false, Ordering::SeqCst);
    let freed = Instant::now() + Duration::from_secs(10);
    while backend.inner.is_locked("drop:retry").await.unwrap() {
        assert!(
            Instant::now() < freed,
            "still held 10 s after the backend answered again (ttl 30 s)"
        );
        sleep(Duration::from_millis(50)).await;
    }
}
