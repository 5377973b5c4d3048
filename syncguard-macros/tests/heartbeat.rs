//! A 300 ms ttl survives a 2 s body thanks to the heartbeat; without it the lock lapses, and
//! the function reports the loss even though its body saw it and returned normally. A hold
//! cap too long to reach is no cap.

use std::time::Duration;

use syncguard::{LockBackend, LockError, MemoryBackend, locked};

#[locked(key = "long", backend = backend, ttl = "300ms", guard = g)]
async fn long_job(backend: &MemoryBackend) -> Result<bool, LockError> {
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Nobody else can take it meanwhile.
        assert!(
            backend
                .acquire("long", Duration::from_secs(1))
                .await?
                .is_contended()
        );
    }
    Ok(g.is_lost())
}

#[locked(key = "unkept", backend = backend, ttl = "300ms", heartbeat = false, on_lost = notify, guard = g)]
async fn unkept_job(backend: &MemoryBackend) -> Result<&'static str, LockError> {
    g.lost().await;
    Ok("finished after the lease ran out")
}

#[locked(key = "uncapped", backend = backend, ttl = "300ms", max_hold = "1000000years", guard = g)]
async fn uncapped_job(backend: &MemoryBackend) -> Result<bool, LockError> {
    tokio::time::sleep(Duration::from_millis(1200)).await;
    Ok(g.is_lost())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_keeps_a_short_lock_through_a_long_body() {
    let backend = MemoryBackend::new();
    assert!(!long_job(&backend).await.unwrap());
    assert!(
        !backend.is_locked("long").await.unwrap(),
        "released at the end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_heartbeat_the_lock_lapses() {
    let backend = MemoryBackend::new();
    let result = tokio::time::timeout(Duration::from_secs(10), unkept_job(&backend))
        .await
        .expect("lost within the ttl");
    assert_eq!(
        result.as_ref().err().and_then(LockError::lost_reason),
        Some(syncguard::LostReason::TtlElapsed),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_cap_beyond_reach_keeps_the_heartbeat_going() {
    let backend = MemoryBackend::new();
    assert!(!uncapped_job(&backend).await.unwrap());
    assert!(!backend.is_locked("uncapped").await.unwrap());
}
