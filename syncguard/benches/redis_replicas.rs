//! What waiting for a replica costs (`RedisConfig::with_wait_for_replicas`): acquire+release
//! cycles per second and the acquire's latency, at 1, 16 and 64 workers on distinct keys,
//! with the setting off and on, on a primary with one replica of the bench's own (loopback).
//!
//! ```text
//! bash scripts/with-services.sh cargo bench -p syncguard --features redis --bench redis_replicas
//! ```
//!
//! Off and on alternate at each worker count, `SYNCGUARD_BENCH_ROUNDS` rounds of each (default
//! 3), `SYNCGUARD_BENCH_SECS` seconds each (default 3); the table gives every round and the
//! median. One current-thread runtime, one multiplexed connection (the default backend). Needs
//! `SYNCGUARD_REDIS_SERVER_BIN` (exported by the test command's `scripts/services.sh`).

// The tests' own servers; helpers the bench does not use go unused.
#[path = "../tests/support/servers.rs"]
#[allow(unused_imports)]
mod servers;
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use servers::RedisServer;
use support::settings::{measured_time, number_or};
use support::{Cycle, run};
use syncguard::LockId;
use syncguard::backend::LockBackend;
use syncguard::redis::{RedisBackend, RedisConfig};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_millis(500);

/// One measured run: cycles/s, and the acquire's p50 and p99 in milliseconds.
struct Run {
    cycles_per_second: f64,
    acquire_p50_ms: f64,
    acquire_p99_ms: f64,
}

async fn measure(backend: &RedisBackend, workers: usize, duration: Duration) -> Run {
    let acquires: Arc<Mutex<Vec<u32>>> = Arc::default();
    let keys: Arc<Vec<String>> = Arc::new(
        (0..workers)
            .map(|worker| format!("bench-replicas:{worker}:{}", LockId::generate()))
            .collect(),
    );
    let measured = {
        let (backend, acquires, keys) = (backend.clone(), Arc::clone(&acquires), Arc::clone(&keys));
        run(workers, duration, move |worker, _| {
            let (backend, acquires, keys) =
                (backend.clone(), Arc::clone(&acquires), Arc::clone(&keys));
            async move {
                let began = Instant::now();
                let outcome = backend.acquire(&keys[worker], TTL).await.expect("acquire");
                let took = u32::try_from(began.elapsed().as_micros()).unwrap_or(u32::MAX);
                acquires.lock().unwrap().push(took);
                let lease = outcome.lease().expect("a worker's own key is free");
                assert!(
                    backend
                        .release(&lease.lock_id)
                        .await
                        .expect("release")
                        .is_released()
                );
                Cycle::Done
            }
        })
        .await
    };
    let mut acquires = std::mem::take(&mut *acquires.lock().unwrap());
    acquires.sort_unstable();
    let percentile = |p: f64| {
        let rank = ((acquires.len() - 1) as f64 * p).round() as usize;
        f64::from(acquires[rank]) / 1000.0
    };
    Run {
        cycles_per_second: measured.per_second(),
        acquire_p50_ms: percentile(0.5),
        acquire_p99_ms: percentile(0.99),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let rounds: usize = number_or("SYNCGUARD_BENCH_ROUNDS", 3);
    let duration = measured_time(3.0);
    support::settings::runtime(1).block_on(async {
        let primary = RedisServer::start("everysec").await;
        let _replica = RedisServer::start_replica_of(&primary).await;
        let off = RedisBackend::connect(&primary.url()).await.expect("connect");
        let on = RedisBackend::connect_with(
            &primary.url(),
            RedisConfig::new().with_wait_for_replicas(1, WAIT),
        )
        .await
        .expect("connect, waiting for the replica");
        println!(
            "Redis primary with one replica (loopback), acquire+release cycles on distinct keys, \
             {} s per round; with_wait_for_replicas(1, {WAIT:?}) off and on alternating\n",
            duration.as_secs_f64()
        );
        println!(
            "| workers | wait for replica | cycles/s (each round) | cycles/s, median | acquire p50 ms (median) | acquire p99 ms (median) |"
        );
        println!("|---:|---|---|---:|---:|---:|");
        for workers in [1, 16, 64] {
            let mut runs: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
            for _ in 0..rounds {
                for (side, backend) in [&off, &on].into_iter().enumerate() {
                    runs[side].push(measure(backend, workers, duration).await);
                }
            }
            for (side, runs) in runs.iter().enumerate() {
                let each: Vec<String> = runs
                    .iter()
                    .map(|run| format!("{:.0}", run.cycles_per_second))
                    .collect();
                println!(
                    "| {workers} | {} | {} | {:.0} | {:.2} | {:.2} |",
                    ["off", "on"][side],
                    each.join(", "),
                    median(runs.iter().map(|run| run.cycles_per_second).collect()),
                    median(runs.iter().map(|run| run.acquire_p50_ms).collect()),
                    median(runs.iter().map(|run| run.acquire_p99_ms).collect()),
                );
            }
        }
    });
}
