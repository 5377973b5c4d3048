//! syncguard beside the reference implementation (the TypeScript SyncGuard 2.5.2 on Node, with
//! ioredis and postgres.js, built by `bench/reference/build.sh`) and beside the raw limit, on
//! the same Redis and PostgreSQL servers in the same run: acquire+release cycles per second
//! and cycle latency at 1, 16 and 64 workers on distinct keys, the three contenders alternated
//! round by round so that the machine's drifts hit them alike.
//!
//! ```text
//! bash bench/reference/build.sh            # once; needs node >= 20 and npm
//! bash scripts/with-services.sh cargo bench -p syncguard --all-features --bench versus_reference
//! ```
//!
//! The raw limit is what the server allows a cycle of two calls: on Redis two EVALSHA of
//! `return 1` on one multiplexed connection; on PostgreSQL an upsert ... RETURNING and a
//! DELETE, each committed (durably), on a connection each worker holds. Each row gives the
//! median over the rounds of cycles per second, the p50 and p99 of the median round, and on
//! Redis the server's CPU time per cycle (`INFO cpu`).
//!
//! `SYNCGUARD_BENCH_SECS` sets each measurement (default 3 s), `SYNCGUARD_BENCH_ROUNDS` the
//! rounds (default 3), `SYNCGUARD_BENCH_ONLY` the backends (`redis,postgres`),
//! `SYNCGUARD_BENCH_WORKERS` the worker counts (`1,16,64`) and `SYNCGUARD_BENCH_CONTENDERS` the
//! contenders (`raw,syncguard,reference`; one alone, to profile it), `SYNCGUARD_BENCH_THREADS`
//! the worker threads of the runtime the raw and syncguard clients run on (default 2; 1 makes a
//! current-thread runtime, as single-threaded as the reference's Node).

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use support::settings::{number_or, runtime, runtime_threads, service_url, wanted};
use support::{Cycle, Measured, redis_cpu_seconds, run, scenario_duration};
use syncguard::LockId;
use syncguard::backend::LockBackend;
use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
use syncguard::redis::RedisBackend;

const WORKERS: [usize; 3] = [1, 16, 64];
const TTL: Duration = Duration::from_secs(30);
/// The runtime's worker threads unless `SYNCGUARD_BENCH_THREADS` says otherwise: as many as
/// `#[tokio::main]` makes on the 2-core machine the figures come from.
const RUNTIME_THREADS: usize = 2;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Contender {
    Raw,
    Syncguard,
    Reference,
}

impl Contender {
    const ALL: [Contender; 3] = [Contender::Raw, Contender::Syncguard, Contender::Reference];

    /// The contenders `SYNCGUARD_BENCH_CONTENDERS` names (all by default).
    fn wanted() -> Vec<Contender> {
        let only = std::env::var("SYNCGUARD_BENCH_CONTENDERS").unwrap_or_default();
        Self::ALL
            .into_iter()
            .filter(|contender| {
                only.is_empty() || only.split(',').any(|name| name.trim() == contender.short())
            })
            .collect()
    }

    fn short(self) -> &'static str {
        match self {
            Contender::Raw => "raw",
            Contender::Syncguard => "syncguard",
            Contender::Reference => "reference",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Contender::Raw => "raw limit",
            Contender::Syncguard => "syncguard",
            Contender::Reference => "reference 2.5.2",
        }
    }
}

/// One measurement: cycles per second, latency percentiles (µs), cycles counted, and server
/// CPU per cycle (µs).
#[derive(Clone, Copy)]
struct Sample {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    cycles: u64,
    server_us: Option<f64>,
}

impl Sample {
    fn of(measured: &Measured) -> Self {
        Self {
            per_sec: measured.per_second(),
            p50_us: measured.percentile_ms(0.50) * 1000.0,
            p99_us: measured.percentile_ms(0.99) * 1000.0,
            cycles: measured.cycles,
            server_us: None,
        }
    }
}

#[derive(Clone, Copy)]
enum Backend {
    Redis,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
            Backend::Postgres => "postgres",
        }
    }

    fn url(self) -> String {
        let variable = match self {
            Backend::Redis => "SYNCGUARD_TEST_REDIS_URL",
            Backend::Postgres => "SYNCGUARD_TEST_POSTGRES_URL",
        };
        service_url(variable)
    }
}

fn rounds() -> usize {
    number_or("SYNCGUARD_BENCH_ROUNDS", 3)
}

/// `SYNCGUARD_BENCH_WORKERS`, or 1, 16 and 64.
fn worker_counts() -> Vec<usize> {
    std::env::var("SYNCGUARD_BENCH_WORKERS")
        .ok()
        .map(|list| {
            list.split(',')
                .map(|n| n.trim().parse().expect("SYNCGUARD_BENCH_WORKERS: numbers"))
                .collect()
        })
        .unwrap_or_else(|| WORKERS.to_vec())
}

