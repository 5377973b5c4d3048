//! What a failover of a Redis Cluster primary costs lock users: from the moment the primary
//! serving a contended key is failed over to the moment every worker has acquired the lock
//! again, on a 3-primary, 3-replica cluster of the bench's own (node timeout 2 s).
//!
//! ```text
//! bash scripts/with-services.sh cargo bench -p syncguard --all-features --bench redis_cluster_failover
//! ```
//!
//! 16 workers (on two backend instances, as two processes would be) take turns on one key
//! with the default configuration and a 2 s ttl, each hold 20 ms. Each round fails over the
//! key's primary one way, then waits until every worker has acquired once more:
//!
//! - **manual**: `CLUSTER FAILOVER` on the primary's replica (a planned switchover);
//! - **kill -9**: the primary dies; the other primaries promote its replica by themselves
//!   after the node timeout, and the killed node rejoins as a replica before the next round.
//!
//! Prints per round the time until the first worker and until every worker acquired again, and
//! every worker's time counted from the moment the replica served the slot (what the cluster's
//! own failure detection leaves to the client), beside 2 x ttl. `SYNCGUARD_BENCH_ROUNDS` sets
//! the rounds of each kind (default 3); `RUST_LOG=syncguard=debug` shows what the backends'
//! release subscribers did. At the end it counts the grants whose fence is not above the one
//! before (holders take turns, so fences in grant order must grow).
//! Needs `SYNCGUARD_REDIS_SERVER_BIN` and `SYNCGUARD_REDIS_CLI_BIN` (exported by the test
//! command's `scripts/services.sh`).

// The tests' own cluster; its unit tests' imports go unused where benches leave #[test] out.
#[path = "../tests/support/cluster.rs"]
#[allow(unused_imports)]
mod cluster;
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::{Node, RedisCluster};
use support::settings::number_or;
use syncguard::redis::{RedisBackend, RedisConfig};
use syncguard::{LockOptions, RetryPolicy};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

const WORKERS: usize = 16;
const TTL: Duration = Duration::from_secs(2);
const HOLD: Duration = Duration::from_millis(20);
/// How long a round waits for every worker at most.
const GIVE_UP: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
enum Kind {
    Manual,
    Kill,
}

fn main() {
    let rounds: usize = number_or("SYNCGUARD_BENCH_ROUNDS", 3);
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    support::settings::runtime(2).block_on(async {
        let cluster = RedisCluster::start(3, 1).await;
        let mut backends = Vec::new();
        for _ in 0..2 {
            backends.push(
                RedisBackend::connect_with(&cluster.url(), RedisConfig::new())
                    .await
                    .expect("connect to the bench's cluster"),
            );
        }
        let key = format!("failover:{}", syncguard::LockId::generate());
        let lock_key = backends[0].lock_key(&key).unwrap();
        let slot = cluster.slot_of(&lock_key).await;
        // When each worker acquired, every time.
        let acquired: Arc<Mutex<Vec<Vec<Instant>>>> =
            Arc::new(Mutex::new(vec![Vec::new(); WORKERS]));
        // Every grant's fence, in the order the grants were made (holders take turns).
        let fences: Arc<Mutex<Vec<u64>>> = Arc::default();
        let stop = CancellationToken::new();
        let mut workers = Vec::new();
        for worker in 0..WORKERS {
            let backend = backends[worker % 2].clone();
            let (key, acquired, stop) = (key.clone(), Arc::clone(&acquired), stop.clone());
            let fences = Arc::clone(&fences);
            workers.push(tokio::spawn(async move {
                let options = LockOptions::builder()
                    .ttl(TTL)
                    .retry(RetryPolicy::wait_for(Duration::from_secs(30)))
                    .build()
                    .expect("valid options");
                while !stop.is_cancelled() {
                    match syncguard::acquire(&backend, &key, &options).await {
                        Ok(guard) => {
                            acquired.lock().unwrap()[worker].push(Instant::now());
                            fences.lock().unwrap().push(guard.fence().get());
                            sleep(HOLD).await;
                            let _ = guard.release().await;
                        }
                        Err(_) => sleep(Duration::from_millis(10)).await,
                    }
                }
            }));
        }
        println!(
            "| failover | round | replica serving the slot | first worker acquires again | every worker acquires again | every worker, from the slot served | 2 x ttl |"
        );
        println!("|---|---|---|---|---|---|---|");
        for kind in [Kind::Manual, Kind::Kill] {
            for round in 1..=rounds {
                sleep(Duration::from_secs(2)).await;
                let primary = cluster.owner_of_slot(slot).await;
                let replica = *cluster.replicas_of(primary).await.first().expect("a replica");
                let injected = Instant::now();
                let fail_over = fail_over(&cluster, kind, slot, primary, replica);
                let (promoted, (first, every)) =
                    tokio::join!(fail_over, every_worker_after(&acquired, injected));
                println!(
                    "| {kind:?} | {round} | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.0} s |",
                    promoted.as_secs_f64(),
                    first.as_secs_f64(),
                    every.as_secs_f64(),
                    every.saturating_sub(promoted).as_secs_f64(),
                    (TTL * 2).as_secs_f64()
                );
                if matches!(kind, Kind::Kill) {
                    cluster.restart(primary).await;
                }
                cluster.wait_until_stable().await;
            }
        }
        stop.cancel();
        for worker in workers {
            worker.await.expect("a worker panicked");
        }
        let fences = fences.lock().unwrap();
        let out_of_order = fences.windows(2).filter(|pair| pair[1] <= pair[0]).count();
        println!(
            "\n{} grants in all; fences in grant order: {out_of_order} not above the one before \
             (a grant lost with a primary that had not replicated it would show here)",
            fences.len()
        );
    });
}

/// Fails `primary` over to `replica`; returns how long until the replica served the slot (as
/// the cluster's nodes see it).
async fn fail_over(
    cluster: &RedisCluster,
    kind: Kind,
    slot: u16,
    primary: Node,
    replica: Node,
) -> Duration {
    let started = Instant::now();
    match kind {
        Kind::Manual => cluster.failover(replica).await,
        Kind::Kill => {
            cluster.kill(primary);
            // The other primaries promote the replica once the node timeout has passed.
            let deadline = Instant::now() + GIVE_UP;
            while cluster.owner_of_slot(slot).await == primary {
                assert!(Instant::now() < deadline, "{replica} was not promoted");
                sleep(Duration::from_millis(20)).await;
            }
        }
    }
    started.elapsed()
}

/// From `since` to the first worker's and to the last worker's next acquisition.
async fn every_worker_after(
    acquired: &Mutex<Vec<Vec<Instant>>>,
    since: Instant,
) -> (Duration, Duration) {
    loop {
        let after: Vec<Option<Duration>> = acquired
            .lock()
            .unwrap()
            .iter()
            .map(|times| times.iter().find(|at| **at > since).map(|at| *at - since))
            .collect();
        if after.iter().all(Option::is_some) {
            let after: Vec<Duration> = after.into_iter().flatten().collect();
            let first = after.iter().min().copied().unwrap_or_default();
            let every = after.iter().max().copied().unwrap_or_default();
            return (first, every);
        }
        assert!(
            since.elapsed() < GIVE_UP,
            "a worker did not acquire within {GIVE_UP:?}"
        );
        sleep(Duration::from_millis(5)).await;
    }
}
