//! Waiting on one hot key: the polling policy and the notified one (wake on release), side by
//! side in one run, on memory, Redis and PostgreSQL, with 2, 16 and 64 waiters holding the lock
//! 1 ms or 10 ms each time, default options otherwise (`LockOptions::default()`: a 5 s wait,
//! exponential backoff from 100 ms; the polling rows turn `wake_on_release` off).
//!
//! ```text
//! bash scripts/with-services.sh cargo bench -p syncguard --all-features --bench waiting
//! ```
//!
//! Each waiter takes the lock, holds it, releases it and at once asks for it again (the
//! adversarial hot key: the releaser is the quickest to ask). Each row gives the successful
//! acquisitions per second; the share of them the waiter that had just released took again
//! (no handoff); the mean time of a release call; the handoff latency to another waiter at p50
//! and p99, from the moment a holder calls release to the moment the next holder's `acquire`
//! returns, and p50 from the moment the release call returns (the release's own round trip
//! left out; 0 when the next holder had the lock first);
//! the backend operations (acquire, release, extend calls, counted by
//! `syncguard::conformance::FaultyBackend`) per
//! successful acquisition; on Redis, the server's CPU time per acquisition (`INFO cpu`); the
//! longest time any waiter waited for the lock (a wait that ended in a timeout counts, and
//! the number of timeouts is given); and, as the baseline of the same run, the backend's
//! round trip (p50 of an uncontended acquire).
//!
//! Reads `SYNCGUARD_TEST_REDIS_URL` and `SYNCGUARD_TEST_POSTGRES_URL`. `SYNCGUARD_BENCH_SECS`
//! sets the measured time per row (default 3), `SYNCGUARD_BENCH_ONLY` a comma-separated filter
//! on backend names (`memory,redis,postgres`).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::redis_cpu_seconds;
use support::settings::{measured_time, service_url, wanted};
use syncguard::backend::LockBackend;
use syncguard::conformance::FaultyBackend;
use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
use syncguard::{LockId, LockOptions, MemoryBackend, RedisBackend, RetryPolicy};
use tokio::time::Instant;

const WAITERS: [usize; 3] = [2, 16, 64];
const HOLDS: [Duration; 2] = [Duration::from_millis(1), Duration::from_millis(10)];
const WARMUP: Duration = Duration::from_millis(500);

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The Redis server's CPU seconds so far (user + system).
async fn redis_cpu(url: &str) -> f64 {
    let mut conn = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("stats connection");
    redis_cpu_seconds(&mut conn).await
}

/// What one row measured.
struct Row {
    acquisitions: u64,
    regained: u64,
    /// The mean time of a release call.
    release_call: Duration,
    /// Handoffs to another waiter, from the release call and from its return (sorted).
    handoffs_us: Vec<u32>,
    handoffs_after_return_us: Vec<u32>,
    operations: u64,
    server_cpu: Option<f64>,
    longest_wait: Duration,
    timeouts: u64,
    measured: Duration,
}

/// Everything the waiters of one row share.
#[derive(Default)]
struct Shared {
    /// The current holder's release (an index into `releases`), and which waiter it was
    /// (taken by the next holder).
    released_at: Mutex<Option<(usize, usize)>>,
    /// Every release: when it was called, when the call returned, and when another waiter's
    /// `acquire` returned with the lock next (if that counted as a handoff).
    releases: Mutex<Vec<Release>>,
    /// Acquisitions by the waiter that had just released (no handoff to another waiter).
    regained: AtomicU64,
    /// The time release calls took, in all, and how many there were.
    release_call_us: AtomicU64,
    release_calls: AtomicU64,
    acquisitions: AtomicU64,
    longest_wait_us: AtomicU64,
    timeouts: AtomicU64,
    /// When each waiter began its current wait (`None` while it holds the lock).
    waiting_since: Mutex<Vec<Option<Instant>>>,
}

#[derive(Clone, Copy)]
struct Release {
    called: Instant,
    returned: Option<Instant>,
    handed_over: Option<Instant>,
}

