//! The Firestore backend cut off by a partition (a TCP proxy of the test's own between the
//! client and the Cloud Firestore emulator): a `min_hold` release held up in it keeps nothing
//! past the end of the minimum hold. The cut-off client is given the proxy as its API URL; the
//! emulator's variable (`FIRESTORE_EMULATOR_HOST`) still tells it to send no credentials.

#[path = "support/proxy.rs"]
mod proxy;
use proxy::Proxy;

#[path = "support/min_hold_partition.rs"]
mod min_hold_partition;

use std::time::Duration;

use firestore::{FirestoreDb, FirestoreDbOptions};
use syncguard::LockId;
use syncguard::backend::LockBackend;
use syncguard::firestore::{FirestoreBackend, FirestoreConfig};

const EMULATOR: &str = "FIRESTORE_EMULATOR_HOST";

/// A backend on the emulator, or (`through`) on a proxy of it.
async fn backend_in(project: &str, through: Option<&Proxy>) -> FirestoreBackend {
    let mut options = FirestoreDbOptions::new(project.to_owned());
    if let Some(proxy) = through {
        options = options.with_firebase_api_url(format!("http://{}", proxy.addr()));
    }
    let db = FirestoreDb::with_options(options)
        .await
        .expect("a client of the Firestore emulator");
    FirestoreBackend::new(db, FirestoreConfig::new()).expect("valid config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_min_hold_release_landing_late_keeps_nothing_past_min_hold() {
    let emulator = std::env::var(EMULATOR).unwrap_or_else(|_| {
        panic!(
            "{EMULATOR} is not set: run the tests through `bash scripts/test-all.sh` or \
             `bash scripts/with-services.sh cargo test ...`, which start the Cloud Firestore \
             emulator (Google Cloud SDK component cloud-firestore-emulator, needs java)"
        )
    });
    let project = format!(
        "{}-partition-{}",
        std::env::var("SYNCGUARD_TEST_FIRESTORE_PROJECT")
            .unwrap_or_else(|_| "syncguard-test".into()),
        LockId::generate()
            .as_str()
            .to_lowercase()
            .replace(['-', '_'], "")
            .chars()
            .take(8)
            .collect::<String>()
    );
    let direct = backend_in(&project, None).await;
    let proxy = Proxy::start(&emulator).await;
    let cut_off = backend_in(&project, Some(&proxy)).await;
    let key = format!("partition:{}", LockId::generate());
    // Opens the cut-off client's connection before the partition.
    assert!(!cut_off.is_locked(&key).await.unwrap());
    // Firestore calls wait as long as the network holds them (the backend sets no deadline):
    // the test gives up on the release itself, and its guard lets go in the background, through
    // the partition, landing when it heals.
    min_hold_partition::a_min_hold_release_landing_late_keeps_nothing_past_min_hold(
        cut_off,
        direct,
        &proxy,
        &key,
        Duration::from_millis(300),
        true,
    )
    .await;
}
