//! A worker instrumented end to end with OpenTelemetry: two workers want the same report, and
//! the program prints the spans they produced as a tree, then the metrics.
//!
//! `cargo run -p syncguard-examples --example otel --features otel`
//!
//! Each hold of a lock is a `syncguard.hold` span in the caller's trace, with the heartbeat's
//! `syncguard.extend` spans and the `syncguard.release` as its children; every acquire attempt
//! is a `syncguard.acquire` span. The metrics count operations by result and reason, and record
//! acquire waits, hold times, heartbeats and lost locks.
//!
//! The spans and metrics are collected in memory here, to print a short summary; a service
//! would install an exporter to its collector (OTLP, for example) instead.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{FutureExt as _, SpanId, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use syncguard::telemetry::with_opentelemetry;
use syncguard::{LockError, MemoryBackend, locked};

/// A job longer than its ttl: the heartbeat's extends show up as children of its hold span,
/// and in the `syncguard.heartbeats` counter.
#[locked(key = "report:{day}", ttl = "300ms", wait = "5s", guard = lock)]
async fn build_report(day: u32) -> Result<String, LockError> {
    tokio::time::sleep(Duration::from_millis(700)).await;
    Ok(format!("report {day} under fence {}", lock.fence()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // syncguard reports what needs attention (a lost lock, a failed release) as `tracing`
    // events: without a subscriber nobody sees them.
    tracing_subscriber::fmt::init();
    let spans = InMemorySpanExporter::default();
    let metrics = InMemoryMetricExporter::default();
    let tracer_provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let meter_provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metrics.clone()).build())
        .build();
    opentelemetry::global::set_tracer_provider(tracer_provider.clone());
    opentelemetry::global::set_meter_provider(meter_provider.clone());

    // The decorated backend is the default one `#[locked]` uses.
    syncguard::set_default_backend(with_opentelemetry(MemoryBackend::new()))?;

    // Two workers want the same report: one builds it, the other waits for the lock. Each runs
    // in a span of its own, the parent of its lock's spans.
    let tracer = opentelemetry::global::tracer("otel-example");
    let worker = |name: &'static str| {
        let span = tracer.start(name);
        build_report(22).with_context(Context::current_with_span(span))
    };
    let (first, second) = tokio::join!(worker("worker 1"), worker("worker 2"));
    println!("worker 1: {}\nworker 2: {}", first?, second?);

    tracer_provider.force_flush()?;
    meter_provider.force_flush()?;
    print_spans(&spans.get_finished_spans()?);
    if let Some(last) = metrics.get_finished_metrics()?.last() {
        print_metrics(last);
    }
    // Release what is still held (the dropped guards' pending releases too) before exiting.
    syncguard::shutdown(std::time::Duration::from_secs(5)).await;
    tracer_provider.shutdown()?;
    meter_provider.shutdown()?;
    Ok(())
}

/// The spans as a tree, children under their parent, with their start and end in
/// milliseconds from the first span's start.
fn print_spans(spans: &[SpanData]) {
    let Some(origin) = spans.iter().map(|span| span.start_time).min() else {
        return;
    };
    let ids: Vec<SpanId> = spans
        .iter()
        .map(|span| span.span_context.span_id())
        .collect();
    let mut children: HashMap<SpanId, Vec<&SpanData>> = HashMap::new();
    let mut roots = Vec::new();
    for span in spans {
        if ids.contains(&span.parent_span_id) {
            children.entry(span.parent_span_id).or_default().push(span);
        } else {
            roots.push(span);
        }
    }
    println!("\nspans (ms since the first one started):");
    let mut stack: Vec<(&SpanData, usize)> = Vec::new();
    roots.sort_by_key(|span| std::cmp::Reverse(span.start_time));
    stack.extend(roots.into_iter().map(|span| (span, 0)));
    while let Some((span, depth)) = stack.pop() {
        let at = |time: SystemTime| time.duration_since(origin).unwrap_or_default().as_millis();
        let name = format!("{}{}", "  ".repeat(depth), span.name);
        let line = format!(
            "  {name:<24} {:>5} ..{:>5}  {}",
            at(span.start_time),
            at(span.end_time),
            summary(&span.attributes),
        );
        println!("{}", line.trim_end());
        if let Some(kids) = children.get_mut(&span.span_context.span_id()) {
            kids.sort_by_key(|span| std::cmp::Reverse(span.start_time));
            stack.extend(kids.iter().map(|kid| (*kid, depth + 1)));
        }
    }
}

/// The attributes worth a glance: result, reason, fence, how a hold ended.
fn summary(attributes: &[KeyValue]) -> String {
    let shown = [
        "syncguard.result",
        "syncguard.reason",
        "syncguard.outcome",
        "syncguard.fence",
    ];
    attributes
        .iter()
        .filter(|kv| shown.contains(&kv.key.as_str()))
        .map(|kv| {
            format!(
                "{}={}",
                kv.key.as_str().trim_start_matches("syncguard."),
                kv.value
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Each metric with its data points: counters' totals, histograms' counts and means (the
/// histograms here are durations in seconds, shown in milliseconds).
fn print_metrics(resource: &ResourceMetrics) {
    println!("\nmetrics:");
    for scope in resource.scope_metrics() {
        for metric in scope.metrics() {
            println!("  {}", metric.name());
            let mut lines: Vec<(String, String)> = match metric.data() {
                AggregatedMetrics::U64(MetricData::Sum(sum)) => sum
                    .data_points()
                    .map(|point| (labels(point.attributes()), point.value().to_string()))
                    .collect(),
                AggregatedMetrics::F64(MetricData::Histogram(histogram)) => histogram
                    .data_points()
                    .map(|point| {
                        let mean_ms = 1000.0 * point.sum() / point.count().max(1) as f64;
                        let value = format!("{} recorded, mean {mean_ms:.3} ms", point.count());
                        (labels(point.attributes()), value)
                    })
                    .collect(),
                other => vec![(format!("{other:?}"), String::new())],
            };
            lines.sort();
            for (labels, value) in lines {
                println!("    {labels:<44} {value}");
            }
        }
    }
}

/// A data point's attributes, without the backend (the same everywhere here).
fn labels<'a>(attributes: impl Iterator<Item = &'a KeyValue>) -> String {
    let mut labels: Vec<String> = attributes
        .filter(|kv| kv.key.as_str() != "syncguard.backend")
        .map(|kv| {
            format!(
                "{}={}",
                kv.key.as_str().trim_start_matches("syncguard."),
                kv.value
            )
        })
        .collect();
    labels.sort();
    labels.join(" ")
}
