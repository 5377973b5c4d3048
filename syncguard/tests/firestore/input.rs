//! What is refused: custom collection names checked, keys Firestore cannot store refused
//! before any I/O, and a refused connection, printed once.

use std::time::Duration;

use syncguard::backend::LockBackend;
use syncguard::backend::key::make_storage_key;
use syncguard::firestore::{FirestoreBackend, FirestoreConfig};
use syncguard::{ErrorCode, conformance};

use crate::{backend, backend_in, client, lease, project, read_doc};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn custom_collections_are_used_and_validated() {
    let project = project();
    let config = FirestoreConfig::new()
        .with_lock_collection("app_locks")
        .with_fence_collection("app_fences");
    let backend = backend_in(&project, config).await;
    let db = client(&project).await;
    let key = conformance::unique_key("custom");
    let lease = lease(
        backend
            .acquire(&key, Duration::from_secs(30))
            .await
            .unwrap(),
    );
    let doc_id = make_storage_key("", &key, 1500, 0).unwrap();
    assert!(read_doc(&db, "app_locks", &doc_id).await.is_some());
    assert!(read_doc(&db, "locks", &doc_id).await.is_none());
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());

    for config in [
        FirestoreConfig::new().with_fence_collection("locks"),
        FirestoreConfig::new().with_lock_collection(""),
        FirestoreConfig::new().with_lock_collection("a/b"),
        FirestoreConfig::new().with_fence_collection("__reserved__"),
    ] {
        let error = FirestoreBackend::new(db.clone(), config.clone()).unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
        let error = FirestoreBackend::connect_with(&project, config)
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
    }
    let error = FirestoreBackend::connect("").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
}

/// `new` runs on a client of yours: the connect timeout, which only bounds making a client,
/// is refused, naming it, rather than silently ignored; bad timeouts are refused by both,
/// naming them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn settings_that_cannot_apply_or_are_bad_are_refused_naming_them() {
    let project = project();
    let db = client(&project).await;
    let connect_only = FirestoreConfig::new().with_connect_timeout(Duration::from_secs(3));
    let error = FirestoreBackend::new(db.clone(), connect_only.clone()).unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
    assert!(
        error.to_string().contains("with_connect_timeout"),
        "{error}"
    );
    let backend = FirestoreBackend::connect_with(&project, connect_only)
        .await
        .unwrap();
    assert_eq!(backend.config().connect_timeout(), Duration::from_secs(3));

    for (config, setting) in [
        (
            FirestoreConfig::new().with_operation_timeout(Duration::ZERO),
            "with_operation_timeout",
        ),
        (
            FirestoreConfig::new().with_connect_timeout(Duration::ZERO),
            "with_connect_timeout",
        ),
    ] {
        let error = FirestoreBackend::connect_with(&project, config.clone())
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
        assert!(error.to_string().contains(setting), "{setting}: {error}");
        let error = FirestoreBackend::new(db.clone(), config).unwrap_err();
        assert!(error.to_string().contains(setting), "{setting}: {error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_firestore_cannot_store_are_refused_before_io() {
    let backend = backend().await;
    for key in ["a/b", ".", "..", "__name__"] {
        let error = backend
            .acquire(key, Duration::from_secs(30))
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{key}: {error}");
        assert_eq!(
            backend.is_locked(key).await.unwrap_err().code(),
            ErrorCode::InvalidArgument
        );
    }
}

/// A client whose emulator is a closed port: the builder reports a retryable connection
/// failure in our words, and the driver's text ("Connection refused (os error 111)" on
/// Linux) appears once when the chain is walked. The `firestore` crate reads the emulator's
/// address from `FIRESTORE_EMULATOR_HOST` only, so the check runs in a child process of this
/// test binary with a variable of its own, leaving the other tests' environment alone.
#[tokio::test]
async fn a_refused_connection_is_unavailable_and_printed_once() {
    // The child runs this test alone, by its full path in the binary.
    const TEST: &str = "input::a_refused_connection_is_unavailable_and_printed_once";
    const CHILD: &str = "SYNCGUARD_TEST_FIRESTORE_REFUSED_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let host = std::env::var("FIRESTORE_EMULATOR_HOST").unwrap();
        let err = FirestoreBackend::connect("syncguard-refused")
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ServiceUnavailable, "{err}");
        assert!(err.is_retryable());
        let message = err.to_string();
        assert!(
            message.contains("refused") && message.contains(&host),
            "the message should say what happened and where: {message}"
        );
        assert!(
            !message.contains("os error"),
            "the message should say it in our words: {message}"
        );
        let mut chain = message;
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            chain.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        assert_eq!(chain.matches("os error").count(), 1, "{chain}");
        let io = std::error::Error::source(&err)
            .and_then(|source| source.downcast_ref::<std::io::Error>())
            .map(std::io::Error::kind);
        assert_eq!(io, Some(std::io::ErrorKind::ConnectionRefused), "{err:?}");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("FIRESTORE_EMULATOR_HOST", format!("127.0.0.1:{port}"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&child.stdout);
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(
        child.status.success() && stdout.contains("1 passed"),
        "the check in the child process failed:\n{stdout}\n{stderr}"
    );
}
