//! Failover time of `syncguard::leader` on memory, Redis and PostgreSQL: from the end of a
//! leader to the first work of the next one.
//!
//! ```text
//! bash scripts/with-services.sh cargo bench -p syncguard --all-features --bench leader
//! ```
//!
//! Each round, a leader (on one backend instance, as one process) holds the election while a
//! standby (on another instance, as another process) waits in `Election::run_while_leader`
//! with the default campaign policy; then the leader ends, and the round measures from that
//! moment to the moment the standby's work starts:
//!
//! - **resign**: the leader calls `Leadership::resign`; the standby is woken by the announced
//!   release.
//! - **killed**: the leader's process dies without releasing (its backend instance fails every
//!   call from then on, and its leadership is dropped), at a random moment of its heartbeat
//!   cycle; the standby takes over when the lease has run out: one ttl (2 s here) after the
//!   last heartbeat plus the stores' 1 s clock tolerance, so between 2.3 s and 3 s.
//!
//! Reads `SYNCGUARD_TEST_REDIS_URL` and `SYNCGUARD_TEST_POSTGRES_URL`.
//! `SYNCGUARD_BENCH_ROUNDS` sets the rounds of each row (default 100 for resign, 12 for
//! killed, which take about 3 s each), `SYNCGUARD_BENCH_ONLY` a comma-separated filter on
//! backend names (`memory,redis,postgres`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use rand::Rng as _;
use support::settings::{number_or, service_url, wanted};
use syncguard::backend::LockBackend;
use syncguard::conformance::FaultyBackend;
use syncguard::leader::Election;
use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
use syncguard::{LockId, MemoryBackend, RedisBackend};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

/// The ttl of the killed rows: short, as a benchmark's patience is.
const KILLED_TTL: Duration = Duration::from_secs(2);
/// The ttl of the resign rows: long, so that only the release explains a quick failover.
const RESIGN_TTL: Duration = Duration::from_secs(30);
/// How long the standby waits before the leader ends: its first attempt is refused by then.
const STANDBY_SETTLES: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    Resign,
    Killed,
}

impl Ending {
    fn label(self) -> &'static str {
        match self {
            Self::Resign => "resign → next leader's first work",
            Self::Killed => "killed (no release, 2 s ttl) → next leader's first work",
        }
    }

    fn ttl(self) -> Duration {
        match self {
            Self::Resign => RESIGN_TTL,
            Self::Killed => KILLED_TTL,
        }
    }

    fn rounds(self) -> usize {
        let default = match self {
            Self::Resign => 100,
            Self::Killed => 12,
        };
        number_or("SYNCGUARD_BENCH_ROUNDS", default)
    }
}

/// Two instances of one backend: the leader's process and the standby's.
async fn instances(backend: &str) -> [Arc<dyn LockBackend>; 2] {
    match backend {
        "memory" => {
            let store = MemoryBackend::new();
            [Arc::new(store.clone()), Arc::new(store)]
        }
        "redis" => {
            let url = service_url("SYNCGUARD_TEST_REDIS_URL");
            let mut made: Vec<Arc<dyn LockBackend>> = Vec::new();
            for _ in 0..2 {
                made.push(Arc::new(
                    RedisBackend::connect(&url).await.expect("connect to Redis"),
                ));
            }
            made.try_into().ok().expect("two instances")
        }
        "postgres" => {
            let url = service_url("SYNCGUARD_TEST_POSTGRES_URL");
            let mut made: Vec<Arc<dyn LockBackend>> = Vec::new();
            for _ in 0..2 {
                let pool = PostgresBackend::pool_options()
                    .max_connections(4)
                    .connect(&url)
                    .await
                    .expect("connect to PostgreSQL");
                let config = PostgresConfig::new();
                setup_schema(&pool, &config).await.expect("setup_schema");
                made.push(Arc::new(
                    PostgresBackend::new(pool, config).expect("config"),
                ));
            }
            made.try_into().ok().expect("two instances")
        }
        other => unreachable!("no backend {other}"),
    }
}

/// The failover of each round, from the leader's end to the standby's first work.
async fn failovers(backends: &[Arc<dyn LockBackend>; 2], ending: Ending) -> Vec<Duration> {
    let name = format!("bench-failover-{}", LockId::generate());
    let ttl = ending.ttl();
    let mut measured = Vec::new();
    for _ in 0..ending.rounds() {
        // The leader's process, which can die: every call fails from then on.
        let mortal = FaultyBackend::shared(Arc::clone(&backends[0]));
        let leader_backend: Arc<dyn LockBackend> = Arc::new(mortal.clone());
        let leader = Election::builder(&leader_backend, &name)
            .identity("leader")
            .ttl(ttl)
            .build()
            .expect("election");
        let leadership = leader.campaign().await.expect("the leader leads");

        let standby = Election::builder(&backends[1], &name)
            .identity("standby")
            .ttl(ttl)
            .build()
            .expect("election");
        let (started, mut first_work) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let standing_by = tokio::spawn({
            let stop = stop.clone();
            async move {
                standby
                    .run_while_leader(stop, async move |_leadership| {
                        let _ = started.send(Instant::now());
                        std::future::pending::<()>().await;
                    })
                    .await
            }
        });
        sleep(STANDBY_SETTLES).await;
        if ending == Ending::Killed {
            // Somewhere in the leader's heartbeat cycle (an extend every third of the ttl).
            let phase = rand::rng().random_range(0..ttl.as_millis() as u64 / 3);
            sleep(Duration::from_millis(phase)).await;
        }
        let ended = Instant::now();
        match ending {
            Ending::Resign => {
                assert!(leadership.resign().await.expect("resign"));
            }
            Ending::Killed => {
                mortal.fail(true);
                drop(leadership); // its release fails: the lock is left to expire
            }
        }
        let worked = timeout(ttl * 3, first_work.recv())
            .await
            .expect("the standby took over")
            .expect("the standby's work started");
        measured.push(worked - ended);
        stop.cancel();
        standing_by
            .await
            .expect("the standby panicked")
            .expect("run_while_leader");
    }
    measured.sort();
    measured
}

fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank].as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    println!(
        "| {:<8} | {:<56} | {:>6} | {:>9} | {:>9} | {:>9} |",
        "backend", "failover", "rounds", "p50 ms", "p99 ms", "max ms"
    );
    println!(
        "|{:-<10}|{:-<58}|{:->8}|{:->11}|{:->11}|{:->11}|",
        "", "", "", "", "", ""
    );
    for backend in ["memory", "redis", "postgres"] {
        if !wanted(backend) {
            continue;
        }
        let backends = instances(backend).await;
        for ending in [Ending::Resign, Ending::Killed] {
            let measured = failovers(&backends, ending).await;
            println!(
                "| {:<8} | {:<56} | {:>6} | {:>9.2} | {:>9.2} | {:>9.2} |",
                backend,
                ending.label(),
                measured.len(),
                percentile_ms(&measured, 0.50),
                percentile_ms(&measured, 0.99),
                percentile_ms(&measured, 1.0),
            );
        }
    }
}
