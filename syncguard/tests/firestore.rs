//! The Firestore backend against the Cloud Firestore emulator (started by
//! `bash scripts/test-all.sh` or `bash scripts/with-services.sh`, which export
//! `FIRESTORE_EMULATOR_HOST` and `SYNCGUARD_TEST_FIRESTORE_PROJECT`).
//!
//! Every backend gets a project id of its own: the emulator keeps projects apart, so tests
//! never see each other's documents.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use firestore::FirestoreDb;
use serde_json::Value;
use syncguard::backend::{AcquireOutcome, Lease, LockBackend, ReleaseOutcome};
use syncguard::firestore::{FirestoreBackend, FirestoreConfig};
use syncguard::key::{make_fence_key, make_storage_key};
use syncguard::{ErrorCode, LockId, conformance};
use tokio::sync::Barrier;

#[path = "support/frozen.rs"]
mod frozen;

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A project id no other test (or run) uses.
fn project() -> String {
    let host = std::env::var("FIRESTORE_EMULATOR_HOST").unwrap_or_default();
    assert!(
        !host.is_empty(),
        "FIRESTORE_EMULATOR_HOST is not set: run the tests through `bash scripts/test-all.sh` or \
         `bash scripts/with-services.sh cargo test ...`, which start the Cloud Firestore emulator \
         (Google Cloud SDK component cloud-firestore-emulator, needs java)"
    );
    let base = std::env::var("SYNCGUARD_TEST_FIRESTORE_PROJECT")
        .unwrap_or_else(|_| "syncguard-test".to_owned());
    let suffix: String = LockId::generate()
        .as_str()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect::<String>()
        .to_lowercase();
    format!("{base}-{}-{suffix}", NEXT.fetch_add(1, Ordering::Relaxed))
}

async fn client(project: &str) -> FirestoreDb {
    FirestoreDb::new(project)
        .await
        .expect("connect to the Firestore emulator")
}

/// Runs a few lock cycles once per test process, so that the timing-sensitive checks do not
/// measure a freshly started emulator's JVM warming up (its first operations take seconds).
async fn warm_up_emulator() {
    static WARM: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    WARM.get_or_init(|| async {
        let backend = FirestoreBackend::connect(&project())
            .await
            .expect("connect to the Firestore emulator");
        for round in 0..20 {
            let key = format!("warm-up:{round}");
            let lease = lease(
                backend
                    .acquire(&key, Duration::from_secs(30))
                    .await
                    .unwrap(),
            );
            let extended = backend
                .extend(&lease.lock_id, Duration::from_secs(30))
                .await
                .unwrap();
            assert!(extended.expires_at_ms().is_some());
            assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
        }
    })
    .await;
}

async fn backend_in(project: &str, config: FirestoreConfig) -> FirestoreBackend {
    warm_up_emulator().await;
    let backend = FirestoreBackend::builder(project)
        .config(config.clone())
        .build()
        .await
        .expect("connect to the Firestore emulator");
    assert_eq!(backend.config(), &config);
    // Opens the connection now rather than in the first timed operation.
    assert!(!backend.is_locked("connection:warm-up").await.unwrap());
    backend
}

async fn backend() -> FirestoreBackend {
    backend_in(&project(), FirestoreConfig::new()).await
}

/// A stored document's fields as JSON.
async fn read_doc(db: &FirestoreDb, collection: &str, id: &str) -> Option<HashMap<String, Value>> {
    db.fluent()
        .select()
        .by_id_in(collection)
        .obj::<HashMap<String, Value>>()
        .one(id)
        .await
        .expect("read a document")
}

async fn write_doc(db: &FirestoreDb, collection: &str, id: &str, fields: &Value) {
    let _: Value = db
        .fluent()
        .update()
        .in_col(collection)
        .document_id(id)
        .object(fields)
        .execute()
        .await
        .expect("write a document");
}

fn lease(outcome: AcquireOutcome) -> Lease {
    outcome.lease().expect("acquired")
}

