//! Telemetry decorator overhead on `MemoryBackend`: an acquire + release cycle on the bare
//! backend, through `with_telemetry` (a no-op callback), and through `with_opentelemetry` with
//! the global no-op providers and with SDK providers (spans sampled, metrics aggregated).
//!
//! `cargo bench -p syncguard --features opentelemetry --bench telemetry`; for deterministic
//! instruction counts, `SYNCGUARD_BENCH_PATH=<name> SYNCGUARD_BENCH_CALLS=n` under
//! `valgrind --tool=callgrind` runs one path only.

use std::time::{Duration, Instant};

use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use syncguard::MemoryBackend;
use syncguard::backend::LockBackend;
use syncguard::telemetry::{with_opentelemetry, with_telemetry};

const CALLS: u64 = 50_000;
const ROUNDS: usize = 7;
const TTL: Duration = Duration::from_secs(30);

async fn cycles<B: LockBackend>(backend: &B, calls: u64) {
    for n in 0..calls {
        let key = if n % 2 == 0 { "bench:a" } else { "bench:b" };
        let lease = backend.acquire(key, TTL).await.unwrap().lease().unwrap();
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tracer_provider = SdkTracerProvider::builder().build();
    let meter_provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(InMemoryMetricExporter::default()).build())
        .build();
    let plain = MemoryBackend::new();
    let callback = with_telemetry(MemoryBackend::new(), |event| {
        std::hint::black_box(event);
    });
    let otel_noop = with_opentelemetry(MemoryBackend::new());
    let otel_sdk =
        with_opentelemetry(MemoryBackend::new()).with_providers(&tracer_provider, &meter_provider);

    runtime.block_on(async {
        if let Ok(path) = std::env::var("SYNCGUARD_BENCH_PATH") {
            let calls = std::env::var("SYNCGUARD_BENCH_CALLS")
                .ok()
                .and_then(|c| c.parse().ok())
                .unwrap_or(10_000);
            match path.as_str() {
                "plain" => cycles(&plain, calls).await,
                "callback" => cycles(&callback, calls).await,
                "otel-noop" => cycles(&otel_noop, calls).await,
                _ => cycles(&otel_sdk, calls).await,
            }
            return;
        }
        let mut results: [Vec<f64>; 4] = Default::default();
        for _ in 0..ROUNDS {
            for (i, result) in results.iter_mut().enumerate() {
                let started = Instant::now();
                match i {
                    0 => cycles(&plain, CALLS).await,
                    1 => cycles(&callback, CALLS).await,
                    2 => cycles(&otel_noop, CALLS).await,
                    _ => cycles(&otel_sdk, CALLS).await,
                }
                result.push(started.elapsed().as_nanos() as f64 / CALLS as f64);
            }
        }
        let medians: Vec<f64> = results
            .iter_mut()
            .map(|r| {
                r.sort_by(f64::total_cmp);
                r[r.len() / 2]
            })
            .collect();
        println!(
            "acquire + release cycle on MemoryBackend, median of {ROUNDS} rounds of {CALLS}:\n"
        );
        println!("| backend | ns per cycle | overhead |");
        println!("|---|---:|---:|");
        let names = [
            "MemoryBackend",
            "with_telemetry (no-op callback)",
            "with_opentelemetry (global no-op providers)",
            "with_opentelemetry (SDK providers)",
        ];
        for (name, ns) in names.iter().zip(&medians) {
            println!(
                "| {name} | {ns:.0} | {:+.0} % |",
                (ns / medians[0] - 1.0) * 100.0
            );
        }
    });
}
