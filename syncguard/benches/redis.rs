//! Redis backend throughput: acquire+release cycles per second and cycle latency, at 1, 16 and
//! 64 concurrent workers, on distinct keys and on one hot key, for each connection mode; and in
//! the same run the raw ceiling of the server: pipelined EVALSHA of a trivial script at the
//! same concurrency over one multiplexed connection (a cycle is two operations, which the
//! backend batches with those of other workers). Each row also gives the server's CPU time
//! per cycle (`INFO cpu`) and how many operations went into one script call
//! (`INFO commandstats`).
//!
//! ```text
//! bash scripts/with-services.sh cargo bench -p syncguard --features redis --bench redis
//! ```
//!
//! Reads the server from `SYNCGUARD_TEST_REDIS_URL`. `SYNCGUARD_BENCH_SECS` sets the measured
//! time per row (default 3), `SYNCGUARD_BENCH_THREADS` the runtime's worker threads (default 1,
//! a current-thread runtime), `SYNCGUARD_BENCH_ONLY` a comma-separated filter on row names such as
//! `raw/64,multi/64/distinct,pool/16/hot`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::settings;
use syncguard::LockId;
use syncguard::backend::{AcquireOutcome, LockBackend};
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig};
use tokio::time::Instant;

const WORKERS: [usize; 3] = [1, 16, 64];
const WARMUP: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, PartialEq)]
enum Keys {
    Distinct,
    Hot,
}

struct Row {
    what: String,
    workers: usize,
    keys: &'static str,
    per_sec: f64,
    contended_per_sec: f64,
    p50_us: u32,
    p99_us: u32,
    /// Server CPU (user + system) per cycle, from `INFO cpu` over the measured time.
    server_us: f64,
    /// Operations (acquire, release) per script call, from `INFO commandstats`.
    per_call: f64,
}

