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

/// What only an acquire's commit request carries (a field of the lock document it writes):
/// the proxy holds the answers once it has forwarded it.
const ACQUIRE_COMMIT: &[u8] = b"acquiredAtMs";

/// An acquire held up by a partition returns within the operation timeout (before, Firestore
/// calls waited as long as the network held them), and the lock it may have taken, its commit
/// landing before or when the partition heals, is released by its lock id instead of staying
/// held for its ttl. The partition starts at points spread over an acquire's round trips, and,
/// in the last trials, the answers alone are held once the commit request was forwarded: that
/// commit lands while its answer is held, so that the acquire certainly took a lock it could
/// not report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_held_up_returns_within_the_operation_timeout_and_lets_go() {
    const SPREAD: u32 = 6;
    const AFTER_COMMIT: usize = 2;
    // On a loaded machine an acquire may time out before it sends its commit, or the emulator
    // drop the commit it cancelled; it is tried again, up to this many times in all.
    const AFTER_COMMIT_TRIES: u32 = 8;
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

    // Keys whose acquire timed out, and whether each was seen held (its commit landed).
    let mut in_doubt = Vec::new();
    let mut seen_held = Vec::new();
    let mut held_answers = 0;
    for trial in 0..SPREAD + AFTER_COMMIT_TRIES {
        if held_answers == AFTER_COMMIT {
            break;
        }
        let key = format!("in-doubt:{trial}:{}", LockId::generate());
        let after_commit = trial >= SPREAD;
        let delay = typical * trial / SPREAD;
        let started = Instant::now();
        let (outcome, ()) = tokio::join!(
            tokio::time::timeout(Duration::from_secs(10), cut_off.acquire(&key, ttl)),
            async {
                if after_commit {
                    proxy.hold_answers_after(ACQUIRE_COMMIT);
                } else {
                    tokio::time::sleep(delay).await;
                    proxy.stall();
                }
            }
        );
        let took = started.elapsed();
        let outcome = outcome.expect("the acquire returned within its operation timeout, not 10 s");
        assert!(
            took < timeout + Duration::from_secs(2),
            "trial {trial}: took {took:?}"
        );
        match outcome {
            // The partition came after the answer.
            Ok(AcquireOutcome::Acquired(lease)) if !after_commit => {
                proxy.resume();
                assert!(cut_off.release(&lease.lock_id).await.unwrap().is_released());
                continue;
            }
            Ok(other) => panic!("trial {trial}: {other:?}, though the answer was held"),
            Err(error) => assert_eq!(error.code(), ErrorCode::NetworkTimeout, "{error}"),
        }
        // Whether the commit was forwarded (and the answers held since).
        let after_commit = after_commit && proxy.cancel_hold_answers_after();
        let mut landed = false;
        if after_commit {
            // The answers still held: the commit was forwarded, and the lock is written though
            // its acquire reported a timeout; unless the emulator, slow to apply it, dropped it
            // when the client cancelled the call at its timeout. Then nothing was taken, and
            // the trial does not count: an acquire here gets the key's first fence, and keeps
            // the dropped commit from landing later.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if direct.is_locked(&key).await.unwrap() {
                    landed = true;
                    break;
                }
                if Instant::now() >= deadline {
                    let probe = direct.acquire(&key, ttl).await.unwrap().lease().unwrap();
                    assert_eq!(
                        probe.fence.get(),
                        1,
                        "trial {trial}: a lock was taken, and let go while its answers were held"
                    );
                    assert!(direct.release(&probe.lock_id).await.unwrap().is_released());
                    eprintln!(
                        "trial {trial}: the emulator dropped the commit of a timed-out acquire"
                    );
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if landed {
                held_answers += 1;
            }
        }
        proxy.resume();
        in_doubt.push(key);
        seen_held.push(landed);
    }

    // Healed: a commit held up lands now, and each release in doubt lets its lock go. They
    // are watched together, for as long as a release in doubt may still act (three releases
    // that find nothing, each up to the operation timeout, with as long a pause after each),
    // with a margin; the ttl is far longer.
    let window = timeout * 2 * 3 + Duration::from_secs(4);
    let until = Instant::now() + window;
    let mut held_now = vec![true; in_doubt.len()];
    while Instant::now() < until {
        for (index, key) in in_doubt.iter().enumerate() {
            held_now[index] = direct.is_locked(key).await.unwrap();
            seen_held[index] |= held_now[index];
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (key, held) in in_doubt.iter().zip(held_now) {
        assert!(
            !held,
            "{key}: the lock of an acquire in doubt is still held {window:?} after the \
             partition healed (its ttl is {ttl:?})"
        );
    }
    assert_eq!(
        held_answers, AFTER_COMMIT,
        "too few acquires had their commit land though it timed out ({timeout:?})"
    );
    let landed = seen_held.iter().filter(|seen| **seen).count();
    println!(
        "acquires in doubt whose lock was seen held after their timeout, then released: \
         {landed} of {} (an acquire takes {typical:?} through the proxy)",
        in_doubt.len()
    );
}

/// An acquire whose connection goes away after its commit request was sent gets a transport
/// error, not a refusal: the commit may have landed (here it did), so the acquire lets go of
/// its lock id in the background instead of leaving the lock held by nobody for its ttl.
/// Before, an HTTP/2 error code gRPC does not name (as a proxy in between may send), an
/// unknown gRPC code mapped to an internal error, was taken for "certainly not applied".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_commit_was_cut_off_lets_go_of_its_lock() {
    let project = project();
    let patient = FirestoreConfig::new().with_operation_timeout(Duration::from_secs(60));
    let direct = configured_backend_in(&project, None, patient.clone()).await;
    let proxy = Proxy::start(&emulator()).await;
    let cut_off = configured_backend_in(&project, Some(&proxy), patient).await;
    let key = format!("commit-gone:{}", LockId::generate());
    // Opens the cut-off client's connection before the commit is held.
    assert!(!cut_off.is_locked(&key).await.unwrap());
    let ttl = Duration::from_secs(120);
    proxy.hold_answers_after(ACQUIRE_COMMIT);
    let started = Instant::now();
    let (outcome, ()) = tokio::join!(cut_off.acquire(&key, ttl), async {
        // The commit lands, its answer held by the proxy; then the connection goes away, with
        // an error code HTTP/2 does not define.
        let landed = Instant::now() + Duration::from_secs(20);
        while !direct.is_locked(&key).await.unwrap() {
            assert!(Instant::now() < landed, "the commit never landed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        proxy.go_away(0xbad).await;
        proxy.resume();
    });
    let error = match outcome {
        Ok(outcome) => panic!("{outcome:?}, though the answer was never delivered"),
        Err(error) => error,
    };
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the GOAWAY, not the operation timeout, ended the acquire: {error}"
    );
    println!(
        "the acquire whose connection went away: {:?}: {error}",
        error.code()
    );
    // Released in the background well before the ttl.
    let deadline = Instant::now() + Duration::from_secs(15);
    while direct.is_locked(&key).await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "the lock of an acquire whose commit was cut off is still held ({error})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
