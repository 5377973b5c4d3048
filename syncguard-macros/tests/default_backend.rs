//! Without `backend = ...` the process-wide default is used; unset, it is a clear error.

use syncguard::{ErrorCode, LockBackend, LockError, MemoryBackend, locked};

#[locked(key = "default:{n}")]
async fn on_default(n: u32) -> Result<u32, LockError> {
    Ok(n)
}

#[tokio::test]
async fn default_backend_is_required_then_used() {
    let error = on_default(1).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::NoDefaultBackend);
    let backend = MemoryBackend::new();
    syncguard::set_default_backend(backend.clone()).unwrap();
    assert_eq!(on_default(2).await.unwrap(), 2);
    assert!(!backend.is_locked("default:2").await.unwrap());
}
