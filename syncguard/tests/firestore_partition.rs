//! The Firestore backend cut off by a partition (a TCP proxy of the test's own between the
//! client and the Cloud Firestore emulator): a `min_hold` release held up in it keeps nothing
//! past the end of the minimum hold, and an operation held up in it returns within the
//! operation timeout, an acquire among them letting go of the lock it may have taken. The
//! cut-off client is given the proxy as its API URL; the emulator's variable
//! (`FIRESTORE_EMULATOR_HOST`) still tells it to send no credentials.

#[path = "support/proxy.rs"]
mod proxy;
use proxy::Proxy;

#[path = "support/min_hold_partition.rs"]
mod min_hold_partition;

use std::time::{Duration, Instant};

use firestore::{FirestoreDb, FirestoreDbOptions};
use syncguard::backend::{AcquireOutcome, LockBackend};
use syncguard::firestore::{FirestoreBackend, FirestoreConfig};
use syncguard::{ErrorCode, LockId};

const EMULATOR: &str = "FIRESTORE_EMULATOR_HOST";

/// A backend on the emulator, or (`through`) on a proxy of it.
async fn backend_in(project: &str, through: Option<&Proxy>) -> FirestoreBackend {
    configured_backend_in(project, through, FirestoreConfig::new()).await
}

/// [`backend_in`] with `config`.
async fn configured_backend_in(
    project: &str,
    through: Option<&Proxy>,
    config: FirestoreConfig,
) -> FirestoreBackend {
    let mut options = FirestoreDbOptions::new(project.to_owned());
    if let Some(proxy) = through {
        options = options.with_firebase_api_url(format!("http://{}", proxy.addr()));
    }
    let db = FirestoreDb::with_options(options)
        .await
        .expect("a client of the Firestore emulator");
    FirestoreBackend::new(db, config).expect("valid config")
}

/// The emulator's `host:port`.
fn emulator() -> String {
    std::env::var(EMULATOR).unwrap_or_else(|_| {
        panic!(
            "{EMULATOR} is not set: run the tests through `bash scripts/test-all.sh` or \
             `bash scripts/with-services.sh cargo test ...`, which start the Cloud Firestore \
             emulator (Google Cloud SDK component cloud-firestore-emulator, needs java)"
        )
    })
}

/// A project of the test's own.
fn project() -> String {
    format!(
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
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_min_hold_release_landing_late_keeps_nothing_past_min_hold() {
    let project = project();
    let direct = backend_in(&project, None).await;
    let proxy = Proxy::start(&emulator()).await;
    let cut_off = backend_in(&project, Some(&proxy)).await;
    let key = format!("partition:{}", LockId::generate());
    // Opens the cut-off client's connection before the partition.
    assert!(!cut_off.is_locked(&key).await.unwrap());
    // The test gives up on the release itself (before the operation timeout), and its guard
    // lets go in the background, through the partition, landing when it heals.
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

/// An acquire held up by a partition returns within the operation timeout (before, Firestore
/// calls waited as long as the network held them), and the lock it may have taken, its commit
/// landing when the partition heals, is released by its lock id instead of staying held for
/// its ttl. The partition starts at points spread over an acquire's round trips, so that some
/// trials cut the commit itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_held_up_returns_within_the_operation_timeout_and_lets_go() {
    const TRIALS: u32 = 8;
    let project = project();
    // A freshly started emulator (a JVM) takes seconds over its first operations.
    let patient = FirestoreConfig::new().with_operation_timeout(Duration::from_secs(60));
    let direct = configured_backend_in(&project, None, patient).await;
    let ttl = Duration::from_secs(120);
    for round in 0..20 {
        let warm = format!("in-doubt:warm-up:{round}:{}", LockId::generate());
        let lease = direct.acquire(&warm, ttl).await.unwrap().lease().unwrap();
        assert!(direct.release(&lease.lock_id).await.unwrap().is_released());
    }
    let proxy = Proxy::start(&emulator()).await;
    let timeout = Duration::from_secs(1);
    let config = FirestoreConfig::new().with_operation_timeout(timeout);
    let cut_off = configured_backend_in(&project, Some(&proxy), config).await;
    // Opens the cut-off client's connection, and measures an acquire's time through the proxy.
    let warm = format!("in-doubt:warm:{}", LockId::generate());
    let opened = Instant::now() + Duration::from_secs(30);
    while cut_off.is_locked(&warm).await.is_err() {
        assert!(Instant::now() < opened, "no connection through the proxy");
    }
    let started = Instant::now();
    let lease = cut_off.acquire(&warm, ttl).await.unwrap().lease().unwrap();
    let typical = started.elapsed();
    assert!(cut_off.release(&lease.lock_id).await.unwrap().is_released());

    let mut landed = 0;
    for trial in 0..TRIALS {
        let key = format!("in-doubt:{trial}:{}", LockId::generate());
        let delay = typical * trial / TRIALS;
        let started = Instant::now();
        let (outcome, ()) = tokio::join!(
            tokio::time::timeout(Duration::from_secs(10), cut_off.acquire(&key, ttl)),
            async {
                tokio::time::sleep(delay).await;
                proxy.stall();
            }
        );
        let took = started.elapsed();
        let outcome = outcome.expect("the acquire returned within its operation timeout, not 10 s");
        assert!(
            took < timeout + Duration::from_secs(2),
            "trial {trial}: took {took:?}"
        );
        proxy.resume();
        match outcome {
            // The partition came after the answer.
            Ok(AcquireOutcome::Acquired(lease)) => {
                assert!(cut_off.release(&lease.lock_id).await.unwrap().is_released());
                continue;
            }
            Ok(other) => panic!("trial {trial}: {other:?} on a fresh key"),
            Err(error) => assert_eq!(error.code(), ErrorCode::NetworkTimeout, "{error}"),
        }
        // Healed: a commit held up lands now, and the release in doubt lets it go.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = false;
        while direct.is_locked(&key).await.unwrap() {
            seen = true;
            assert!(
                Instant::now() < deadline,
                "trial {trial}: the lock of an acquire in doubt is still held"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        landed += u32::from(seen);
    }
    println!(
        "acquires whose commit landed after their timeout, then released: {landed} of {TRIALS} \
         (an acquire takes {typical:?} through the proxy)"
    );
}
