//! The entry points on top of the backend: [`try_acquire`](crate::try_acquire), waiting in
//! [`acquire`](crate::acquire), the errors they give and how those name the lock, and the
//! [`LockHandle`](crate::LockHandle) view of a guard.

use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};

use super::support::{assert_code, assert_contended, unique_key};
use crate::backend::LockBackend;
use crate::backend::key::hash_key;
use crate::backend::time::now_ms;
use crate::error::{ErrorCode, LockError, LostReason};
use crate::inspect::{get_by_id, get_by_key};
use crate::options::LockOptions;
use crate::retry::RetryPolicy;

/// Options with a long ttl (no heartbeat extend during a check) and no wait.
fn hasty() -> LockOptions {
    LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .retry(RetryPolicy::single_attempt())
        .build()
        .expect("valid options")
}

/// A contended error carries the holder's expiry as the refusal reported it: the holder's
/// own, as it stood between `before` (read before the attempt) and now (a heartbeat may have
/// extended it since), and its remaining lease at most the ttl plus the tolerance (and a
/// second for the clocks of a server on this host, which may tick apart by milliseconds).
fn assert_holder_expiry(error: &LockError, before: u64, holder: &crate::LockGuard) {
    let expiry = error
        .holder_expires_at_ms()
        .unwrap_or_else(|| panic!("the refusal's holder expiry is carried: {error:?}"));
    assert!(
        (before..=holder.expires_at_ms()).contains(&expiry),
        "{expiry} is not the holder's expiry ({before}..={})",
        holder.expires_at_ms()
    );
    let left = error.holder_lease_left().expect("a lease left");
    assert!(
        left <= holder.ttl()
            + Duration::from_millis(crate::backend::time::TIME_TOLERANCE_MS + 1000),
        "{left:?}"
    );
}

/// `try_acquire` takes a free key, answers `Ok(None)` on a held one and changes nothing
/// there: the holder keeps its lock (same lock id, fence and expiry), and the next real
/// acquisition after the release gets the holder's fence plus one.
pub async fn try_acquire_on_a_held_key_changes_nothing<B: LockBackend + Clone + 'static>(
    backend: B,
) {
    let key = unique_key("try-acquire");
    let options = hasty();
    let holder = crate::try_acquire(&backend, &key, &options)
        .await
        .expect("try_acquire on a free key")
        .expect("a free key is taken");
    assert_eq!(holder.key(), key);
    assert!(holder.is_held());
    assert!(backend.is_locked(&key).await.unwrap());
    let before = get_by_key(&backend, &key)
        .await
        .unwrap()
        .expect("live lock");
    assert_eq!(before.fence, holder.fence());

    for _ in 0..3 {
        let second = crate::try_acquire(&backend, &key, &options).await;
        assert!(
            matches!(second, Ok(None)),
            "a held key is Ok(None), not an error or a second guard: {second:?}"
        );
    }
    // Whatever the policy says: try_acquire never waits.
    let patient = options
        .to_builder()
        .retry(RetryPolicy::wait_for(Duration::from_secs(30)))
        .build()
        .unwrap();
    let started = Instant::now();
    let third = timeout(
        Duration::from_secs(10),
        crate::try_acquire(&backend, &key, &patient),
    )
    .await
    .expect("try_acquire does not wait");
    assert!(matches!(third, Ok(None)), "{third:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    assert!(holder.is_held(), "{:?}", holder.lost_reason());
    let after = get_by_key(&backend, &key)
        .await
        .unwrap()
        .expect("live lock");
    assert_eq!(after, before, "a refused try_acquire changed the lock");
    let by_id = get_by_id(&backend, holder.lock_id()).await.unwrap();
    assert_eq!(by_id.as_ref(), Some(&before), "the holder still owns it");

    // Bad input is an error, not contention.
    assert_code(
        crate::try_acquire(&backend, "", &options).await,
        ErrorCode::InvalidArgument,
        "try_acquire with an empty key",
    );

    let fence = holder.fence();
    assert!(holder.release().await.unwrap());
    let next = crate::try_acquire(&backend, &key, &options)
        .await
        .unwrap()
        .expect("free again after the release");
    assert_eq!(
        next.fence().get(),
        fence.get() + 1,
        "refused attempts must not advance the fence"
    );
    assert!(next.release().await.unwrap());
}

/// `acquire` on a held key: [`ErrorCode::Contended`](crate::ErrorCode::Contended) when the policy
/// allows no wait (after exactly one attempt, the holder untouched),
/// [`ErrorCode::AcquisitionTimeout`](crate::ErrorCode::AcquisitionTimeout) when the wait runs out,
/// and the lock itself when it is released within [`RetryPolicy::wait_for`].
pub async fn acquire_waits_only_when_asked<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("waiting");
    let holder = crate::acquire(&backend, &key, &hasty()).await.unwrap();

    let started = Instant::now();
    let before = holder.expires_at_ms();
    let error = crate::acquire(&backend, &key, &hasty()).await.unwrap_err();
    assert_eq!(
        error.code(),
        ErrorCode::Contended,
        "a single attempt on a held key: {error}"
    );
    assert!(error.is_contended() && error.is_retryable(), "{error}");
    assert_holder_expiry(&error, before, &holder);
    assert!(started.elapsed() < Duration::from_secs(5), "no wait");
    assert!(holder.is_held());
    assert_contended(&backend, &key).await;

    // Long enough for a slow backend (an emulator) to fit a second attempt in.
    let wait = Duration::from_secs(1);
    let brief = hasty()
        .to_builder()
        .retry(RetryPolicy::wait_for(wait))
        .build()
        .unwrap();
    let started = Instant::now();
    let before = holder.expires_at_ms();
    let error = crate::acquire(&backend, &key, &brief).await.unwrap_err();
    let waited = started.elapsed();
    assert_eq!(
        error.code(),
        ErrorCode::AcquisitionTimeout,
        "a wait that ran out: {error}"
    );
    let (attempts, elapsed) = (error.attempts().unwrap(), error.waited().unwrap());
    assert!(attempts >= 2, "a wait retries: {error}");
    assert!(elapsed >= wait - Duration::from_millis(50), "{error}");
    assert!(elapsed <= waited, "{error}");
    assert_holder_expiry(&error, before, &holder);
    assert!(error.is_contended(), "{error}");
    assert_eq!(error.code(), ErrorCode::AcquisitionTimeout);
    assert!(!error.to_string().contains("1 attempts"), "{error}");
    assert!(holder.is_held());

    // Released while a waiter waits: the waiter gets it, with the next fence.
    let fence = holder.fence();
    let releaser = tokio::spawn(async move {
        sleep(Duration::from_millis(300)).await;
        holder.release().await
    });
    let patient = hasty()
        .to_builder()
        .retry(RetryPolicy::wait_for(Duration::from_secs(20)))
        .build()
        .unwrap();
    let started = Instant::now();
    let next = crate::acquire(&backend, &key, &patient)
        .await
        .expect("taken once the holder released it");
    assert!(started.elapsed() >= Duration::from_millis(250), "it waited");
    assert!(releaser.await.unwrap().unwrap(), "the holder released it");
    assert_eq!(next.fence().get(), fence.get() + 1);
    assert!(next.release().await.unwrap());
}

