//! The process-wide default backend (its own test binary: the default is set once per process).

use syncguard::{ErrorCode, LockBackend, MemoryBackend, default_backend, set_default_backend};

#[tokio::test]
async fn unset_is_a_clear_error_then_set_once() {
    let error = default_backend().err().expect("nothing set yet");
    assert_eq!(error.code(), ErrorCode::NoDefaultBackend);
    assert!(error.to_string().contains("set_default_backend"), "{error}");

    let backend = MemoryBackend::new();
    set_default_backend(backend.clone()).unwrap();
    let shared = default_backend().unwrap();
    let guard = syncguard::acquire(&shared, "default:1", &syncguard::LockOptions::default())
        .await
        .unwrap();
    // The default is the very backend that was set.
    assert!(backend.is_locked("default:1").await.unwrap());

    let again = set_default_backend(MemoryBackend::new()).unwrap_err();
    assert_eq!(again.code(), ErrorCode::InvalidArgument);
    assert!(
        default_backend()
            .unwrap()
            .is_locked("default:1")
            .await
            .unwrap()
    );
    guard.release().await.unwrap();
}