/// The server's CPU seconds so far and its script calls (FCALL of the batch function, or
/// EVALSHA + EVAL where the batch goes by script).
async fn server_stats(conn: &mut redis::aio::MultiplexedConnection) -> (f64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    let mut cpu = 0.0;
    let mut calls = 0;
    for line in info.lines() {
        if let Some(v) = line
            .strip_prefix("used_cpu_sys:")
            .or_else(|| line.strip_prefix("used_cpu_user:"))
        {
            cpu += v.trim().parse::<f64>().unwrap_or(0.0);
        }
        if let Some(rest) = line
            .strip_prefix("cmdstat_fcall:calls=")
            .or_else(|| line.strip_prefix("cmdstat_evalsha:calls="))
            .or_else(|| line.strip_prefix("cmdstat_eval:calls="))
        {
            calls += rest
                .split(',')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    (cpu, calls)
}

/// Samples [`server_stats`] at `start` and `end`: (CPU seconds, script calls) in between.
async fn server_usage(url: String, start: Instant, end: Instant) -> (f64, u64) {
    let mut conn = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("stats connection");
    tokio::time::sleep_until(start).await;
    let (cpu0, calls0) = server_stats(&mut conn).await;
    tokio::time::sleep_until(end).await;
    let (cpu1, calls1) = server_stats(&mut conn).await;
    (cpu1 - cpu0, calls1 - calls0)
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank]
}

/// Runs `workers` loops of acquire+release for `secs`, after a warm-up.
async fn cycles(
    backend: &RedisBackend,
    url: &str,
    workers: usize,
    keys: Keys,
    measure: Duration,
    label: &str,
) -> Row {
    let run = LockId::generate();
    let start = Instant::now() + WARMUP;
    let end = start + measure;
    let usage = tokio::spawn(server_usage(url.to_owned(), start, end));
    let tasks: Vec<_> = (0..workers)
        .map(|worker| {
            let backend = backend.clone();
            let key = match keys {
                Keys::Distinct => format!("bench:{run}:{worker}"),
                Keys::Hot => format!("bench:{run}:hot"),
            };
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(1 << 16);
                let mut contended = 0_u64;
                loop {
                    let began = Instant::now();
                    if began >= end {
                        break;
                    }
                    let outcome = backend
                        .acquire(&key, Duration::from_secs(30))
                        .await
                        .expect("acquire");
                    let AcquireOutcome::Acquired(lease) = outcome else {
                        if began >= start {
                            contended += 1;
                        }
                        tokio::task::yield_now().await;
                        continue;
                    };
                    let released = backend.release(&lease.lock_id).await.expect("release");
                    assert!(released.is_released());
                    if began >= start {
                        let micros = began.elapsed().as_micros();
                        latencies.push(u32::try_from(micros).unwrap_or(u32::MAX));
                    }
                }
                (latencies, contended)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut contended = 0;
    for task in tasks {
        let (latencies, hits) = task.await.expect("worker");
        all.extend(latencies);
        contended += hits;
    }
    all.sort_unstable();
    let secs = measure.as_secs_f64();
    let (server_cpu, calls) = usage.await.expect("server stats");
    let operations = all.len() as f64 * 2.0 + contended as f64;
    Row {
        server_us: server_cpu * 1e6 / all.len().max(1) as f64,
        per_call: operations / calls.max(1) as f64,
        what: label.to_owned(),
        workers,
        keys: match keys {
            Keys::Distinct => "distinct",
            Keys::Hot => "one hot key",
        },
        per_sec: all.len() as f64 / secs,
        contended_per_sec: contended as f64 / secs,
        p50_us: percentile(&all, 0.50),
        p99_us: percentile(&all, 0.99),
    }
}

/// `workers` loops of EVALSHA of `return 1` on one multiplexed connection.
async fn raw_ceiling(url: &str, workers: usize, measure: Duration) -> Row {
    let client = redis::Client::open(url).expect("url");
    let manager = redis::aio::ConnectionManager::new(client)
        .await
        .expect("connect");
    let script = Arc::new(redis::Script::new("return 1"));
    {
        let mut conn = manager.clone();
        script.load_async(&mut conn).await.expect("load");
    }
    let start = Instant::now() + WARMUP;
    let end = start + measure;
    let usage = tokio::spawn(server_usage(url.to_owned(), start, end));
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let mut conn = manager.clone();
            let script = Arc::clone(&script);
            tokio::spawn(async move {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(script.get_hash()).arg(0);
                let mut latencies = Vec::with_capacity(1 << 17);
                loop {
                    let began = Instant::now();
                    if began >= end {
                        break;
                    }
                    let one: i64 = cmd.query_async(&mut conn).await.expect("evalsha");
                    assert_eq!(one, 1);
                    if began >= start {
                        let micros = began.elapsed().as_micros();
                        latencies.push(u32::try_from(micros).unwrap_or(u32::MAX));
                    }
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("worker"));
    }
    all.sort_unstable();
    let (server_cpu, _) = usage.await.expect("server stats");
    Row {
        server_us: server_cpu * 1e6 / all.len().max(1) as f64,
        per_call: 1.0,
        what: "raw EVALSHA `return 1` (ops/s)".to_owned(),
        workers,
        keys: "-",
        per_sec: all.len() as f64 / measure.as_secs_f64(),
        contended_per_sec: 0.0,
        p50_us: percentile(&all, 0.50),
        p99_us: percentile(&all, 0.99),
    }
}

fn main() {
    let url = std::env::var("SYNCGUARD_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!(
            "SYNCGUARD_TEST_REDIS_URL is not set: run `bash scripts/with-services.sh cargo bench \
             -p syncguard --features redis --bench redis` (it installs and starts redis-server)"
        )
    });
    let measure = settings::measured_time(3.0);
    // One runtime thread by default: on a small machine the Redis server needs the other
    // cores, and a single-threaded client avoids cross-thread wake-ups on every reply.
    let threads = settings::runtime_threads(1);
    let runtime = settings::runtime(threads);

    runtime.block_on(async {
        let multiplexed = RedisBackend::connect(&url).await.expect("connect");
        let pool = RedisBackend::connect_with(
            &url,
            RedisConfig::new().with_connection_mode(ConnectionMode::Pool { max_size: 64 }),
        )
        .await
        .expect("connect (pool)");
        let only = std::env::var("SYNCGUARD_BENCH_ONLY").unwrap_or_default();
        let wanted = |what: &str| only.is_empty() || only.split(',').any(|o| what.contains(o));
        let mut rows = Vec::new();
        for workers in WORKERS {
            if wanted(&format!("raw/{workers}")) {
                rows.push(raw_ceiling(&url, workers, measure).await);
            }
            for (short, label, backend) in [
                ("multi", "multiplexed (ConnectionManager)", &multiplexed),
                ("pool", "pool (deadpool-redis, 64)", &pool),
            ] {
                for keys in [Keys::Distinct, Keys::Hot] {
                    let name = match keys {
                        Keys::Distinct => "distinct",
                        Keys::Hot => "hot",
                    };
                    if !wanted(&format!("{short}/{workers}/{name}")) {
                        continue;
                    }
                    rows.push(cycles(backend, &url, workers, keys, measure, label).await);
                }
            }
        }

        println!(
            "\nRedis backend, {threads} runtime threads, {}s per row (cycle = acquire + release)\n",
            measure.as_secs()
        );
        println!(
            "| mode | workers | keys | cycles/s | p50 µs | p99 µs | contended acquires/s | \
             server µs/cycle | operations/script call |"
        );
        println!("|---|---:|---|---:|---:|---:|---:|---:|---:|");
        for row in &rows {
            println!(
                "| {} | {} | {} | {:.0} | {} | {} | {:.0} | {:.1} | {:.1} |",
                row.what,
                row.workers,
                row.keys,
                row.per_sec,
                row.p50_us,
                row.p99_us,
                row.contended_per_sec,
                row.server_us,
                row.per_call
            );
        }
        let ceiling = rows
            .iter()
            .find(|r| r.workers == 64 && r.keys == "-")
            .map_or(0.0, |r| r.per_sec);
        let best = rows
            .iter()
            .filter(|r| r.workers == 64 && r.keys == "distinct")
            .map(|r| (r.what.clone(), r.per_sec))
            .fold((String::new(), 0.0), |a, b| if b.1 > a.1 { b } else { a });
        println!(
            "\nAt 64 workers: best {:.0} cycles/s ({}); raw ceiling {:.0} EVALSHA/s, half of it \
             {:.0}; ratio to half the ceiling {:.0} %; against the 32000 cycles/s the reference \
             publishes (measured on its own machine, not in this run): {:.2}x",
            best.1,
            best.0,
            ceiling,
            ceiling / 2.0,
            100.0 * best.1 / (ceiling / 2.0),
            best.1 / 32_000.0
        );
    });
}