/// Errors about a lock name it by its key hash, and by its key only with `show_key`:
/// `Contended`, `AcquisitionTimeout` and `LockLost` alike.
pub async fn errors_name_the_lock<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("named");
    let holder = crate::acquire(&backend, &key, &hasty()).await.unwrap();
    assert_eq!(holder.name().key_hash(), hash_key(&key));
    assert_eq!(holder.name().key(), None, "the key is hidden by default");

    let hidden = crate::acquire(&backend, &key, &hasty()).await.unwrap_err();
    let shown_options = hasty().to_builder().show_key(true).build().unwrap();
    let shown = crate::acquire(&backend, &key, &shown_options)
        .await
        .unwrap_err();
    let waited_options = shown_options
        .to_builder()
        .retry(RetryPolicy::wait_for(Duration::from_secs(1)))
        .build()
        .unwrap();
    let waited = crate::acquire(&backend, &key, &waited_options)
        .await
        .unwrap_err();
    assert_eq!(hidden.code(), ErrorCode::Contended, "{hidden}");
    assert_eq!(shown.code(), ErrorCode::Contended, "{shown}");
    assert_eq!(waited.code(), ErrorCode::AcquisitionTimeout, "{waited}");

    let name = hidden.lock().expect("a contention error names its lock");
    assert_eq!(name.key_hash(), hash_key(&key));
    assert_eq!(name.key(), None);
    let text = hidden.to_string();
    assert!(text.contains(&hash_key(&key)), "{text}");
    assert!(
        !text.contains(&key),
        "the key leaked without show_key: {text}"
    );
    for error in [&shown, &waited] {
        let name = error.lock().expect("names its lock");
        assert_eq!(name.key_hash(), hash_key(&key));
        assert_eq!(name.key(), Some(key.as_str()));
        let text = error.to_string();
        assert!(
            text.contains(&key) && text.contains(&hash_key(&key)),
            "{text}"
        );
    }
    assert!(holder.release().await.unwrap());

    // A loss names the lock too.
    let options = LockOptions::builder()
        .ttl(Duration::from_millis(600))
        .show_key(true)
        .build()
        .unwrap();
    let thief = backend.clone();
    let lost = timeout(
        Duration::from_secs(20),
        crate::with_lock(&backend, &key, &options, async |guard| {
            assert!(thief.release(guard.lock_id()).await?.is_released());
            sleep(Duration::from_secs(3600)).await;
            Ok::<_, LockError>(())
        }),
    )
    .await
    .expect("the work should have been cancelled")
    .unwrap_err();
    assert!(lost.is_lock_lost(), "expected LockLost: {lost}");
    assert_eq!(lost.lost_reason(), Some(LostReason::NotHeld));
    let lock = lost.lock().expect("a loss names its lock");
    assert_eq!(lock.key_hash(), hash_key(&key));
    assert_eq!(lock.key(), Some(key.as_str()));
    assert_eq!(
        lost.lock().map(|name| name.key_hash()),
        Some(&*hash_key(&key))
    );
    assert!(lost.to_string().contains(&key), "{lost}");
}

