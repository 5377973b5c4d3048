//! The Firestore backend against the Cloud Firestore emulator (started by
//! `bash scripts/test-all.sh` or `bash scripts/with-services.sh`, which export
//! `FIRESTORE_EMULATOR_HOST` and `SYNCGUARD_TEST_FIRESTORE_PROJECT`), one concern per module:
//! the conformance suite and racing clients ([`conformance`]), the documents' layout
//! ([`layout`]), what is refused ([`input`]), and holders ([`holders`]).
//!
//! Every backend gets a project id of its own: the emulator keeps projects apart, so tests
//! never see each other's documents.

#[path = "../support/frozen.rs"]
mod frozen;

mod conformance;
mod holders;
mod input;
mod layout;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use firestore::FirestoreDb;
use serde_json::Value;
use syncguard::LockId;
use syncguard::backend::{AcquireOutcome, Lease, LockBackend};
use syncguard::firestore::{FirestoreBackend, FirestoreConfig};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A project id no other test (or run) uses.
pub(crate) fn project() -> String {
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

pub(crate) async fn client(project: &str) -> FirestoreDb {
    FirestoreDb::new(project)
        .await
        .expect("connect to the Firestore emulator")
}

/// Runs a few lock cycles once per test process, so that the timing-sensitive checks do not
/// measure a freshly started emulator's JVM warming up (its first operations take seconds).
pub(crate) async fn warm_up_emulator() {
    static WARM: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    WARM.get_or_init(|| async {
        // A cold emulator may take longer than the default operation timeout.
        let patient = FirestoreConfig::new().with_operation_timeout(Duration::from_secs(60));
        let backend = FirestoreBackend::connect_with(&project(), patient)
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

pub(crate) async fn backend_in(project: &str, config: FirestoreConfig) -> FirestoreBackend {
    warm_up_emulator().await;
    let backend = FirestoreBackend::connect_with(project, config.clone())
        .await
        .expect("connect to the Firestore emulator");
    assert_eq!(backend.config(), &config);
    // Opens the connection now rather than in the first timed operation.
    assert!(!backend.is_locked("connection:warm-up").await.unwrap());
    backend
}

pub(crate) async fn backend() -> FirestoreBackend {
    backend_in(&project(), FirestoreConfig::new()).await
}

/// A stored document's fields as JSON.
pub(crate) async fn read_doc(
    db: &FirestoreDb,
    collection: &str,
    id: &str,
) -> Option<HashMap<String, Value>> {
    db.fluent()
        .select()
        .by_id_in(collection)
        .obj::<HashMap<String, Value>>()
        .one(id)
        .await
        .expect("read a document")
}

pub(crate) async fn write_doc(db: &FirestoreDb, collection: &str, id: &str, fields: &Value) {
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

pub(crate) fn lease(outcome: AcquireOutcome) -> Lease {
    outcome.lease().expect("acquired")
}
