//! Scheduled jobs: `skip_if_held` skips a run whose lock is held (a normal outcome, not an
//! error), and `min_hold` keeps the lock after an early finish.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use syncguard::backend::LockBackend as _;
use syncguard::{LockError, LockOptions, MemoryBackend, locked};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[locked(key = "report:{firing}", backend = backend, skip_if_held = true)]
async fn report(backend: &MemoryBackend, firing: u32) -> Result<(), LockError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[locked(key = "sum:{firing}", backend = backend, skip_if_held = true)]
async fn sum(backend: &MemoryBackend, firing: u32) -> Result<Option<u32>, LockError> {
    Ok(Some(firing * 2))
}

#[locked(key = "nightly:{firing}", backend = backend, skip_if_held = true, min_hold = "2s")]
async fn nightly(backend: &MemoryBackend, firing: u32) -> Result<Option<u32>, LockError> {
    Ok(Some(firing))
}

async fn hold(backend: &MemoryBackend, key: &str) -> syncguard::LockGuard {
    syncguard::acquire(backend, key, &LockOptions::default())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_held_lock_skips_the_run() {
    let backend = MemoryBackend::new();
    let before = RUNS.load(Ordering::SeqCst);
    report(&backend, 1).await.unwrap();
    assert_eq!(RUNS.load(Ordering::SeqCst), before + 1, "a free lock runs");

    let other = hold(&backend, "report:2").await;
    report(&backend, 2).await.expect("skipping is not an error");
    assert_eq!(RUNS.load(Ordering::SeqCst), before + 1, "a held lock skips");
    other.release().await.unwrap();

    assert_eq!(sum(&backend, 3).await.unwrap(), Some(6));
    let other = hold(&backend, "sum:4").await;
    assert_eq!(sum(&backend, 4).await.unwrap(), None, "skipped: Ok(None)");
    other.release().await.unwrap();
}

#[tokio::test]
async fn min_hold_keeps_the_firing_locked_after_an_early_finish() {
    let backend = MemoryBackend::new();
    assert_eq!(nightly(&backend, 7).await.unwrap(), Some(7));
    // Another replica firing a moment later (its clock behind) skips the same firing.
    assert_eq!(nightly(&backend, 7).await.unwrap(), None);
    assert!(backend.is_locked("nightly:7").await.unwrap());
    // Once min_hold (and the 1 s tolerance) is over, the key is free again.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(!backend.is_locked("nightly:7").await.unwrap());
}