impl Shared {
    /// A wait of `waited` that ended (or was still going on) in the measured time.
    fn waited(&self, waited: Duration) {
        let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.longest_wait_us.fetch_max(micros, Ordering::Relaxed);
    }

    fn set_waiting(&self, waiter: usize, since: Option<Instant>) {
        self.waiting_since.lock().unwrap()[waiter] = since;
    }
}

async fn row(
    backend: &FaultyBackend,
    redis_url: Option<&str>,
    waiters: usize,
    hold: Duration,
    notified: bool,
) -> Row {
    let key = format!("bench:waiting:{}", LockId::generate());
    let options = LockOptions::builder()
        .retry(RetryPolicy::new().with_wake_on_release(notified))
        .build()
        .expect("options");
    let measured = measured_time(3.0);
    let start = Instant::now() + WARMUP;
    let end = start + measured;
    let shared = Arc::new(Shared {
        waiting_since: Mutex::new(vec![None; waiters]),
        ..Shared::default()
    });
    let shared_backend: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let tasks: Vec<_> = (0..waiters)
        .map(|waiter| {
            let (backend, key, options, shared) = (
                shared_backend.clone(),
                key.clone(),
                options.clone(),
                shared.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let began = Instant::now();
                    if began >= end {
                        break;
                    }
                    shared.set_waiting(waiter, Some(began));
                    let result = syncguard::acquire(&backend, &key, &options).await;
                    shared.set_waiting(waiter, None);
                    let ended = Instant::now();
                    // Waits that end in the measured time count, whenever they began.
                    let counted = ended >= start && ended < end;
                    match result {
                        Ok(guard) => {
                            let released_at = shared.released_at.lock().unwrap().take();
                            if counted {
                                shared.acquisitions.fetch_add(1, Ordering::Relaxed);
                                shared.waited(ended - began);
                                match released_at {
                                    Some((_, by)) if by == waiter => {
                                        shared.regained.fetch_add(1, Ordering::Relaxed);
                                    }
                                    Some((release, _)) => {
                                        shared.releases.lock().unwrap()[release].handed_over =
                                            Some(ended);
                                    }
                                    None => {}
                                }
                            }
                            tokio::time::sleep(hold).await;
                            let calling = Instant::now();
                            let release = {
                                let mut releases = shared.releases.lock().unwrap();
                                releases.push(Release {
                                    called: calling,
                                    returned: None,
                                    handed_over: None,
                                });
                                releases.len() - 1
                            };
                            *shared.released_at.lock().unwrap() = Some((release, waiter));
                            guard.release().await.expect("release");
                            shared.releases.lock().unwrap()[release].returned =
                                Some(Instant::now());
                            shared.release_call_us.fetch_add(
                                u64::try_from(calling.elapsed().as_micros()).unwrap_or(0),
                                Ordering::Relaxed,
                            );
                            shared.release_calls.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(error) if error.is_contended() => {
                            if counted {
                                shared.timeouts.fetch_add(1, Ordering::Relaxed);
                                shared.waited(ended - began);
                            }
                        }
                        Err(error) => panic!("acquire: {error}"),
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep_until(start).await;
    let operations_before = backend.operations();
    let cpu_before = match redis_url {
        Some(url) => Some(redis_cpu(url).await),
        None => None,
    };
    tokio::time::sleep_until(end).await;
    let operations = backend.operations() - operations_before;
    // Waits still going on at the end count as far as they got.
    for since in shared.waiting_since.lock().unwrap().iter().flatten() {
        shared.waited(end.saturating_duration_since(*since));
    }
    let server_cpu = match (redis_url, cpu_before) {
        (Some(url), Some(before)) => Some(redis_cpu(url).await - before),
        _ => None,
    };
    for task in tasks {
        task.await.expect("waiter");
    }
    let micros = |d: Duration| u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
    let (mut handoffs_us, mut handoffs_after_return_us) = (Vec::new(), Vec::new());
    for release in shared.releases.lock().unwrap().iter() {
        if let (Some(handed_over), Some(returned)) = (release.handed_over, release.returned) {
            handoffs_us.push(micros(handed_over - release.called));
            handoffs_after_return_us.push(micros(handed_over.saturating_duration_since(returned)));
        }
    }
    handoffs_us.sort_unstable();
    handoffs_after_return_us.sort_unstable();
    Row {
        acquisitions: shared.acquisitions.load(Ordering::Relaxed),
        regained: shared.regained.load(Ordering::Relaxed),
        release_call: Duration::from_micros(
            shared.release_call_us.load(Ordering::Relaxed)
                / shared.release_calls.load(Ordering::Relaxed).max(1),
        ),
        handoffs_us,
        handoffs_after_return_us,
        operations,
        server_cpu,
        longest_wait: Duration::from_micros(shared.longest_wait_us.load(Ordering::Relaxed)),
        timeouts: shared.timeouts.load(Ordering::Relaxed),
        measured,
    }
}

/// The backend's round trip, as the baseline: p50 of an uncontended acquire, in µs.
async fn round_trip_us(backend: &FaultyBackend) -> u32 {
    let key = format!("bench:round-trip:{}", LockId::generate());
    let mut samples = Vec::new();
    for _ in 0..200 {
        let began = Instant::now();
        let lease = backend
            .acquire(&key, Duration::from_secs(30))
            .await
            .expect("acquire")
            .lease()
            .expect("free");
        samples.push(u32::try_from(began.elapsed().as_micros()).unwrap_or(u32::MAX));
        let released = backend.release(&lease.lock_id).await.expect("release");
        assert!(released.is_released());
    }
    samples.sort_unstable();
    percentile(&samples, 0.5)
}

async fn bench_backend(name: &str, backend: Arc<dyn LockBackend>, redis_url: Option<&str>) {
    let backend = FaultyBackend::shared(backend);
    let round_trip = round_trip_us(&backend).await;
    println!("\n{name}: round trip (uncontended acquire) p50 {round_trip} µs\n");
    println!(
        "| policy | waiters | hold | acquisitions/s | regained | release call | handoff p50 | handoff p99 | after return p50 | ops/acq | server µs/acq | longest wait | timeouts |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for waiters in WAITERS {
        for hold in HOLDS {
            for notified in [false, true] {
                let row = row(&backend, redis_url, waiters, hold, notified).await;
                let per_acq = |value: f64| value / row.acquisitions.max(1) as f64;
                let server = row.server_cpu.map_or_else(
                    || "–".to_owned(),
                    |cpu| format!("{:.0}", per_acq(cpu * 1e6)),
                );
                println!(
                    "| {} | {waiters} | {} ms | {:.0} | {:.0} % | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} | {server} | {:.2} s | {} |",
                    if notified { "notified" } else { "polling" },
                    hold.as_millis(),
                    row.acquisitions as f64 / row.measured.as_secs_f64(),
                    per_acq(row.regained as f64) * 100.0,
                    row.release_call.as_secs_f64() * 1000.0,
                    f64::from(percentile(&row.handoffs_us, 0.5)) / 1000.0,
                    f64::from(percentile(&row.handoffs_us, 0.99)) / 1000.0,
                    f64::from(percentile(&row.handoffs_after_return_us, 0.5)) / 1000.0,
                    per_acq(row.operations as f64),
                    row.longest_wait.as_secs_f64(),
                    row.timeouts,
                );
            }
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if wanted("memory") {
        bench_backend("memory", Arc::new(MemoryBackend::new()), None).await;
    }
    if wanted("redis") {
        let url = service_url("SYNCGUARD_TEST_REDIS_URL");
        let backend = RedisBackend::connect(&url).await.expect("redis");
        bench_backend("redis", Arc::new(backend), Some(&url)).await;
    }
    if wanted("postgres") {
        let url = service_url("SYNCGUARD_TEST_POSTGRES_URL");
        let backend = PostgresBackend::connect(&url).await.expect("postgres");
        setup_schema(backend.pool(), &PostgresConfig::new())
            .await
            .expect("schema");
        bench_backend("postgres", Arc::new(backend), None).await;
    }
}
