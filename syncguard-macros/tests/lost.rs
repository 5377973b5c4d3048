//! A lost lock cancels the body (the default) or only notifies it; either way the function
//! reports the loss, not success.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use syncguard::{LockBackend, LockError, LostReason, MemoryBackend, locked};

static FINISHED: AtomicBool = AtomicBool::new(false);
static NOTIFIED_FINISHED: AtomicBool = AtomicBool::new(false);

#[locked(key = "stolen", backend = backend, ttl = "600ms", guard = g)]
async fn cancelled(backend: &MemoryBackend) -> Result<(), LockError> {
    // Someone releases our lock behind our back (an operator, a bug elsewhere).
    assert!(backend.release(g.lock_id()).await?.is_released());
    tokio::time::sleep(Duration::from_secs(30)).await;
    FINISHED.store(true, Ordering::SeqCst);
    Ok(())
}

#[locked(key = "stolen-notify", backend = backend, ttl = "600ms", on_lost = notify, guard = g)]
async fn notified(backend: &MemoryBackend) -> Result<&'static str, LockError> {
    assert!(backend.release(g.lock_id()).await?.is_released());
    let reason = g.lost().await;
    assert_eq!(reason, LostReason::NotHeld);
    NOTIFIED_FINISHED.store(true, Ordering::SeqCst);
    Ok("finished after the loss")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_cancels_the_body() {
    let backend = MemoryBackend::new();
    let error = tokio::time::timeout(Duration::from_secs(10), cancelled(&backend))
        .await
        .expect("the body must be cancelled, not run for 30 s")
        .unwrap_err();
    assert!(error.is_lock_lost(), "{error}");
    assert_eq!(error.lost_reason(), Some(LostReason::NotHeld), "{error}");
    // Named by the key's hash; the key itself only with `show_key = true`.
    let lock = error.lock().expect("a loss names its lock");
    assert_eq!(lock.key_hash(), syncguard::backend::key::hash_key("stolen"));
    assert_eq!(lock.key(), None);
    assert!(!FINISHED.load(Ordering::SeqCst));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_lets_the_body_finish_and_reports_the_loss() {
    let backend = MemoryBackend::new();
    let result = tokio::time::timeout(Duration::from_secs(10), notified(&backend))
        .await
        .unwrap();
    assert!(NOTIFIED_FINISHED.load(Ordering::SeqCst), "the body ran on");
    assert_eq!(
        result.as_ref().err().and_then(LockError::lost_reason),
        Some(LostReason::NotHeld),
        "{result:?}"
    );
}
