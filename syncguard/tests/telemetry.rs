//! The telemetry decorators: both pass the conformance suite unchanged; the callback gets the
//! reference's events; OpenTelemetry spans and metric points are checked through the SDK's
//! in-memory exporters, for success, contention, expiry and a lost lock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::Status;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use syncguard::backend::key::hash_key;
use syncguard::backend::{LockBackend, ReleaseOutcome};
use syncguard::telemetry::{
    EventReason, EventResult, LockEvent, OpenTelemetryBackend, Operation, with_opentelemetry,
    with_telemetry,
};
use syncguard::{ErrorCode, LockId, LockOptions, LostReason, MemoryBackend, RetryPolicy};

mod callback_conformance {
    syncguard::conformance_tests!(async {
        syncguard::telemetry::with_telemetry(syncguard::MemoryBackend::new(), |_| {})
    });
}

mod opentelemetry_conformance {
    syncguard::conformance_tests!(async {
        syncguard::telemetry::with_opentelemetry(syncguard::MemoryBackend::new())
    });
}

fn recorder() -> (
    Arc<Mutex<Vec<LockEvent>>>,
    impl Fn(&LockEvent) + Send + Sync + 'static,
) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&events);
    (events, move |event: &LockEvent| {
        sink.lock().unwrap().push(event.clone())
    })
}

#[tokio::test]
async fn callback_events_follow_the_reference() {
    let (events, on_event) = recorder();
    let backend = with_telemetry(MemoryBackend::new(), on_event);
    let ttl = Duration::from_millis(100);

    let lease = backend
        .acquire("evt:1", ttl)
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert!(backend.acquire("evt:1", ttl).await.unwrap().is_contended());
    assert!(backend.is_locked("evt:1").await.unwrap());
    assert!(
        syncguard::get_by_id(&backend, &lease.lock_id)
            .await
            .unwrap()
            .is_some()
    );
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(
        backend
            .extend(&lease.lock_id, ttl)
            .await
            .unwrap()
            .expires_at_ms()
            .is_none()
    );
    let forged = LockId::generate();
    assert!(!backend.release(&forged).await.unwrap().is_released());
    assert!(backend.acquire("", ttl).await.is_err());

    let events = events.lock().unwrap().clone();
    let summary: Vec<_> = events
        .iter()
        .map(|e| (e.operation, e.result, e.reason))
        .collect();
    assert_eq!(
        summary,
        [
            (Operation::Acquire, EventResult::Ok, None),
            (
                Operation::Acquire,
                EventResult::Fail,
                Some(EventReason::Locked)
            ),
            (Operation::IsLocked, EventResult::Ok, None),
            (Operation::Lookup, EventResult::Ok, None),
            (
                Operation::Extend,
                EventResult::Fail,
                Some(EventReason::Expired)
            ),
            (
                Operation::Release,
                EventResult::Fail,
                Some(EventReason::NotFound)
            ),
            (Operation::Acquire, EventResult::Fail, None),
        ]
    );
    let key_hash = hash_key("evt:1");
    let id_hash = hash_key(lease.lock_id.as_str());
    assert_eq!(events[0].key_hash.as_deref(), Some(key_hash.as_str()));
    assert_eq!(events[0].lock_id_hash.as_deref(), Some(id_hash.as_str()));
    assert_eq!(events[3].lock_id_hash.as_deref(), Some(id_hash.as_str()));
    assert_eq!(events[4].lock_id_hash.as_deref(), Some(id_hash.as_str()));
    assert_eq!(events[6].error, Some(ErrorCode::InvalidArgument));
    assert!(
        events
            .iter()
            .all(|e| e.key.is_none() && e.lock_id.is_none())
    );
    assert!(!format!("{:?}", events[0]).contains("evt:1"));
}

#[tokio::test]
async fn raw_identifiers_only_when_asked() {
    let (events, on_event) = recorder();
    let backend = with_telemetry(MemoryBackend::new(), on_event).with_raw_values(true);
    let lease = backend
        .acquire("raw:1", Duration::from_secs(5))
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(
        backend.release(&lease.lock_id).await.unwrap(),
        ReleaseOutcome::Released
    );
    let events = events.lock().unwrap();
    assert_eq!(events[0].key.as_deref(), Some("raw:1"));
    assert_eq!(events[0].lock_id.as_deref(), Some(lease.lock_id.as_str()));
    assert_eq!(events[1].lock_id.as_deref(), Some(lease.lock_id.as_str()));
    assert!(
        !format!("{:?}", events[0]).contains("raw:1"),
        "Debug stays redacted"
    );
}