mod conformance_suite {
    syncguard::conformance_tests!(super::backend());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_acquires_give_exactly_one_holder() {
    let backend = backend().await;
    for round in 0..6 {
        let key = conformance::unique_key(&format!("race{round}"));
        let barrier = Arc::new(Barrier::new(32));
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let (backend, key, barrier) = (backend.clone(), key.clone(), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    backend.acquire(&key, Duration::from_secs(30)).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for task in tasks {
            let outcome = task.await.unwrap().expect("acquire answered");
            if let Some(lease) = outcome.lease() {
                winners.push(lease);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one holder");
        let info = syncguard::get_by_key_raw(&backend, &key)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            info.lock_id, winners[0].lock_id,
            "the stored lock is the winner's"
        );
        assert_eq!(winners[0].fence.get(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn documents_have_the_reference_layout() {
    let project = project();
    let backend = backend_in(&project, FirestoreConfig::new()).await;
    let db = client(&project).await;
    let key = conformance::unique_key("layout");
    let lease = lease(
        backend
            .acquire(&key, Duration::from_secs(30))
            .await
            .unwrap(),
    );
    let doc_id = make_storage_key("", &key, 1500, 0).unwrap();
    let fence_id = make_fence_key("", &doc_id, 1500, 0).unwrap();

    let lock = read_doc(&db, "locks", &doc_id)
        .await
        .expect("lock document");
    assert_eq!(lock["lockId"], lease.lock_id.as_str());
    assert_eq!(lock["key"], key.as_str());
    assert_eq!(lock["fence"], "000000000000001");
    assert_eq!(lock["expiresAtMs"].as_u64(), Some(lease.expires_at_ms));
    let acquired = lock["acquiredAtMs"]
        .as_u64()
        .expect("acquiredAtMs is an integer");
    assert!(acquired + 30_000 == lease.expires_at_ms);

    let fence = read_doc(&db, "fence_counters", &fence_id)
        .await
        .expect("fence document");
    assert_eq!(fence["fence"], "000000000000001");
    assert_eq!(fence["keyDebug"], key.as_str());

    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    assert!(
        read_doc(&db, "locks", &doc_id).await.is_none(),
        "lock document deleted"
    );
    let fence = read_doc(&db, "fence_counters", &fence_id).await;
    assert_eq!(
        fence.expect("fence document kept")["fence"],
        "000000000000001"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fences_persist_across_a_new_client() {
    let project = project();
    let key = conformance::unique_key("persist");
    let mut last = 0;
    for _ in 0..3 {
        // A new client and backend each time, as after a restart.
        let backend = backend_in(&project, FirestoreConfig::new()).await;
        let lease = lease(
            backend
                .acquire(&key, Duration::from_secs(30))
                .await
                .unwrap(),
        );
        assert_eq!(lease.fence.get(), last + 1);
        last = lease.fence.get();
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fence_arithmetic_is_exact_up_to_the_maximum() {
    let project = project();
    let backend = backend_in(&project, FirestoreConfig::new()).await;
    let db = client(&project).await;
    let key = conformance::unique_key("bigfence");
    let fence_id =
        make_fence_key("", &make_storage_key("", &key, 1500, 0).unwrap(), 1500, 0).unwrap();
    // Near the maximum, every digit counts (a double would still be exact here, but the
    // counter never goes through one).
    write_doc(
        &db,
        "fence_counters",
        &fence_id,
        &serde_json::json!({ "fence": "899999999999998" }),
    )
    .await;
    let lease = lease(
        backend
            .acquire(&key, Duration::from_secs(30))
            .await
            .unwrap(),
    );
    assert_eq!(lease.fence.get(), 899_999_999_999_999);
    assert_eq!(lease.fence.to_string(), "899999999999999");
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    let stored = read_doc(&db, "fence_counters", &fence_id).await.unwrap();
    assert_eq!(stored["fence"], "899999999999999");

    // 2^53 + 1, past what a double holds and past the maximum: refused, nothing written.
    write_doc(
        &db,
        "fence_counters",
        &fence_id,
        &serde_json::json!({ "fence": "9007199254740993" }),
    )
    .await;
    let error = backend
        .acquire(&key, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Internal, "{error}");
    assert!(!backend.is_locked(&key).await.unwrap(), "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_lock_ids_are_detected_and_never_acted_on_while_live() {
    let project = project();
    let backend = backend_in(&project, FirestoreConfig::new()).await;
    let db = client(&project).await;
    let key = conformance::unique_key("dup");
    let lease = lease(
        backend
            .acquire(&key, Duration::from_secs(30))
            .await
            .unwrap(),
    );
    let doc_id = make_storage_key("", &key, 1500, 0).unwrap();
    let original = read_doc(&db, "locks", &doc_id).await.unwrap();

    // A live copy under another document id: ambiguous, so nothing is released or extended.
    let copy = serde_json::to_value(&original).unwrap();
    write_doc(&db, "locks", "copied-by-hand", &copy).await;
    assert_eq!(
        backend.release(&lease.lock_id).await.unwrap(),
        ReleaseOutcome::NotHeld(None)
    );
    assert!(
        backend
            .extend(&lease.lock_id, Duration::from_secs(60))
            .await
            .unwrap()
            .expires_at_ms()
            .is_none()
    );
    assert!(
        syncguard::get_by_id(&backend, &lease.lock_id)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        read_doc(&db, "locks", &doc_id).await.unwrap(),
        original,
        "untouched"
    );
    assert!(read_doc(&db, "locks", "copied-by-hand").await.is_some());

    // Once the copy has expired, the one live document is the lock.
    let mut expired = copy.clone();
    expired["expiresAtMs"] = Value::from(1_u64);
    write_doc(&db, "locks", "copied-by-hand", &expired).await;
    assert!(syncguard::owns(&backend, &lease.lock_id).await.unwrap());
    assert!(
        backend
            .extend(&lease.lock_id, Duration::from_secs(60))
            .await
            .unwrap()
            .expires_at_ms()
            .is_some()
    );
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    assert!(read_doc(&db, "locks", &doc_id).await.is_none());
    assert!(!backend.is_locked(&key).await.unwrap());
}

/// `tasks` acquires of one fresh key at once, each through its own client and backend (as from
/// separate processes); returns the winners' count and the errors.
async fn race_separate_clients(
    project: &str,
    config: &FirestoreConfig,
    tasks: usize,
    label: &str,
) -> (usize, Vec<syncguard::LockError>) {
    let mut backends = Vec::new();
    for _ in 0..tasks {
        backends.push(backend_in(project, config.clone()).await);
    }
    let key = conformance::unique_key(label);
    let barrier = Arc::new(Barrier::new(tasks));
    let handles: Vec<_> = backends
        .into_iter()
        .map(|backend| {
            let (key, barrier) = (key.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                let began = std::time::Instant::now();
                let outcome = backend.acquire(&key, Duration::from_secs(30)).await;
                if std::env::var_os("SYNCGUARD_TEST_TRACE").is_some() {
                    eprintln!(
                        "{:?} {:?}",
                        began.elapsed(),
                        outcome.as_ref().map(|o| o.is_contended())
                    );
                }
                outcome
            })
        })
        .collect();
    let (mut winners, mut errors) = (0, Vec::new());
    for handle in handles {
        match handle.await.unwrap() {
            Ok(outcome) => winners += usize::from(outcome.lease().is_some()),
            Err(error) => errors.push(error),
        }
    }
    (winners, errors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_clients_racing_give_exactly_one_holder() {
    // Separate clients do not share the in-process turn-taking: Firestore's commits alone
    // decide, and the losers retry, then see the winner's lock.
    let project = project();
    for round in 0..5 {
        let (winners, errors) = race_separate_clients(
            &project,
            &FirestoreConfig::new(),
            32,
            &format!("clients{round}"),
        )
        .await;
        assert!(winners <= 1, "round {round}: {winners} holders at once");
        assert!(errors.is_empty(), "round {round}: {errors:?}");
        assert_eq!(winners, 1, "round {round}: exactly one holder");
        eprintln!("round {round}: {winners} holder, {} gave up", errors.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transaction_aborts_map_to_service_unavailable() {
    // Without retries, a commit that lost the race (precondition failed, or Firestore aborted
    // the transaction) must come out as a retryable ServiceUnavailable, and never break mutual
    // exclusion.
    let config = FirestoreConfig::new().with_max_transaction_retries(0);
    let project = project();
    // Whether racing commits overlap depends on timing: on a loaded machine the emulator may
    // serve a whole round one client after another (the losers then see the lock, with no
    // conflict). Race again, on a fresh key, until one round has conflicts; each round must
    // keep the guarantees.
    let mut failed = 0;
    for round in 0..10 {
        let (winners, errors) =
            race_separate_clients(&project, &config, 8, &format!("abort{round}")).await;
        assert!(winners <= 1, "round {round}: {winners} holders at once");
        for error in &errors {
            assert_eq!(error.code(), ErrorCode::ServiceUnavailable, "{error}");
            assert!(error.is_retryable());
        }
        failed += errors.len();
        if failed > 0 {
            break;
        }
    }
    assert!(failed > 0, "10 rounds of 8 racing commits never conflicted");
}

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
        let error = FirestoreBackend::builder(&project)
            .config(config)
            .build()
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
    }
    let error = FirestoreBackend::connect("").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expiry_written_as_a_double_is_read() {
    // A JavaScript client may store whole numbers as doubles.
    let project = project();
    let backend = backend_in(&project, FirestoreConfig::new()).await;
    let db = client(&project).await;
    let key = conformance::unique_key("double");
    let lock_id = LockId::generate();
    let now = syncguard::time::now_ms();
    write_doc(
        &db,
        "locks",
        &make_storage_key("", &key, 1500, 0).unwrap(),
        &serde_json::json!({
            "lockId": lock_id.as_str(),
            "expiresAtMs": (now + 30_000) as f64 + 0.0,
            "acquiredAtMs": now as f64,
            "key": key,
            "fence": "000000000000007",
        }),
    )
    .await;
    let info = syncguard::get_by_id_raw(&backend, &lock_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.info.fence.get(), 7);
    assert_eq!(info.info.expires_at_ms, now + 30_000);
    assert!(
        backend
            .acquire(&key, Duration::from_secs(1))
            .await
            .unwrap()
            .is_contended()
    );
    assert!(backend.release(&lock_id).await.unwrap().is_released());
}

/// A client whose emulator is a closed port: the builder reports a retryable connection
/// failure in our words, and the driver's text ("Connection refused (os error 111)" on
/// Linux) appears once when the chain is walked. The `firestore` crate reads the emulator's
/// address from `FIRESTORE_EMULATOR_HOST` only, so the check runs in a child process of this
/// test binary with a variable of its own, leaving the other tests' environment alone.
#[tokio::test]
async fn a_refused_connection_is_unavailable_and_printed_once() {
    const TEST: &str = "a_refused_connection_is_unavailable_and_printed_once";
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

/// Holders (`acquire_as`, `extend_by`) as Firestore stores them, beside the conformance checks.
mod holders {
    use std::sync::Mutex;
    use std::time::Instant;

    use syncguard::Fence;
    use syncguard::backend::ExtendOutcome;
    use syncguard::time::{TIME_TOLERANCE_MS, now_ms};
    use tokio::sync::RwLock;
    use tokio::time::sleep;

    use super::*;

    /// The lock document of `key` in the default collection.
    async fn lock_doc(db: &FirestoreDb, key: &str) -> Option<HashMap<String, Value>> {
        read_doc(db, "locks", &make_storage_key("", key, 1500, 0).unwrap()).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_document_has_a_holder_only_when_one_is_given() {
        let project = project();
        let backend = backend_in(&project, FirestoreConfig::new()).await;
        let db = client(&project).await;
        let key = conformance::unique_key("holder-field");
        let fence_id =
            make_fence_key("", &make_storage_key("", &key, 1500, 0).unwrap(), 1500, 0).unwrap();

        // Without a holder: no field at all (not null).
        let plain = lease(
            backend
                .acquire(&key, Duration::from_secs(30))
                .await
                .unwrap(),
        );
        let doc = lock_doc(&db, &key).await.expect("lock document");
        assert!(!doc.contains_key("holder"), "{doc:?}");
        assert!(backend.release(&plain.lock_id).await.unwrap().is_released());

        // With one: stored as given, kept by a re-entry and by extend_by.
        let first = lease(
            backend
                .acquire_as(&key, Duration::from_secs(30), "client-a")
                .await
                .unwrap(),
        );
        let doc = lock_doc(&db, &key).await.expect("lock document");
        assert_eq!(doc["holder"], "client-a");
        assert_eq!(doc["lockId"], first.lock_id.as_str());
        assert_eq!(doc["fence"], "000000000000002");
        sleep(Duration::from_millis(20)).await;
        let again = lease(
            backend
                .acquire_as(&key, Duration::from_secs(60), "client-a")
                .await
                .unwrap(),
        );
        assert_eq!(again.lock_id, first.lock_id);
        assert_eq!(again.fence, first.fence);
        let doc = lock_doc(&db, &key).await.expect("lock document");
        assert_eq!(doc["holder"], "client-a");
        assert_eq!(doc["lockId"], first.lock_id.as_str());
        assert_eq!(doc["fence"], "000000000000002");
        assert_eq!(doc["expiresAtMs"].as_u64(), Some(again.expires_at_ms));
        assert_eq!(
            doc["acquiredAtMs"].as_u64().map(|at| at + 60_000),
            Some(again.expires_at_ms),
            "the acquisition time restarts"
        );
        let counter = read_doc(&db, "fence_counters", &fence_id).await.unwrap();
        assert_eq!(
            counter["fence"], "000000000000002",
            "a re-entry takes no fence"
        );

        let extended = backend
            .extend_by(&first.lock_id, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(extended.expires_at_ms(), Some(again.expires_at_ms + 10_000));
        let doc = lock_doc(&db, &key).await.expect("lock document");
        assert_eq!(
            doc["expiresAtMs"].as_u64(),
            Some(again.expires_at_ms + 10_000)
        );
        assert_eq!(doc["holder"], "client-a");
        let raw = syncguard::get_by_id_raw(&backend, &first.lock_id)
            .await
            .unwrap()
            .expect("held");
        assert_eq!(raw.holder.as_deref(), Some("client-a"));
        assert!(backend.release(&first.lock_id).await.unwrap().is_released());
        assert!(lock_doc(&db, &key).await.is_none());

        // An expired holder's lock, taken by a plain acquire: the holder goes with it.
        let short = lease(
            backend
                .acquire_as(&key, Duration::from_millis(50), "client-a")
                .await
                .unwrap(),
        );
        sleep(Duration::from_millis(50 + TIME_TOLERANCE_MS + 300)).await;
        let next = lease(
            backend
                .acquire(&key, Duration::from_secs(30))
                .await
                .unwrap(),
        );
        assert_ne!(next.lock_id, short.lock_id);
        assert!(next.fence > short.fence);
        let doc = lock_doc(&db, &key).await.expect("lock document");
        assert!(!doc.contains_key("holder"), "{doc:?}");
        assert!(
            backend
                .acquire_as(&key, Duration::from_secs(30), "client-a")
                .await
                .unwrap()
                .is_contended(),
            "the former holder does not re-enter a lock taken without holder"
        );
        assert!(backend.release(&next.lock_id).await.unwrap().is_released());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_reference_document_is_never_reentered() {
        let project = project();
        let backend = backend_in(&project, FirestoreConfig::new()).await;
        let db = client(&project).await;
        let key = conformance::unique_key("reference-holder");
        let doc_id = make_storage_key("", &key, 1500, 0).unwrap();
        let fence_id = make_fence_key("", &doc_id, 1500, 0).unwrap();
        let lock_id = LockId::generate();
        let now = now_ms();
        // As the TypeScript reference writes them: no holder field.
        write_doc(
            &db,
            "fence_counters",
            &fence_id,
            &serde_json::json!({ "fence": "000000000000007", "keyDebug": key }),
        )
        .await;
        write_doc(
            &db,
            "locks",
            &doc_id,
            &serde_json::json!({
                "lockId": lock_id.as_str(),
                "expiresAtMs": now + 30_000,
                "acquiredAtMs": now,
                "key": key,
                "fence": "000000000000007",
            }),
        )
        .await;
        let before = lock_doc(&db, &key).await.expect("lock document");

        for holder in ["client-a", "anyone", "null", " "] {
            let outcome = backend
                .acquire_as(&key, Duration::from_secs(30), holder)
                .await
                .unwrap();
            assert!(outcome.is_contended(), "{holder:?} re-entered: {outcome:?}");
        }
        assert_eq!(
            lock_doc(&db, &key).await.as_ref(),
            Some(&before),
            "unchanged"
        );
        let raw = syncguard::get_by_key_raw(&backend, &key)
            .await
            .unwrap()
            .expect("held");
        assert_eq!(raw.lock_id, lock_id);
        assert_eq!(raw.holder, None);

        // extend_by works on it, and writes no holder.
        let extended = backend
            .extend_by(&lock_id, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(extended.expires_at_ms(), Some(now + 35_000));
        let doc = lock_doc(&db, &key).await.expect("lock document");
        assert!(!doc.contains_key("holder"), "{doc:?}");
        assert_eq!(doc["expiresAtMs"].as_u64(), Some(now + 35_000));

        // Once expired, it is taken (not re-entered): a new lock id, the next fence.
        write_doc(
            &db,
            "locks",
            &doc_id,
            &serde_json::json!({
                "lockId": lock_id.as_str(),
                "expiresAtMs": now - 5_000,
                "acquiredAtMs": now - 35_000,
                "key": key,
                "fence": "000000000000007",
            }),
        )
        .await;
        let taken = lease(
            backend
                .acquire_as(&key, Duration::from_secs(30), "client-a")
                .await
                .unwrap(),
        );
        assert_ne!(taken.lock_id, lock_id);
        assert_eq!(taken.fence.get(), 8);
        let doc = lock_doc(&db, &key).await.expect("lock document");
        assert_eq!(doc["holder"], "client-a");
        assert!(matches!(
            backend
                .extend_by(&lock_id, Duration::from_secs(5))
                .await
                .unwrap(),
            ExtendOutcome::NotHeld(_)
        ));
        assert!(backend.release(&taken.lock_id).await.unwrap().is_released());
    }

    const HOLDERS: usize = 4;
    const TASKS: usize = 8;

    /// What the tasks saw: who holds the key now (the unit of holding is the holder, whose
    /// tasks share its lock), and since when.
    #[derive(Default)]
    struct Seen {
        owner: Option<usize>,
        session: Option<(LockId, Fence, Instant)>,
        inside: [usize; HOLDERS],
        last_fence: u64,
        sessions: usize,
        reentries: usize,
        extends: usize,
    }

    /// One task of `holder`: enter (acquire_as), hold briefly, leave; the holder's last task
    /// to leave releases. A holder's enters and its release take turns (`turns`), so that a
    /// release never takes the lock from a task that has just re-entered it.
    async fn run_task(
        backend: FirestoreBackend,
        key: String,
        holder: usize,
        task: usize,
        seen: Arc<Mutex<Seen>>,
        turns: Arc<[RwLock<()>; HOLDERS]>,
        until: Instant,
    ) {
        let name = format!("holder-{holder}");
        let ttl = Duration::from_secs(15);
        let mut round = 0;
        while Instant::now() < until {
            round += 1;
            // A session that has lasted a while lets the others in.
            let long_session = {
                let seen = seen.lock().unwrap();
                seen.owner == Some(holder)
                    && seen.session.as_ref().unwrap().2.elapsed() > Duration::from_millis(300)
            };
            if long_session {
                sleep(Duration::from_millis(20)).await;
                continue;
            }
            let turn = turns[holder].read().await;
            let outcome = backend
                .acquire_as(&key, ttl, &name)
                .await
                .unwrap_or_else(|error| panic!("{name} task {task}: {error}"));
            let Some(lease) = outcome.lease() else {
                drop(turn);
                sleep(Duration::from_millis(10 + (task as u64 * 3) % 20)).await;
                continue;
            };
            {
                let mut seen = seen.lock().unwrap();
                match seen.owner {
                    Some(owner) => {
                        assert_eq!(
                            owner, holder,
                            "holder-{owner} and {name} hold the key at once"
                        );
                        let (id, fence, _) = seen.session.as_ref().unwrap();
                        assert_eq!(&lease.lock_id, id, "a re-entry keeps the lock id");
                        assert_eq!(lease.fence, *fence, "a re-entry keeps the fence");
                        seen.reentries += 1;
                    }
                    None => {
                        assert!(
                            lease.fence.get() > seen.last_fence,
                            "fences increase across holders: {} after {}",
                            lease.fence,
                            seen.last_fence
                        );
                        seen.last_fence = lease.fence.get();
                        seen.owner = Some(holder);
                        seen.session = Some((lease.lock_id.clone(), lease.fence, Instant::now()));
                        seen.sessions += 1;
                    }
                }
                seen.inside[holder] += 1;
            }
            drop(turn);

            sleep(Duration::from_millis(5 + ((task + round) as u64 * 7) % 25)).await;
            if round % 3 == 0 {
                let extended = backend
                    .extend_by(&lease.lock_id, Duration::from_secs(1))
                    .await
                    .unwrap_or_else(|error| panic!("{name} task {task}: {error}"));
                assert!(
                    matches!(extended, ExtendOutcome::Extended { .. }),
                    "{name} holds the lock it extends: {extended:?}"
                );
                seen.lock().unwrap().extends += 1;
            }

            {
                let mut seen = seen.lock().unwrap();
                seen.inside[holder] -= 1;
                if seen.inside[holder] > 0 {
                    continue;
                }
            }
            let _turn = turns[holder].write().await;
            let session = {
                let mut seen = seen.lock().unwrap();
                if seen.inside[holder] > 0 || seen.owner != Some(holder) {
                    continue; // re-entered meanwhile, or released by another task
                }
                seen.owner = None;
                seen.session.take().unwrap()
            };
            let released = backend
                .release(&session.0)
                .await
                .unwrap_or_else(|error| panic!("{name} task {task}: {error}"));
            assert!(
                matches!(released, ReleaseOutcome::Released),
                "{name} releases the lock it holds: {released:?}"
            );
            sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn holders_never_hold_one_key_together() {
        // Each holder on a client of its own (as in separate server processes), its 8 tasks
        // sharing it: re-entries within a holder, commits conflicting across holders.
        let project = project();
        let mut backends = Vec::new();
        for _ in 0..HOLDERS {
            backends.push(backend_in(&project, FirestoreConfig::new()).await);
        }
        let key = conformance::unique_key("holders-race");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let turns: Arc<[RwLock<()>; HOLDERS]> = Arc::new(std::array::from_fn(|_| RwLock::new(())));
        let until = Instant::now() + Duration::from_secs(3);
        let mut handles = Vec::new();
        for (holder, backend) in backends.iter().enumerate() {
            for task in 0..TASKS {
                handles.push(tokio::spawn(run_task(
                    backend.clone(),
                    key.clone(),
                    holder,
                    task,
                    Arc::clone(&seen),
                    Arc::clone(&turns),
                    until,
                )));
            }
        }
        for handle in handles {
            handle.await.expect("a task failed");
        }
        {
            let seen = seen.lock().unwrap();
            eprintln!(
                "{} sessions, {} re-entries, {} extends, last fence {}",
                seen.sessions, seen.reentries, seen.extends, seen.last_fence
            );
            assert!(seen.sessions >= 2, "the key changed hands");
            assert!(seen.reentries >= 1, "holders re-entered");
            assert_eq!(seen.owner, None, "every session was released");
        }
        assert!(!backends[0].is_locked(&key).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_takes_no_step_past_its_lease() {
    warm_up_emulator().await;
    let project = project();
    let make = move || {
        let project = project.clone();
        async move { backend_in(&project, FirestoreConfig::new()).await }
    };
    frozen::a_frozen_holder_takes_no_step_past_its_lease(make, "frozen:holder").await;
}
