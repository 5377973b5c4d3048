//! A worker instrumented end to end with OpenTelemetry, exporting spans and metrics to stdout.
//!
//! `cargo run --example otel`
//!
//! Every backend call becomes a span (`syncguard.acquire`, `syncguard.extend` from the
//! heartbeat, `syncguard.release`, ...); the metrics at the end count operations by result and
//! reason, and record acquire waits, hold times, heartbeats and lost locks.

use std::time::Duration;

use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use syncguard::telemetry::with_opentelemetry;
use syncguard::{LockError, MemoryBackend, locked};

/// A job longer than its ttl: the heartbeat's extends show up as spans and in the
/// `syncguard.heartbeats` counter.
#[locked(key = "report:{day}", ttl = "300ms", wait = "5s", guard = lock)]
async fn build_report(day: u32) -> Result<String, LockError> {
    tokio::time::sleep(Duration::from_millis(700)).await;
    Ok(format!("report {day} under fence {}", lock.fence()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tracer_provider = SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    let meter_provider = SdkMeterProvider::builder()
        .with_reader(
            PeriodicReader::builder(opentelemetry_stdout::MetricExporter::default()).build(),
        )
        .build();
    opentelemetry::global::set_tracer_provider(tracer_provider.clone());
    opentelemetry::global::set_meter_provider(meter_provider.clone());

    // The decorated backend is the default one `#[locked]` uses.
    syncguard::set_default_backend(with_opentelemetry(MemoryBackend::new()))?;

    // Two workers want the same report: one builds it, the other waits for the lock.
    let (first, second) = tokio::join!(build_report(22), build_report(22));
    println!("{}\n{}", first?, second?);

    tracer_provider.force_flush()?;
    meter_provider.force_flush()?;
    tracer_provider.shutdown()?;
    meter_provider.shutdown()?;
    Ok(())
}
