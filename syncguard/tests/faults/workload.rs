//! The workload of one fault scenario: two backend instances with eight workers each contend
//! for one key, recording every hold, while the fault is injected and healed; then the
//! history is checked and the figures gathered. Shared by the fault suite and the Redis
//! Cluster's (`redis_cluster/faults.rs`), each of which uses part of it.

#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use syncguard::backend::LockBackend;
use syncguard::conformance::history::{History, Hold};
use syncguard::{LockOptions, RetryPolicy};
use tokio::time::{Instant, sleep, timeout};

use crate::timed::{CallTimes, Timed};

/// The ttl of every lock: short, so that faults outlast leases.
pub(crate) const TTL: Duration = Duration::from_secs(1);
const WORKERS_PER_INSTANCE: usize = 8;
/// Traffic before the fault, and after it healed.
const BEFORE: Duration = Duration::from_millis(1500);
const AFTER: Duration = Duration::from_secs(4);
/// How long a healed backend may take to serve a fresh acquire and release.
const RECOVERY_LIMIT: Duration = Duration::from_secs(10);

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts every panic of the process from now on (a worker's included), for [`report`];
/// called from the test's own thread. A panic on the thread of another test of the same
/// binary (a `should_panic` test) is that test's business, and not counted.
pub(crate) fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    let this_test = std::thread::current().name().map(str::to_owned);
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            // The test harness names each test's thread after the test (`module::test`).
            let another_test = thread
                .name()
                .is_some_and(|name| name.contains("::") && Some(name) != this_test.as_deref());
            if !another_test {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

/// Prints the figures of a suite's scenarios, and checks that every backend call returned
/// within `bound` and that nothing panicked.
pub(crate) fn report(figures: &[Figures], times: &CallTimes, bound: Duration) {
    for figures in figures {
        figures.print();
    }
    println!(
        "  {} backend calls; slowest by kind: {:?} (bound {bound:?})",
        times.calls(),
        times.worst()
    );
    assert!(
        times.slowest() <= bound,
        "a call took {:?}, past its timeouts ({bound:?}): {:?}",
        times.slowest(),
        times.worst()
    );
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked");
}

/// What one scenario measured.
pub(crate) struct Figures {
    pub(crate) name: &'static str,
    pub(crate) holds: usize,
    pub(crate) acting: usize,
    pub(crate) lost: usize,
    pub(crate) failed_acquires: usize,
    /// From the injection of the fault to each loss a holder noticed.
    pub(crate) loss_to_signal: Vec<Duration>,
    /// From the heal to the first successful acquire and release, per instance.
    pub(crate) recovery: Vec<Duration>,
}

impl Figures {
    pub(crate) fn print(&self) {
        let range = |values: &[Duration]| match (values.iter().min(), values.iter().max()) {
            (Some(min), Some(max)) => format!("{min:.0?} to {max:.0?}"),
            _ => "none".to_owned(),
        };
        println!(
            "{}: {} holds ({} acted), {} lost, {} failed acquires; loss noticed {} after the fault; recovered {} after the heal",
            self.name,
            self.holds,
            self.acting,
            self.lost,
            self.failed_acquires,
            range(&self.loss_to_signal),
            range(&self.recovery),
        );
    }
}

/// Runs the workload on `instances` while `fault` injects a fault, holds it and heals it.
pub(crate) async fn run<F: Future<Output = ()>>(
    name: &'static str,
    instances: &[Timed],
    fault: F,
) -> Figures {
    run_on_key(
        name,
        syncguard::conformance::unique_key(name),
        instances,
        fault,
    )
    .await
}

/// [`run`] on `key`, for a fault that must know it (where a cluster stores it, say).
pub(crate) async fn run_on_key<F: Future<Output = ()>>(
    name: &'static str,
    key: String,
    instances: &[Timed],
    fault: F,
) -> Figures {
    let history = Arc::new(History::new());
    let stop = Arc::new(AtomicBool::new(false));
    let losses = Arc::new(Mutex::new(Vec::new()));
    let failed = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for (instance, backend) in instances.iter().enumerate() {
        for worker in 0..WORKERS_PER_INSTANCE {
            let holder = format!("instance {instance}, worker {worker}");
            let worker = Worker {
                holder,
                backend: backend.clone(),
                key: key.clone(),
                history: Arc::clone(&history),
                stop: Arc::clone(&stop),
                losses: Arc::clone(&losses),
                failed: Arc::clone(&failed),
            };
            workers.push(tokio::spawn(worker.run()));
        }
    }
    sleep(BEFORE).await;
    let injected = Instant::now();
    fault.await;
    let healed = Instant::now();
    let mut recovery = Vec::new();
    for backend in instances {
        recovery.push(recovered(backend, name).await - healed);
    }
    sleep(AFTER).await;
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.expect("a worker panicked");
    }

    let checked = history
        .check()
        .unwrap_or_else(|violations| panic!("{name}: {violations}"));
    assert!(
        checked.acting >= 5,
        "{name}: only {} holds acted",
        checked.acting
    );
    let loss_to_signal = losses
        .lock()
        .unwrap()
        .iter()
        .filter(|at| **at >= injected)
        .map(|at| *at - injected)
        .collect();
    Figures {
        name,
        holds: checked.holds,
        acting: checked.acting,
        lost: checked.lost,
        failed_acquires: failed.load(Ordering::SeqCst),
        loss_to_signal,
        recovery,
    }
}

/// When `backend` first serves a fresh acquire and release after the heal.
async fn recovered(backend: &Timed, name: &str) -> Instant {
    let deadline = Instant::now() + RECOVERY_LIMIT;
    let key = syncguard::conformance::unique_key(&format!("{name}-recovery"));
    loop {
        let attempt = async {
            let lease = backend.acquire(&key, TTL).await?.lease();
            match lease {
                Some(lease) => backend
                    .release(&lease.lock_id)
                    .await
                    .map(|r| r.is_released()),
                None => Ok(false),
            }
        };
        if let Ok(Ok(true)) = timeout(Duration::from_secs(5), attempt).await {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{name}: the backend did not recover within {RECOVERY_LIMIT:?} of the heal"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

struct Worker {
    holder: String,
    backend: Timed,
    key: String,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
    losses: Arc<Mutex<Vec<Instant>>>,
    failed: Arc<AtomicUsize>,
}

impl Worker {
    async fn run(self) {
        let options = LockOptions::builder()
            .ttl(TTL)
            .retry(
                RetryPolicy::wait_for(Duration::from_secs(1))
                    .with_base_delay(Duration::from_millis(10)),
            )
            .build()
            .expect("valid options");
        while !self.stop.load(Ordering::SeqCst) {
            let guard = match syncguard::acquire(&self.backend, &self.key, &options).await {
                Ok(guard) => guard,
                Err(error) => {
                    if !error.is_contended() {
                        self.failed.fetch_add(1, Ordering::SeqCst);
                        sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            };
            let acquired = Instant::now();
            // Mostly short holds; some outlast the ttl, kept by the heartbeat, so that a
            // fault finds holders whose lease it must end.
            let hold_ms = if rand::rng().random_bool(0.15) {
                rand::rng().random_range(1_000..1_500)
            } else {
                rand::rng().random_range(20..300)
            };
            let until = acquired + Duration::from_millis(hold_ms);
            let mut actions = Vec::new();
            loop {
                let at = Instant::now();
                if guard.is_lost() {
                    self.losses.lock().unwrap().push(at);
                    break;
                }
                actions.push(at);
                if at >= until {
                    break;
                }
                sleep(Duration::from_millis(20)).await;
            }
            self.history.record(Hold {
                holder: self.holder.clone(),
                fence: guard.fence(),
                acquired,
                actions,
                lost: guard.lost_reason(),
            });
            guard.release_in_background().await;
        }
    }
}
