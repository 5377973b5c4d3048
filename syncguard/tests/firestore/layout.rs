//! The documents as the reference stores them: their fields, fences that persist and stay
//! exact up to the maximum, duplicate lock ids, expiries written as doubles.

use std::time::Duration;

use serde_json::Value;
use syncguard::backend::key::{make_fence_key, make_storage_key};
use syncguard::backend::{LockBackend, ReleaseOutcome};
use syncguard::firestore::FirestoreConfig;
use syncguard::{ErrorCode, LockId, conformance};

use crate::{backend_in, client, lease, project, read_doc, write_doc};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expiry_written_as_a_double_is_read() {
    // A JavaScript client may store whole numbers as doubles.
    let project = project();
    let backend = backend_in(&project, FirestoreConfig::new()).await;
    let db = client(&project).await;
    let key = conformance::unique_key("double");
    let lock_id = LockId::generate();
    let now = syncguard::backend::time::now_ms();
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
    let info = syncguard::get_by_id(&backend, &lock_id)
        .await
        .unwrap()
        .map(syncguard::LockInfo::reveal)
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