/// A [`LockHandle`](crate::LockHandle) reports what its guard does: key, name, lock id,
/// fence, ttl, the authoritative expiry (as the backend stores it, before and after an
/// extend), the hold time, and the loss; after a release it is no longer held, and no loss is
/// reported.
pub async fn handle_agrees_with_the_guard<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("handle");
    let ttl = Duration::from_secs(30);
    let options = LockOptions::builder()
        .ttl(ttl)
        .show_key(true)
        .build()
        .unwrap();
    let before = now_ms();
    let guard = crate::acquire(&backend, &key, &options).await.unwrap();
    let handle = guard.handle();
    let copy = handle.clone();
    for view in [&handle, &copy] {
        assert_eq!(view.key(), guard.key());
        assert_eq!(view.key(), key);
        assert_eq!(view.name(), guard.name());
        assert_eq!(view.name().key(), Some(key.as_str()));
        assert_eq!(view.name().key_hash(), hash_key(&key));
        assert_eq!(view.lock_id(), guard.lock_id());
        assert_eq!(view.fence(), guard.fence());
        assert_eq!(view.ttl(), guard.ttl());
        assert_eq!(view.ttl(), ttl);
        assert_eq!(view.expires_at_ms(), guard.expires_at_ms());
        assert!(view.is_held() && guard.is_held());
        assert!(!view.is_lost() && !guard.is_lost());
        assert_eq!(view.lost_reason(), None);
        assert!(!view.lost_token().is_cancelled());
    }
    let stored = get_by_id(&backend, guard.lock_id())
        .await
        .unwrap()
        .expect("live lock");
    assert_eq!(handle.expires_at_ms(), stored.expires_at_ms);
    assert_eq!(handle.fence(), stored.fence);
    // Server-time backends may differ from the local clock by a little.
    assert!(
        handle.expires_at_ms() + 5_000 >= before + 30_000,
        "now + ttl"
    );

    sleep(Duration::from_millis(100)).await;
    let (by_guard, by_handle) = (guard.held_for(), handle.held_for());
    assert!(by_guard >= Duration::from_millis(100), "{by_guard:?}");
    assert!(by_handle >= Duration::from_millis(100), "{by_handle:?}");
    assert!(by_guard.abs_diff(by_handle) < Duration::from_secs(1));
    assert!(by_guard < Duration::from_secs(60));

    let first = handle.expires_at_ms();
    assert!(guard.extend(Duration::from_secs(120)).await.unwrap());
    assert_eq!(handle.expires_at_ms(), guard.expires_at_ms());
    assert!(
        handle.expires_at_ms() >= first + 60_000,
        "the extend moved it"
    );
    let stored = get_by_id(&backend, guard.lock_id()).await.unwrap().unwrap();
    assert_eq!(handle.expires_at_ms(), stored.expires_at_ms);

    // A task holding only the handle sees the same lock.
    let task_view = handle.clone();
    let seen = tokio::spawn(async move { task_view.is_held().then(|| task_view.fence()) })
        .await
        .unwrap();
    assert_eq!(seen, Some(guard.fence()));

    assert!(guard.release().await.unwrap());
    for view in [&handle, &copy] {
        assert!(!view.is_held(), "released");
        assert!(!view.is_lost(), "a release is no loss");
        assert_eq!(view.lost_reason(), None);
        assert!(!view.lost_token().is_cancelled());
    }
    assert!(
        timeout(Duration::from_millis(200), handle.lost())
            .await
            .is_err(),
        "lost() never completes after a release"
    );
    assert!(!backend.is_locked(&key).await.unwrap());

    // A loss reaches the handle: a lock released behind its guard's back.
    let options = options
        .to_builder()
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let guard = crate::acquire(&backend, &key, &options).await.unwrap();
    let handle = guard.handle();
    let token = handle.lost_token();
    assert!(
        backend
            .release(guard.lock_id())
            .await
            .unwrap()
            .is_released()
    );
    let reason = timeout(Duration::from_secs(10), handle.lost())
        .await
        .expect("the handle hears of the loss");
    assert_eq!(reason, LostReason::NotHeld);
    assert!(handle.is_lost() && !handle.is_held());
    assert_eq!(handle.lost_reason(), guard.lost_reason());
    assert!(token.is_cancelled());
    drop(guard);
    // The key was free since the release behind the guard's back, and its drop did not
    // resurrect it.
    let lease = backend
        .acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .lease()
        .expect("the key is free after a release behind the holder's back");
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}
