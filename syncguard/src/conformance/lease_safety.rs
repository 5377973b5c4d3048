//! Lease safety: a guard never believes it holds a lock that someone else can take, whatever
//! the durations it is given, the order its extends are answered in, or how long its thread
//! is blocked.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};

use super::support::{acquired, assert_code, assert_contended, unique_key};
use crate::backend::time::TIME_TOLERANCE_MS;
use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockInfo, Lookup,
    ReleaseOutcome,
};
use crate::error::{ErrorCode, LockError, LostReason};
use crate::lock_id::LockId;
use crate::options::LockOptions;
use crate::retry::RetryPolicy;

/// Durations that would overflow `Instant` arithmetic are refused before any I/O (a ttl) or
/// saturate (a hold cap, retry delays and timeouts): a guard with `max_hold = Duration::MAX`
/// keeps its lock through several ttls and releases it.
pub async fn huge_durations_never_overflow<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("huge-durations");
    for ttl in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
        let refused = LockOptions::builder().ttl(ttl).build();
        assert_code(
            refused,
            ErrorCode::InvalidArgument,
            "options with a ttl beyond a year",
        );
        let refused = backend.acquire(&key, ttl).await;
        assert_code(refused, ErrorCode::InvalidArgument, "a ttl beyond a year");
        assert!(!backend.is_locked(&key).await.unwrap(), "nothing stored");
    }

    let ttl = Duration::from_millis(900);
    let patient = RetryPolicy::new()
        .with_base_delay(Duration::MAX)
        .with_max_retries(u32::MAX)
        .with_timeout(Duration::MAX);
    let options = LockOptions::builder()
        .ttl(ttl)
        .max_hold(Duration::MAX)
        .retry(patient)
        .build()
        .unwrap();
    let guard = crate::acquire(&backend, &key, &options).await.unwrap();
    let fence = guard.fence();
    let extended = guard.extend(Duration::MAX).await;
    assert_code(
        extended,
        ErrorCode::InvalidArgument,
        "an extend beyond a year",
    );

    let end = Instant::now() + ttl * 3;
    while Instant::now() < end {
        assert!(!guard.is_lost(), "lost: {:?}", guard.lost_reason());
        assert_contended(&backend, &key).await;
        sleep(Duration::from_millis(100)).await;
    }
    assert!(
        guard.release().await.unwrap(),
        "kept through 3 ttls, then released"
    );

    // Huge hold caps short of `Duration::MAX`, and a retry policy that waits "forever" for a
    // free key, take the lock at once.
    let options = options
        .to_builder()
        .max_hold(Duration::from_secs(u64::MAX / 3))
        .build()
        .unwrap();
    let again = timeout(
        Duration::from_secs(10),
        crate::acquire(&backend, &key, &options),
    )
    .await
    .expect("a free key is taken at once")
    .unwrap();
    assert!(again.fence() > fence);
    assert!(!again.is_lost());
    assert!(again.release().await.unwrap());
}

/// A backend whose answers to the heartbeat's extends (those for `long_ttl`) are slow once,
/// then fail: a manual extend for a short ttl sent meanwhile must not let the guard keep the
/// long expiry while the backend has the short one.
#[derive(Clone)]
struct SlowThenFailingHeartbeat<B> {
    inner: B,
    long_ttl: Duration,
    answer_after: Duration,
    long_extends: Arc<AtomicUsize>,
}