/// The reference's cycle runner; it must have been built.
fn reference_runner() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/reference");
    assert!(
        dir.join("build").is_dir() && dir.join("node_modules").is_dir(),
        "the reference implementation is not built: run `bash bench/reference/build.sh` (see \
         bench/reference/README.md)"
    );
    dir.join("cycles.mjs")
}

/// The reference's cycles, run by Node in a process of its own.
async fn reference(backend: Backend, url: &str, workers: usize, secs: Duration) -> Sample {
    let output = tokio::process::Command::new("node")
        .arg(reference_runner())
        .args(["--backend", backend.name(), "--url", url])
        .args(["--workers", &workers.to_string()])
        .args(["--secs", &secs.as_secs_f64().to_string()])
        .output()
        .await
        .expect("node (install node >= 20)");
    assert!(
        output.status.success(),
        "the reference bench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("one JSON line from cycles.mjs");
    let number = |field: &str| line[field].as_f64().expect(field);
    Sample {
        per_sec: number("per_sec"),
        p50_us: number("p50_us"),
        p99_us: number("p99_us"),
        cycles: number("cycles") as u64,
        server_us: None,
    }
}

/// syncguard's acquire+release cycles through `backend`, one distinct key per worker.
async fn syncguard_cycles(
    backend: Arc<dyn LockBackend>,
    workers: usize,
    secs: Duration,
) -> Measured {
    let run_id = LockId::generate();
    run(workers, secs, move |worker, _| {
        let backend = Arc::clone(&backend);
        let key = format!("bench:versus:{run_id}:{worker}");
        async move {
            let lease = backend
                .acquire(&key, TTL)
                .await
                .expect("acquire")
                .lease()
                .expect("a key of its own is free");
            let released = backend.release(&lease.lock_id).await.expect("release");
            assert!(released.is_released());
            Cycle::Done
        }
    })
    .await
}

/// Two EVALSHA of `return 1` per cycle, on one multiplexed connection.
async fn redis_raw(url: &str, workers: usize, secs: Duration) -> Measured {
    let client = redis::Client::open(url).expect("url");
    let manager = redis::aio::ConnectionManager::new(client)
        .await
        .expect("connect");
    let script = redis::Script::new("return 1");
    script.load_async(&mut manager.clone()).await.expect("load");
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(0);
    let cmd = Arc::new(cmd);
    run(workers, secs, move |_, _| {
        let (mut conn, cmd) = (manager.clone(), Arc::clone(&cmd));
        async move {
            for _ in 0..2 {
                let one: i64 = cmd.query_async(&mut conn).await.expect("evalsha");
                assert_eq!(one, 1);
            }
            Cycle::Done
        }
    })
    .await
}

const RAW_UPSERT: &str = "INSERT INTO syncguard_bench_raw (key, lock_id, expires_at_ms) \
     VALUES ($1, $2, $3) ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, \
     expires_at_ms = EXCLUDED.expires_at_ms RETURNING expires_at_ms";
const RAW_DELETE: &str = "DELETE FROM syncguard_bench_raw WHERE key = $1";

/// An upsert and a delete per cycle, each committed, on a connection each worker holds.
async fn postgres_raw(url: &str, workers: usize, secs: Duration) -> Measured {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(workers as u32)
        .min_connections(workers as u32)
        .test_before_acquire(false)
        .connect(url)
        .await
        .expect("connect");
    let mut held = Vec::with_capacity(workers);
    for _ in 0..workers {
        held.push(tokio::sync::Mutex::new(
            pool.acquire().await.expect("connection"),
        ));
    }
    let held = Arc::new(held);
    let run_id = LockId::generate();
    let measured = run(workers, secs, move |worker, _| {
        let held = Arc::clone(&held);
        let key = format!("raw:{run_id}:{worker}");
        async move {
            let mut conn = held[worker].lock().await;
            let _: i64 = sqlx::query_scalar(RAW_UPSERT)
                .bind(&key)
                .bind("bench")
                .bind(1_i64)
                .fetch_one(&mut **conn)
                .await
                .expect("raw upsert");
            sqlx::query(RAW_DELETE)
                .bind(&key)
                .execute(&mut **conn)
                .await
                .expect("raw delete");
            Cycle::Done
        }
    })
    .await;
    pool.close().await;
    measured
}

/// A pool for syncguard's PostgreSQL backend with a connection per worker.
async fn postgres_backend(url: &str, workers: usize) -> (Arc<dyn LockBackend>, PgPool) {
    let pool = PostgresBackend::pool_options()
        .max_connections(workers as u32 + 1)
        .min_connections(workers as u32)
        .acquire_timeout(Duration::from_secs(60))
        .connect(url)
        .await
        .expect("connect");
    let backend = PostgresBackend::new(pool.clone(), PostgresConfig::new()).expect("backend");
    (Arc::new(backend), pool)
}

async fn measure(
    backend: Backend,
    contender: Contender,
    url: &str,
    workers: usize,
    secs: Duration,
    redis_stats: Option<&redis::aio::MultiplexedConnection>,
) -> Sample {
    let cpu_before = match redis_stats {
        Some(conn) => Some(redis_cpu_seconds(&mut conn.clone()).await),
        None => None,
    };
    let mut sample = match (backend, contender) {
        (_, Contender::Reference) => reference(backend, url, workers, secs).await,
        (Backend::Redis, Contender::Raw) => Sample::of(&redis_raw(url, workers, secs).await),
        (Backend::Redis, Contender::Syncguard) => {
            let redis = RedisBackend::connect(url).await.expect("redis");
            Sample::of(&syncguard_cycles(Arc::new(redis), workers, secs).await)
        }
        (Backend::Postgres, Contender::Raw) => Sample::of(&postgres_raw(url, workers, secs).await),
        (Backend::Postgres, Contender::Syncguard) => {
            let (backend, pool) = postgres_backend(url, workers).await;
            let measured = syncguard_cycles(backend, workers, secs).await;
            pool.close().await;
            Sample::of(&measured)
        }
    };
    // Over the measured cycles; the warm-up's CPU is counted too, alike for every contender.
    if let (Some(conn), Some(before)) = (redis_stats, cpu_before) {
        let cpu = redis_cpu_seconds(&mut conn.clone()).await - before;
        sample.server_us = Some(cpu * 1e6 / sample.cycles.max(1) as f64);
    }
    sample
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn compare(backend: Backend) {
    let url = backend.url();
    let secs = scenario_duration_or(3.0);
    let redis_stats = match backend {
        Backend::Redis => Some(
            redis::Client::open(url.as_str())
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("stats connection"),
        ),
        Backend::Postgres => {
            let admin = sqlx::PgPool::connect(&url).await.expect("connect");
            setup_schema(&admin, &PostgresConfig::new())
                .await
                .expect("schema");
            sqlx::raw_sql(
                "CREATE TABLE IF NOT EXISTS syncguard_bench_raw (key TEXT PRIMARY KEY, \
                 lock_id TEXT NOT NULL, expires_at_ms BIGINT NOT NULL)",
            )
            .execute(&admin)
            .await
            .expect("raw table");
            admin.close().await;
            None
        }
    };
    println!(
        "\n{}: {} rounds of {:.1} s per contender, raw and syncguard on {} runtime threads\n",
        backend.name(),
        rounds(),
        secs.as_secs_f64(),
        runtime_threads(RUNTIME_THREADS),
    );
    println!(
        "| workers | contender | cycles/s | p50 µs | p99 µs | server µs/cycle | syncguard × |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    let contenders = Contender::wanted();
    for workers in worker_counts() {
        let mut samples: Vec<(Contender, Sample)> = Vec::new();
        for round in 0..rounds() {
            // Each round in another order: none always runs first, or last.
            let mut order = contenders.clone();
            let len = order.len();
            order.rotate_left(round % len);
            for contender in order {
                let sample = measure(
                    backend,
                    contender,
                    &url,
                    workers,
                    secs,
                    redis_stats.as_ref(),
                )
                .await;
                samples.push((contender, sample));
            }
        }
        let of = |contender: Contender| -> Vec<Sample> {
            samples
                .iter()
                .filter(|(c, _)| *c == contender)
                .map(|(_, sample)| *sample)
                .collect()
        };
        let syncguard = of(Contender::Syncguard);
        // NaN when syncguard was not measured: its ratios print as NaN.
        let ours = if syncguard.is_empty() {
            f64::NAN
        } else {
            median(syncguard.iter().map(|s| s.per_sec).collect())
        };
        for contender in contenders.iter().copied() {
            let runs = of(contender);
            let rate = median(runs.iter().map(|s| s.per_sec).collect());
            let middle = runs
                .iter()
                .find(|s| s.per_sec == rate)
                .copied()
                .expect("the median is a run");
            let server = middle
                .server_us
                .map_or_else(|| "–".to_owned(), |us| format!("{us:.1}"));
            let times = if contender == Contender::Syncguard {
                String::new()
            } else {
                format!("{:.2}", ours / rate)
            };
            println!(
                "| {workers} | {} | {rate:.0} | {:.0} | {:.0} | {server} | {times} |",
                contender.name(),
                middle.p50_us,
                middle.p99_us,
            );
        }
    }
}

/// `SYNCGUARD_BENCH_SECS`, or `default` seconds.
fn scenario_duration_or(default: f64) -> Duration {
    if std::env::var("SYNCGUARD_BENCH_SECS").is_ok() {
        scenario_duration()
    } else {
        Duration::from_secs_f64(default)
    }
}

fn main() {
    if Contender::wanted().contains(&Contender::Reference) {
        reference_runner();
    }
    let runtime = runtime(runtime_threads(RUNTIME_THREADS));
    for backend in [Backend::Redis, Backend::Postgres] {
        if wanted(backend.name()) {
            runtime.block_on(compare(backend));
        }
    }
}
