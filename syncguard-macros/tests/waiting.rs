//! A waiting call wakes when the lock is released; `wake_on_release = false` polls at its
//! delays alone.

use std::time::Duration;

use syncguard::{LockError, LockOptions, MemoryBackend, locked};
use tokio::time::Instant;

/// Polls every 30 s: only the release explains a quick return.
#[locked(key = "woken", backend = backend, wait = "60s", retry_delay = "30s", backoff = fixed, jitter = none)]
async fn woken(backend: &MemoryBackend) -> Result<Instant, LockError> {
    Ok(Instant::now())
}

/// Polls every 1.5 s and ignores releases.
#[locked(key = "polling", backend = backend, wait = "60s", retry_delay = "1500ms", backoff = fixed, jitter = none, wake_on_release = false)]
async fn polling(backend: &MemoryBackend) -> Result<Instant, LockError> {
    Ok(Instant::now())
}

/// Holds `key`, starts `call`, releases after 200 ms: how long the call took.
async fn wait_behind_a_holder<F>(backend: &MemoryBackend, key: &str, call: F) -> Duration
where
    F: Future<Output = Result<Instant, LockError>> + Send + 'static,
{
    let holder = syncguard::acquire(backend, key, &LockOptions::default())
        .await
        .unwrap();
    let started = Instant::now();
    let waiter = tokio::spawn(call);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the key is held");
    holder.release().await.unwrap();
    let ran_at = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .unwrap();
    ran_at - started
}

#[tokio::test]
async fn a_waiting_call_wakes_on_release() {
    let backend = MemoryBackend::new();
    let call = {
        let backend = backend.clone();
        async move { woken(&backend).await }
    };
    let took = wait_behind_a_holder(&backend, "woken", call).await;
    assert!(
        took < Duration::from_secs(10),
        "woken by the release: {took:?}"
    );
}

#[tokio::test]
async fn wake_on_release_false_polls() {
    let backend = MemoryBackend::new();
    let call = {
        let backend = backend.clone();
        async move { polling(&backend).await }
    };
    let took = wait_behind_a_holder(&backend, "polling", call).await;
    // Not before its first poll, 1.5 s after the refused attempt.
    assert!(took >= Duration::from_millis(1400), "polled: {took:?}");
}