#[tokio::test]
async fn a_panicking_callback_never_affects_the_operation() {
    let backend = with_telemetry(MemoryBackend::new(), |_| panic!("telemetry bug"));
    let lease = backend
        .acquire("panic:1", Duration::from_secs(5))
        .await
        .unwrap()
        .lease()
        .expect("acquired despite the callback");
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

/// An OpenTelemetry-decorated backend recording into in-memory exporters.
struct Otel {
    backend: OpenTelemetryBackend<MemoryBackend>,
    spans: InMemorySpanExporter,
    metrics: InMemoryMetricExporter,
    tracer_provider: SdkTracerProvider,
    meter_provider: SdkMeterProvider,
}

impl Otel {
    fn new() -> Self {
        let spans = InMemorySpanExporter::default();
        let metrics = InMemoryMetricExporter::default();
        let tracer_provider = SdkTracerProvider::builder()
            .with_simple_exporter(spans.clone())
            .build();
        let meter_provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(metrics.clone()).build())
            .build();
        let backend = with_opentelemetry(MemoryBackend::new())
            .with_providers(&tracer_provider, &meter_provider);
        Self {
            backend,
            spans,
            metrics,
            tracer_provider,
            meter_provider,
        }
    }

    fn spans(&self) -> Vec<SpanData> {
        self.tracer_provider.force_flush().unwrap();
        self.spans.get_finished_spans().unwrap()
    }

    fn metrics(&self) -> Vec<ResourceMetrics> {
        self.meter_provider.force_flush().unwrap();
        self.metrics.get_finished_metrics().unwrap()
    }
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// `(attributes, value)` of every point of a counter, or `(attributes, count)` of a histogram,
/// in the latest export.
fn points(metrics: &[ResourceMetrics], name: &str) -> Vec<(Vec<KeyValue>, f64)> {
    let latest = metrics.last().expect("an export");
    let mut found = Vec::new();
    for scope in latest.scope_metrics() {
        for metric in scope.metrics().filter(|m| m.name() == name) {
            match metric.data() {
                AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                    for point in sum.data_points() {
                        found.push((point.attributes().cloned().collect(), point.value() as f64));
                    }
                }
                AggregatedMetrics::F64(MetricData::Histogram(histogram)) => {
                    for point in histogram.data_points() {
                        found.push((point.attributes().cloned().collect(), point.count() as f64));
                    }
                }
                other => panic!("unexpected data for {name}: {other:?}"),
            }
        }
    }
    found
}

