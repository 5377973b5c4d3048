//! Waiting for a held lock: waiters wake on release where the backend announces releases, and
//! at the holder's lease end where the refusal reports it; they take turns in arrival order;
//! a cancelled wait leaves nothing behind. A backend that announces nothing still passes by
//! polling, which each check then verifies instead.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};

use super::FaultyBackend;
use super::support::{acquired, unique_key};
use crate::backend::time::now_ms;
use crate::backend::{AcquireOutcome, LockBackend};
use crate::options::LockOptions;
use crate::retry::{Backoff, Jitter, RetryPolicy};

/// A poll interval so long that only an announcement (or the holder's lease end) explains a
/// waiter that gets the lock well before it.
const SLOW_POLL: Duration = Duration::from_secs(30);

/// A loaded machine's worst case for a wake-up that should take milliseconds.
const PROMPT: Duration = Duration::from_secs(10);

/// Waiters that poll every `poll`, for up to a minute, with a long ttl.
fn waiting_every(poll: Duration) -> LockOptions {
    LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .retry(
            RetryPolicy::wait_for(Duration::from_secs(60))
                .with_backoff(Backoff::Fixed)
                .with_jitter(Jitter::None)
                .with_base_delay(poll),
        )
        .build()
        .expect("valid options")
}

/// The poll that a check's waiters use: slow where the backend announces releases (so that
/// the check proves the announcement), quick where it does not.
fn poll_for<B: LockBackend>(backend: &B) -> Duration {
    if backend.release_notifier().is_some() {
        SLOW_POLL
    } else {
        Duration::from_millis(200)
    }
}

/// A waiter gets the lock soon after its holder releases it: well before its next poll when
/// the backend announces releases.
pub async fn waiters_wake_on_release<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("wake-on-release");
    let holder = acquired(&backend, &key, Duration::from_secs(30)).await;
    let options = waiting_every(poll_for(&backend));
    let waiter = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move { crate::acquire(&backend, &key, &options).await }
    });
    // Let the waiter make its first attempt and go to sleep.
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the key is held");
    let released = Instant::now();
    assert!(
        backend
            .release(&holder.lock_id)
            .await
            .unwrap()
            .is_released()
    );
    let guard = timeout(PROMPT, waiter)
        .await
        .expect("the waiter is woken by the release, not by its 30 s poll")
        .unwrap()
        .expect("the waiter takes the lock");
    let handoff = released.elapsed();
    assert!(guard.fence() > holder.fence);
    assert!(handoff < PROMPT, "handed over in {handoff:?}");
    guard.release().await.unwrap();
}

/// A lock that expires without a release announces nothing: a waiter whose refusal reported
/// the holder's expiry tries again when the lease ends, not at its next poll.
pub async fn waiters_wake_when_the_lease_ends<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("wake-at-lease-end");
    let ttl = Duration::from_secs(1);
    let before = now_ms();
    let holder = acquired(&backend, &key, ttl).await;
    let reported = match backend.acquire(&key, ttl).await.unwrap() {
        AcquireOutcome::Contended(contention) => contention.holder_expires_at_ms,
        other => panic!("the key is held: {other:?}"),
    };
    if let Some(ends) = reported {
        assert!(
            ends >= before && ends <= now_ms() + 1_000 + 1_000,
            "the reported lease end is about now + ttl: {ends} (acquired at {before})"
        );
    }
    // The lease end is only worth waiting for if the backend reports it.
    let poll = if reported.is_some() {
        SLOW_POLL
    } else {
        Duration::from_millis(200)
    };
    let started = Instant::now();
    let guard = timeout(PROMPT, crate::acquire(&backend, &key, &waiting_every(poll)))
        .await
        .expect("the waiter retries when the holder's lease ends")
        .expect("the expired lock is taken");
    assert!(guard.fence() > holder.fence);
    // Never before the lease (and its tolerance) ended.
    assert!(started.elapsed() >= Duration::from_millis(500));
    guard.release().await.unwrap();
}

/// The waiters of one key in one process get it in the order they came, newcomers included;
/// each hand-over is prompt. (Across processes, waiters race: see the docs.)
pub async fn waiters_take_turns_in_arrival_order<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("turns");
    let notified = backend.release_notifier().is_some();
    let holder = acquired(&backend, &key, Duration::from_secs(30)).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let options = waiting_every(poll_for(&backend));
    let spawn_waiter = |index: usize| {
        let (backend, key, order, options) =
            (backend.clone(), key.clone(), order.clone(), options.clone());
        tokio::spawn(async move {
            let guard = crate::acquire(&backend, &key, &options)
                .await
                .expect("every waiter gets its turn");
            order.lock().unwrap().push((index, guard.fence()));
            sleep(Duration::from_millis(20)).await;
            guard.release().await.unwrap();
        })
    };
    let mut waiters = Vec::new();
    for index in 0..3 {
        waiters.push(spawn_waiter(index));
        // Each one queued (first attempt made) before the next comes.
        sleep(Duration::from_millis(200)).await;
    }
    assert!(
        backend
            .release(&holder.lock_id)
            .await
            .unwrap()
            .is_released()
    );
    // A newcomer right after the release: behind the three.
    waiters.push(spawn_waiter(3));
    for waiter in waiters {
        timeout(PROMPT * 2, waiter)
            .await
            .expect("the turns go round promptly")
            .unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), 4, "{order:?}");
    assert!(
        order.windows(2).all(|pair| pair[0].1 < pair[1].1),
        "fences grow from turn to turn: {order:?}"
    );
    if notified {
        let indexes: Vec<usize> = order.iter().map(|(index, _)| *index).collect();
        assert_eq!(indexes, [0, 1, 2, 3], "first come, first served");
    }
}

