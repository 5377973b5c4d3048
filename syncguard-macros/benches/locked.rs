//! `#[locked]` against the guard API called directly and against `with_lock` (what the macro
//! does, by hand), on `MemoryBackend`: the cost the macro adds to an acquire + body + release
//! cycle. The guard path skips what `with_lock` and `#[locked]` add to a bare cycle: the body
//! run in the hold's span and raced against loss, and the release waited for under a timeout.
//!
//! `cargo bench -p syncguard-macros --bench locked`

use std::hint::black_box;
use std::time::{Duration, Instant};

use syncguard::{LockError, LockOptions, MemoryBackend, locked};

#[locked(key = "bench:{n}", backend = backend)]
async fn with_macro(backend: &MemoryBackend, n: u64) -> Result<u64, LockError> {
    Ok(black_box(n))
}

async fn with_guard(backend: &MemoryBackend, n: u64) -> Result<u64, LockError> {
    let options = LockOptions::default();
    let guard = syncguard::acquire(backend, &format!("bench:{n}"), &options).await?;
    let result = Ok(black_box(n));
    guard.release().await?;
    result
}

async fn with_lock(backend: &MemoryBackend, n: u64) -> Result<u64, LockError> {
    let options = LockOptions::default();
    syncguard::with_lock(backend, &format!("bench:{n}"), &options, async |_| {
        Ok(black_box(n))
    })
    .await
}

const CALLS: u64 = 20_000;
const ROUNDS: usize = 9;

fn per_call(elapsed: Duration) -> f64 {
    elapsed.as_nanos() as f64 / CALLS as f64
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The paths measured, as named in the table and in `SYNCGUARD_BENCH_PATH`.
const PATHS: [(&str, &str); 3] = [
    ("guard", "guard API (acquire, body, release)"),
    ("with_lock", "`with_lock`"),
    ("macro", "`#[locked]`"),
];

/// Every hold spawns a heartbeat task, aborted at release. On this current-thread runtime the
/// aborted tasks are only reaped when the loop yields to the scheduler; without yields they
/// would pile up (hundreds of MB over a run) and be freed, untimed, at shutdown. Yielding
/// every `REAP_EVERY` calls (fewer than the 61 tasks the scheduler runs per tick) reaps them
/// as a real caller's task does between holds, and counts their cost.
const REAP_EVERY: u64 = 32;

async fn call(path: &str, backend: &MemoryBackend, n: u64) {
    match path {
        "macro" => with_macro(backend, n % 4).await,
        "with_lock" => with_lock(backend, n % 4).await,
        _ => with_guard(backend, n % 4).await,
    }
    .unwrap();
    if n % REAP_EVERY == REAP_EVERY - 1 {
        tokio::task::yield_now().await;
    }
}

/// `SYNCGUARD_BENCH_PATH=guard|with_lock|macro SYNCGUARD_BENCH_CALLS=n` runs one path only,
/// for counting instructions under `valgrind --tool=callgrind`, which is deterministic where
/// wall-clock timings on a shared 2-core machine are not.
async fn one_path(path: &str, calls: u64) {
    let backend = MemoryBackend::new();
    for n in 0..calls {
        call(path, &backend, n).await;
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Ok(path) = std::env::var("SYNCGUARD_BENCH_PATH") {
        let calls = std::env::var("SYNCGUARD_BENCH_CALLS")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(10_000);
        runtime.block_on(one_path(&path, calls));
        return;
    }
    runtime.block_on(async {
        let backend = MemoryBackend::new();
        // Warm up every path.
        for (path, _) in PATHS {
            for n in 0..CALLS {
                call(path, &backend, n).await;
            }
        }
        let mut timings = PATHS.map(|_| Vec::new());
        // Alternate rounds so that drift in machine load hits every path alike.
        for _ in 0..ROUNDS {
            for ((path, _), ns) in PATHS.iter().zip(&mut timings) {
                let started = Instant::now();
                for n in 0..CALLS {
                    call(path, &backend, n).await;
                }
                ns.push(per_call(started.elapsed()));
            }
        }
        let medians = timings.map(|mut ns| median(&mut ns));
        println!(
            "acquire + body + release on MemoryBackend, median of {ROUNDS} rounds of {CALLS} calls:\n"
        );
        println!("| path | ns per call |");
        println!("|---|---:|");
        for ((_, label), ns) in PATHS.iter().zip(medians) {
            println!("| {label} | {ns:.0} |");
        }
        let [guard, with_lock, locked] = medians;
        println!(
            "\n`#[locked]`: {:+.1} % over the guard API, {:+.1} % over `with_lock`",
            (locked / guard - 1.0) * 100.0,
            (locked / with_lock - 1.0) * 100.0
        );
    });
}