fn total(points: &[(Vec<KeyValue>, f64)], filters: &[(&str, &str)]) -> f64 {
    points
        .iter()
        .filter(|(attributes, _)| {
            filters
                .iter()
                .all(|(k, v)| attribute(attributes, k).as_deref() == Some(*v))
        })
        .map(|(_, value)| value)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_and_metrics_for_success_contention_expiry_and_loss() {
    let otel = Otel::new();
    let backend = &otel.backend;

    // Success, with a heartbeat in between, then a release.
    let short = LockOptions::builder()
        .ttl(Duration::from_millis(300))
        .build()
        .unwrap();
    let guard = syncguard::acquire(backend, "otel:ok", &short)
        .await
        .unwrap();
    let fence = guard.fence();
    tokio::time::sleep(Duration::from_millis(450)).await; // at least one heartbeat
    assert!(guard.release().await.unwrap());

    // Contention: a single attempt against a held lock.
    let holder = syncguard::acquire(backend, "otel:busy", &LockOptions::default())
        .await
        .unwrap();
    let once = LockOptions::builder()
        .retry(RetryPolicy::single_attempt())
        .build()
        .unwrap();
    let busy = syncguard::acquire(backend, "otel:busy", &once)
        .await
        .unwrap_err();
    assert_eq!(busy.code(), ErrorCode::Contended, "{busy}");
    holder.release().await.unwrap();

    // Expiry: extending a lock that expired.
    let lease = backend
        .acquire("otel:expired", Duration::from_millis(50))
        .await
        .unwrap()
        .lease()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(
        backend
            .extend(&lease.lock_id, Duration::from_secs(1))
            .await
            .unwrap()
            .expires_at_ms()
            .is_none()
    );

    // Loss: released behind the holder's back.
    let lost = syncguard::acquire(backend, "otel:lost", &short)
        .await
        .unwrap();
    assert!(
        backend
            .inner()
            .release(lost.lock_id())
            .await
            .unwrap()
            .is_released()
    );
    let reason = tokio::time::timeout(Duration::from_secs(10), lost.lost())
        .await
        .unwrap();
    assert_eq!(reason, LostReason::NotHeld);

    // An error: an invalid key.
    assert!(backend.is_locked("").await.is_err());

    // Spans.
    let spans = otel.spans();
    let acquires: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "syncguard.acquire")
        .collect();
    let ok = acquires
        .iter()
        .find(|s| attribute(&s.attributes, "syncguard.fence") == Some(fence.to_string()))
        .expect("the successful acquire's span carries its fence");
    assert_eq!(
        attribute(&ok.attributes, "syncguard.result").as_deref(),
        Some("ok")
    );
    assert_eq!(
        attribute(&ok.attributes, "syncguard.backend").as_deref(),
        Some("memory")
    );
    assert_eq!(
        attribute(&ok.attributes, "syncguard.key_hash"),
        Some(hash_key("otel:ok"))
    );
    assert!(attribute(&ok.attributes, "syncguard.lock_id_hash").is_some());
    assert!(
        attribute(&ok.attributes, "syncguard.key").is_none(),
        "raw keys stay out"
    );
    assert!(acquires.iter().any(|s| {
        attribute(&s.attributes, "syncguard.result").as_deref() == Some("fail")
            && attribute(&s.attributes, "syncguard.reason").as_deref() == Some("locked")
    }));
    let expired = spans
        .iter()
        .find(|s| {
            s.name == "syncguard.extend"
                && attribute(&s.attributes, "syncguard.reason").as_deref() == Some("expired")
        })
        .expect("the expired extend's span");
    assert_eq!(
        attribute(&expired.attributes, "syncguard.result").as_deref(),
        Some("fail")
    );
    let failed = spans
        .iter()
        .find(|s| s.name == "syncguard.is_locked")
        .expect("the failing is_locked span");
    assert_eq!(
        attribute(&failed.attributes, "error.type").as_deref(),
        Some("InvalidArgument")
    );
    assert!(matches!(failed.status, Status::Error { .. }));
    assert!(spans.iter().any(|s| s.name == "syncguard.release"));

    // Metrics.
    // The heartbeat counts its failed extend right after it records the loss, which `lost()`
    // may report first: the count is waited for (briefly), not assumed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let metrics = loop {
        let metrics = otel.metrics();
        let heartbeats = points(&metrics, "syncguard.heartbeats");
        if total(&heartbeats, &[("syncguard.result", "fail")]) >= 1.0
            || tokio::time::Instant::now() >= deadline
        {
            break metrics;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let operations = points(&metrics, "syncguard.operations");
    assert!(
        total(
            &operations,
            &[
                ("syncguard.operation", "acquire"),
                ("syncguard.result", "ok")
            ]
        ) >= 3.0
    );
    assert_eq!(
        total(
            &operations,
            &[
                ("syncguard.operation", "acquire"),
                ("syncguard.reason", "locked")
            ]
        ),
        1.0
    );
    assert_eq!(
        total(
            &operations,
            &[
                ("syncguard.operation", "extend"),
                ("syncguard.reason", "expired")
            ]
        ),
        1.0
    );
    assert_eq!(
        total(
            &operations,
            &[
                ("syncguard.operation", "isLocked"),
                ("error.type", "InvalidArgument")
            ]
        ),
        1.0
    );
    let durations = points(&metrics, "syncguard.operation.duration");
    assert!(total(&durations, &[("syncguard.operation", "release")]) >= 2.0);
    let waits = points(&metrics, "syncguard.acquire.wait");
    assert_eq!(total(&waits, &[("syncguard.result", "acquired")]), 3.0);
    assert_eq!(total(&waits, &[("syncguard.result", "gave_up")]), 1.0);
    let held = points(&metrics, "syncguard.lock.held");
    assert_eq!(total(&held, &[("syncguard.outcome", "released")]), 2.0);
    assert_eq!(total(&held, &[("syncguard.outcome", "lost")]), 1.0);
    let heartbeats = points(&metrics, "syncguard.heartbeats");
    assert!(total(&heartbeats, &[("syncguard.result", "ok")]) >= 1.0);
    assert!(
        total(&heartbeats, &[("syncguard.result", "fail")]) >= 1.0,
        "the lost lock's last extend"
    );
    let losses = points(&metrics, "syncguard.locks.lost");
    assert_eq!(total(&losses, &[("syncguard.reason", "not_held")]), 1.0);
}

#[tokio::test]
async fn raw_keys_are_exported_only_when_asked() {
    let otel = Otel::new();
    let backend = otel.backend.clone().with_raw_values(true);
    let lease = backend
        .acquire("otel:raw", Duration::from_secs(5))
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    let spans = otel.spans();
    let acquire = spans
        .iter()
        .find(|s| s.name == "syncguard.acquire")
        .unwrap();
    assert_eq!(
        attribute(&acquire.attributes, "syncguard.key").as_deref(),
        Some("otel:raw")
    );
    assert_eq!(
        attribute(&acquire.attributes, "syncguard.lock_id"),
        Some(lease.lock_id.to_string())
    );
}