/// A waiting acquire that is cancelled takes nothing and leaves nothing waiting: the holder
/// keeps its lock, and the next waiter is not held up by the one that left.
pub async fn a_cancelled_wait_leaves_nothing_behind<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("cancelled-wait");
    let holder = acquired(&backend, &key, Duration::from_secs(30)).await;
    let options = waiting_every(poll_for(&backend));
    let cancelled = timeout(
        Duration::from_millis(300),
        crate::acquire(&backend, &key, &options),
    )
    .await;
    assert!(cancelled.is_err(), "the key is held: the wait is cancelled");
    let info = crate::get_by_key(&backend, &key)
        .await
        .unwrap()
        .expect("still held");
    assert_eq!(info.fence, holder.fence, "the holder keeps its lock");
    if let Some(notifier) = backend.release_notifier() {
        assert!(
            !queued_for(&notifier, &key),
            "the cancelled waiter left the queue"
        );
    }
    // A later waiter is first in line and woken by the release.
    let waiter = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move { crate::acquire(&backend, &key, &options).await }
    });
    sleep(Duration::from_millis(300)).await;
    assert!(
        backend
            .release(&holder.lock_id)
            .await
            .unwrap()
            .is_released()
    );
    let guard = timeout(PROMPT, waiter)
        .await
        .expect("the next waiter is not held up")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    assert!(!backend.is_locked(&key).await.unwrap());
}

/// A waiter whose turn comes because the one ahead took the lock does not try it at once
/// (it was just taken), even though its poll fell due while it queued: it waits for the
/// release, so that on a hot key a waiter's only attempt is the one that takes the lock. Its
/// lease counts from that attempt, not from the start of its wait (longer than the ttl here).
pub async fn a_waiter_whose_turn_comes_waits_for_the_release<B: LockBackend + Clone + 'static>(
    backend: B,
) {
    const POLL: Duration = Duration::from_secs(1);
    let key = unique_key("turn-comes");
    let notified = backend.release_notifier().is_some();
    let holder = acquired(&backend, &key, Duration::from_secs(30)).await;
    let options = LockOptions::builder()
        .ttl(POLL)
        .retry(*waiting_every(POLL).retry())
        .build()
        .expect("valid options");
    let spawn_waiter = |counted: FaultyBackend, hold: Duration| {
        let (key, options) = (key.clone(), options.clone());
        tokio::spawn(async move {
            let guard = crate::acquire(&counted, &key, &options)
                .await
                .expect("the waiter gets its turn");
            assert!(
                guard.is_held(),
                "a lease taken after a long wait is live: {:?}",
                guard.lost_reason()
            );
            let fence = guard.fence();
            sleep(hold).await;
            guard.release().await.unwrap();
            fence
        })
    };
    let (ahead, behind) = (
        FaultyBackend::new(backend.clone()),
        FaultyBackend::new(backend.clone()),
    );
    let first = spawn_waiter(ahead, Duration::from_millis(20));
    sleep(Duration::from_millis(200)).await;
    let second = spawn_waiter(behind.clone(), Duration::ZERO);
    // The second waiter's poll falls due while the first one is still first.
    sleep(POLL + Duration::from_millis(500)).await;
    if notified {
        assert_eq!(behind.acquires(), 0, "only the first waiter tries");
    }
    assert!(
        backend
            .release(&holder.lock_id)
            .await
            .unwrap()
            .is_released()
    );
    let first = timeout(PROMPT, first).await.expect("prompt").unwrap();
    let second = timeout(PROMPT, second).await.expect("prompt").unwrap();
    assert!(holder.fence < first && first < second, "fences grow");
    if notified {
        assert_eq!(
            behind.acquires(),
            1,
            "the second waiter tried once: on the first one's release"
        );
    }
}

/// Whether a waiter of `key` is queued in `notifier` (a watch that is not first means one is).
fn queued_for(notifier: &crate::backend::ReleaseNotifier, key: &str) -> bool {
    !notifier.watch(key).is_first()
}
