//! `#[locked]` against the guard API called directly, on `MemoryBackend`: the cost the macro
//! adds to an acquire + body + release cycle.
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
    let guard = syncguard::acquire(backend, &LockOptions::new(format!("bench:{n}"))).await?;
    let result = Ok(black_box(n));
    guard.release().await?;
    result
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

/// `SYNCGUARD_BENCH_PATH=macro|guard SYNCGUARD_BENCH_CALLS=n` runs one path only, for counting
/// instructions under `valgrind --tool=callgrind`, which is deterministic where wall-clock
/// timings on a shared 2-core machine are not.
async fn one_path(path: &str, calls: u64) {
    let backend = MemoryBackend::new();
    for n in 0..calls {
        match path {
            "macro" => with_macro(&backend, n % 4).await.unwrap(),
            _ => with_guard(&backend, n % 4).await.unwrap(),
        };
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
        // Warm up both paths.
        for n in 0..CALLS {
            with_macro(&backend, n % 4).await.unwrap();
            with_guard(&backend, n % 4).await.unwrap();
        }
        let (mut macro_ns, mut guard_ns) = (Vec::new(), Vec::new());
        // Alternate rounds so that drift in machine load hits both alike.
        for _ in 0..ROUNDS {
            let started = Instant::now();
            for n in 0..CALLS {
                with_macro(&backend, n % 4).await.unwrap();
            }
            macro_ns.push(per_call(started.elapsed()));
            let started = Instant::now();
            for n in 0..CALLS {
                with_guard(&backend, n % 4).await.unwrap();
            }
            guard_ns.push(per_call(started.elapsed()));
        }
        let (m, g) = (median(&mut macro_ns), median(&mut guard_ns));
        println!("acquire + body + release on MemoryBackend, median of {ROUNDS} rounds of {CALLS} calls:\n");
        println!("| path | ns per call |");
        println!("|---|---:|");
        println!("| guard API (acquire, body, release) | {g:.0} |");
        println!("| #[locked] | {m:.0} |");
        println!("\noverhead of #[locked]: {:+.1} %", (m / g - 1.0) * 100.0);
    });
}
