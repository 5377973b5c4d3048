//! Contention, backend errors and the body's own errors reach the caller through `E`.

use std::time::Duration;

use syncguard::{ErrorCode, LockError, LockOptions, MemoryBackend, locked};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Validation(String),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

#[locked(key = "account:{id}", backend = backend, wait = false)]
async fn once(backend: &MemoryBackend, id: u32) -> Result<u32, AppError> {
    if id == 0 {
        return Err(AppError::Validation("id 0".into()));
    }
    let doubled = id
        .checked_mul(2)
        .ok_or_else(|| AppError::Validation("overflow".into()))?;
    Ok(doubled)
}

#[locked(key = "account:{id}", backend = backend, wait = "300ms", retry_delay = "20ms")]
async fn patient(
    backend: &MemoryBackend,
    id: u32,
) -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
    Ok(id)
}

#[locked(key = "", backend = backend)]
async fn empty_key(backend: &MemoryBackend) -> Result<(), LockError> {
    Ok(())
}

#[tokio::test]
async fn body_errors_and_question_mark_work() {
    let backend = MemoryBackend::new();
    assert_eq!(once(&backend, 21).await.unwrap(), 42);
    assert!(matches!(once(&backend, 0).await, Err(AppError::Validation(m)) if m == "id 0"));
    assert!(
        matches!(once(&backend, u32::MAX).await, Err(AppError::Validation(m)) if m == "overflow")
    );
}

#[tokio::test]
async fn contention_converts_through_from() {
    let backend = MemoryBackend::new();
    let held = syncguard::acquire(&backend, "account:5", &LockOptions::default())
        .await
        .unwrap();
    // `wait = false`: one attempt, and the lock is busy.
    match once(&backend, 5).await {
        Err(AppError::Lock(error)) => {
            assert_eq!(error.code(), ErrorCode::Contended);
            // The hint names the macro's own way to wait.
            assert!(error.to_string().contains("`wait = \"5s\"`"), "{error}");
        }
        other => panic!("expected contention, got {other:?}"),
    }
    // `wait = "300ms"`: retries until the wait runs out.
    let started = tokio::time::Instant::now();
    let error = patient(&backend, 5).await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(250));
    let error = error.downcast::<LockError>().expect("a LockError");
    assert!(error.is_contended());
    assert_eq!(error.code(), ErrorCode::AcquisitionTimeout, "{error}");
    assert!(error.attempts().unwrap() > 1, "{error}");
    held.release().await.unwrap();
    assert_eq!(patient(&backend, 5).await.unwrap(), 5);
}

#[tokio::test]
async fn invalid_keys_fail_before_the_body() {
    let error = empty_key(&MemoryBackend::new()).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument);
}
