//! Errors name their lock by the key's hash; `show_key = true` adds the key itself.

use std::time::Duration;

use syncguard::{
    ErrorCode, LockBackend, LockError, LockName, LockOptions, LostReason, MemoryBackend, locked,
};

#[locked(key = "user:{id}:export", backend = backend, wait = false)]
async fn hidden(backend: &MemoryBackend, id: u32) -> Result<(), LockError> {
    Ok(())
}

#[locked(key = "user:{id}:export", backend = backend, wait = false, show_key = true)]
async fn shown(backend: &MemoryBackend, id: u32) -> Result<(), LockError> {
    Ok(())
}

/// Releases its own lock behind its back, so that the lock is lost while the body runs.
#[locked(key = "user:{id}:import", backend = backend, ttl = "600ms", guard = lock)]
async fn lost_hidden(backend: &MemoryBackend, id: u32) -> Result<(), LockError> {
    assert!(backend.release(lock.lock_id()).await?.is_released());
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}

#[locked(key = "user:{id}:import", backend = backend, ttl = "600ms", guard = lock, show_key = true)]
async fn lost_shown(backend: &MemoryBackend, id: u32) -> Result<(), LockError> {
    assert!(backend.release(lock.lock_id()).await?.is_released());
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}

fn hash(key: &str) -> String {
    LockName::new(key, false).key_hash().to_owned()
}

#[tokio::test]
async fn contention_names_the_lock() {
    let backend = MemoryBackend::new();
    let _held = syncguard::acquire(&backend, "user:7:export", &LockOptions::default())
        .await
        .unwrap();

    let error = hidden(&backend, 7).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::Contended, "{error:?}");
    let lock = error.lock().unwrap();
    assert_eq!(lock.key(), None);
    assert_eq!(lock.key_hash(), hash("user:7:export"));
    let message = error.to_string();
    assert!(message.contains(&hash("user:7:export")), "{message}");
    assert!(!message.contains("user:7"), "{message}");

    let error = shown(&backend, 7).await.unwrap_err();
    assert_eq!(
        error.lock().and_then(LockName::key),
        Some("user:7:export"),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("\"user:7:export\""), "{message}");
    assert!(message.contains(&hash("user:7:export")), "{message}");
}

#[tokio::test]
async fn a_lost_lock_names_the_lock() {
    let backend = MemoryBackend::new();

    let error = lost_hidden(&backend, 8).await.unwrap_err();
    assert_eq!(error.lost_reason(), Some(LostReason::NotHeld), "{error:?}");
    let lock = error.lock().unwrap();
    assert_eq!(lock.key(), None);
    let message = error.to_string();
    assert!(message.contains(&hash("user:8:import")), "{message}");
    assert!(!message.contains("user:8"), "{message}");

    let error = lost_shown(&backend, 8).await.unwrap_err();
    assert!(error.is_lock_lost(), "{error:?}");
    let lock = error.lock().unwrap();
    assert_eq!(lock.key(), Some("user:8:import"));
    let message = error.to_string();
    assert!(message.contains("\"user:8:import\""), "{message}");
    assert!(message.contains(&hash("user:8:import")), "{message}");
}