impl<B: LockBackend> LockBackend for SlowThenFailingHeartbeat<B> {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        self.inner.acquire(key, ttl)
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        self.inner.release(lock_id)
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        if ttl != self.long_ttl {
            return self.inner.extend(lock_id, ttl);
        }
        Box::pin(async move {
            if self.long_extends.fetch_add(1, Ordering::SeqCst) > 0 {
                return Err(LockError::service_unavailable("injected outage"));
            }
            // Applied at once, answered late.
            let outcome = self.inner.extend(lock_id, ttl).await;
            sleep(self.answer_after).await;
            outcome
        })
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

/// A manual `extend` sent while the heartbeat's extend is in flight waits for it, so the
/// guard accounts for the extends in the order the backend applied them: whenever another
/// client manages to take the key, the guard already reports the loss.
pub async fn a_manual_extend_waits_for_the_heartbeats<B: LockBackend + Clone + 'static>(
    backend: B,
) {
    let key = unique_key("extend-order");
    let ttl = Duration::from_secs(3);
    let slow = SlowThenFailingHeartbeat {
        inner: backend.clone(),
        long_ttl: ttl,
        answer_after: Duration::from_millis(1500),
        long_extends: Arc::new(AtomicUsize::new(0)),
    };
    let options = LockOptions::builder().ttl(ttl).build().unwrap();
    let guard = crate::acquire(&slow, &key, &options).await.unwrap();
    // The heartbeat extends after a third of the ttl; wait until its extend is in flight.
    let in_flight = Instant::now() + Duration::from_secs(10);
    while slow.long_extends.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < in_flight, "the heartbeat never extended");
        sleep(Duration::from_millis(10)).await;
    }
    let short = Duration::from_millis(200);
    let extended = guard.extend(short).await;
    assert!(
        matches!(extended, Ok(true) | Ok(false)),
        "the manual extend: {extended:?}"
    );

    // From here the heartbeat fails: the lock runs out on the backend. Whenever another client
    // can take it, the guard must already say it lost it.
    let give_up = Instant::now() + ttl * 3;
    let thief = loop {
        let outcome = backend
            .acquire(&key, Duration::from_secs(30))
            .await
            .unwrap();
        if let Some(lease) = outcome.lease() {
            break lease;
        }
        assert!(Instant::now() < give_up, "the short extend never ran out");
        sleep(Duration::from_millis(25)).await;
    };
    assert!(
        guard.is_lost(),
        "another client holds the lock, yet the guard believes it holds it too"
    );
    assert!(backend.release(&thief.lock_id).await.unwrap().is_released());
    drop(guard);
}

/// Runs `check` on a runtime of its own with a single thread, so that blocking that thread
/// stalls the guard's heartbeat too, as a blocked thread does in a current-thread runtime.
async fn on_one_thread<F>(check: F)
where
    F: AsyncFnOnce() + Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime")
            .block_on(check());
    })
    .await
    .expect("the stalled check panicked");
}

/// How long a holder's thread stays blocked past a lease of `ttl`: past the expiry, its
/// tolerance, and a margin for a loaded machine.
fn past_the_lease(ttl: Duration) -> Duration {
    ttl + Duration::from_millis(TIME_TOLERANCE_MS + 700)
}

/// A holder whose thread (and with it the heartbeat) was blocked past its lease reports the
/// loss as soon as it asks, by poll, reason, token and await, while another client holds the
/// lock.
pub async fn a_stalled_holder_learns_of_its_loss<B: LockBackend + Clone + 'static>(backend: B) {
    on_one_thread(async move || {
        let key = unique_key("stall");
        let ttl = Duration::from_millis(500);
        let options = LockOptions::builder().ttl(ttl).build().unwrap();
        let guard = crate::acquire(&backend, &key, &options).await.unwrap();
        std::thread::sleep(past_the_lease(ttl));
        let thief = acquired(&backend, &key, Duration::from_secs(30)).await;
        assert!(guard.is_lost(), "another client holds the lock");
        assert_eq!(guard.lost_reason(), Some(LostReason::LeaseExpired));
        assert!(guard.lost_token().is_cancelled());
        let reason = timeout(Duration::ZERO, guard.lost()).await;
        assert_eq!(
            reason,
            Ok(LostReason::LeaseExpired),
            "lost() answers at once"
        );
        assert!(
            !guard.release().await.unwrap(),
            "nothing of ours to release"
        );
        assert!(backend.release(&thief.lock_id).await.unwrap().is_released());
    })
    .await;
}

/// Work under [`with_lock`](crate::with_lock) that blocked its thread past the lease returns
/// [`ErrorCode::LockLost`](crate::ErrorCode::LockLost), not its own result: it did not run under
/// the lock throughout.
pub async fn work_that_outlived_its_lease_is_not_a_success<B: LockBackend + Clone + 'static>(
    backend: B,
) {
    on_one_thread(async move || {
        let key = unique_key("outlived");
        let ttl = Duration::from_millis(500);
        let options = LockOptions::builder().ttl(ttl).build().unwrap();
        let started = Instant::now();
        let result = crate::with_lock(&backend, &key, &options, async |_| {
            std::thread::sleep(past_the_lease(ttl));
            Ok::<_, LockError>("done")
        })
        .await;
        assert_eq!(
            result.as_ref().map_err(LockError::lost_reason).err(),
            Some(Some(LostReason::LeaseExpired)),
            "{result:?}"
        );
        // Reported at once, not after a release that waits on the backend.
        assert!(started.elapsed() < past_the_lease(ttl) + Duration::from_secs(5));
        // The lock is free for the next holder (its own lease ran out, or it was released).
        let patient = options
            .to_builder()
            .retry(RetryPolicy::new().with_timeout(Duration::from_secs(10)))
            .build()
            .unwrap();
        let next = crate::acquire(&backend, &key, &patient).await.unwrap();
        assert!(next.release().await.unwrap());
    })
    .await;
}
