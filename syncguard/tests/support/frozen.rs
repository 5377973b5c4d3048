//! A holder whose whole runtime freezes (a GC pause, `SIGSTOP`, a thread blocked by mistake)
//! past its lease: when it wakes, its work must not take another step, whatever order the
//! runtime then runs its timers and tasks in. Run on every backend, each holder and successor
//! with a client of its own, as two processes would be.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use syncguard::backend::LockBackend;
use syncguard::{LockError, LockOptions, LostReason, RetryPolicy};

/// The holder's ttl: its lease runs out, tolerance included, about 2 s after it is taken.
const TTL: Duration = Duration::from_secs(1);
/// When, after the acquire, the holder's runtime freezes: before the first heartbeat.
const FREEZE_AFTER: Duration = Duration::from_millis(200);
/// How long it stays frozen: long past the lease and the successor's takeover.
const FREEZE_FOR: Duration = Duration::from_millis(3_500);
/// How often the work takes a step.
const STEP_EVERY: Duration = Duration::from_millis(10);

/// What the holder's thread saw.
struct Holder {
    outcome: Result<(), LockError>,
    fence: u64,
    steps: Vec<Instant>,
    frozen_until: Instant,
}

/// `make` builds a fresh client of the backend under test, on whichever runtime calls it.
pub async fn a_frozen_holder_takes_no_step_past_its_lease<M, F, B>(make: M, key: &str)
where
    M: Fn() -> F + Send + Clone + 'static,
    F: Future<Output = B>,
    B: LockBackend + Clone + 'static,
{
    let (acquired_tx, acquired_rx) = tokio::sync::oneshot::channel();
    let holder = std::thread::spawn({
        let make = make.clone();
        let key = key.to_owned();
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the holder");
            runtime.block_on(hold_and_freeze(make, key, acquired_tx))
        }
    });

    acquired_rx
        .await
        .expect("the holder acquired the lock (see its thread's panic)");
    let successor = make().await;
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .retry(RetryPolicy::wait_for(Duration::from_secs(60)))
        .build()
        .unwrap();
    let guard = syncguard::acquire(&successor, key, &options)
        .await
        .expect("the successor takes the lock once the frozen holder's lease ran out");
    let successor_from = Instant::now();
    let successor_fence = guard.fence().get();
    guard.release().await.expect("the successor releases");

    let holder = tokio::task::spawn_blocking(move || holder.join())
        .await
        .unwrap()
        .expect("the holder's thread panicked");
    match holder.outcome.as_ref().map_err(LockError::lost_reason) {
        Err(Some(reason)) => assert!(
            matches!(reason, LostReason::LeaseExpired | LostReason::NotHeld),
            "the frozen holder lost its lease, not {reason:?}"
        ),
        _ => panic!(
            "the frozen holder's work must end as lost, got {:?}",
            holder.outcome
        ),
    }
    assert!(
        successor_fence > holder.fence,
        "the successor's fence {successor_fence} must be above the holder's {}",
        holder.fence
    );
    assert!(!holder.steps.is_empty(), "the work ran before the freeze");
    let after_freeze = holder
        .steps
        .iter()
        .filter(|step| **step >= holder.frozen_until)
        .count();
    assert_eq!(
        after_freeze, 0,
        "the holder's work took {after_freeze} step(s) after its runtime woke, past its lease"
    );
    let after_successor = holder
        .steps
        .iter()
        .filter(|step| **step >= successor_from)
        .count();
    assert_eq!(
        after_successor, 0,
        "the holder's work took {after_successor} step(s) while its successor held the lock"
    );
}

/// On the holder's own runtime: takes the lock, works in steps, and freezes the runtime.
async fn hold_and_freeze<M, F, B>(
    make: M,
    key: String,
    acquired: tokio::sync::oneshot::Sender<()>,
) -> Holder
where
    M: Fn() -> F,
    F: Future<Output = B>,
    B: LockBackend + Clone + 'static,
{
    let backend = make().await;
    let options = LockOptions::builder().ttl(TTL).build().unwrap();
    let guard = syncguard::acquire(&backend, &key, &options)
        .await
        .expect("the holder acquires a free key");
    let fence = guard.fence().get();
    let steps = Arc::new(Mutex::new(Vec::new()));
    let frozen_until = Arc::new(Mutex::new(None));
    let freezer = tokio::spawn({
        let frozen_until = Arc::clone(&frozen_until);
        async move {
            tokio::time::sleep(FREEZE_AFTER).await;
            // Blocks the runtime's only thread: no timer, task or I/O of this runtime runs.
            std::thread::sleep(FREEZE_FOR);
            *frozen_until.lock().unwrap() = Some(Instant::now());
        }
    });
    acquired.send(()).unwrap();
    let work = {
        let steps = Arc::clone(&steps);
        async move {
            loop {
                steps.lock().unwrap().push(Instant::now());
                tokio::time::sleep(STEP_EVERY).await;
            }
        }
    };
    let outcome = guard.run(work).await;
    guard.release_in_background().await;
    freezer.await.unwrap();
    let steps = steps.lock().unwrap().clone();
    let frozen_until = frozen_until
        .lock()
        .unwrap()
        .expect("the freezer ran before the work ended");
    Holder {
        outcome,
        fence,
        steps,
        frozen_until,
    }
}
