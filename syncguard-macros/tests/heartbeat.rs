//! A 300 ms ttl survives a 2 s body thanks to the heartbeat; without it the lock lapses.

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
async fn unkept_job(backend: &MemoryBackend) -> Result<syncguard::LostReason, LockError> {
    Ok(g.lost().await)
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
    let reason = tokio::time::timeout(Duration::from_secs(10), unkept_job(&backend))
        .await
        .expect("lost within the ttl")
        .unwrap();
    assert_eq!(reason, syncguard::LostReason::LeaseExpired);
}
