//! The OpenTelemetry decorator's `syncguard.hold` spans: one per hold, child of the caller's
//! context, with the heartbeat's extends and the release as its children.

use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use syncguard::telemetry::with_opentelemetry;
use syncguard::{LockError, LockOptions, LostReason, MemoryBackend};

fn providers() -> (InMemorySpanExporter, SdkTracerProvider, SdkMeterProvider) {
    let spans = InMemorySpanExporter::default();
    let tracer_provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    (spans, tracer_provider, SdkMeterProvider::builder().build())
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv: &&KeyValue| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|span| span.name == name).collect()
}

#[tokio::test]
async fn heartbeats_and_the_release_are_children_of_the_hold_in_the_callers_trace() {
    let (exporter, tracer_provider, meter_provider) = providers();
    let backend =
        with_opentelemetry(MemoryBackend::new()).with_providers(&tracer_provider, &meter_provider);
    let options = LockOptions::builder()
        .ttl(Duration::from_millis(300))
        .build()
        .unwrap();

    let request = tracer_provider.tracer("test").start("request");
    let request_cx = Context::current_with_span(request);
    let request_ids = request_cx.span().span_context().clone();
    let work = async {
        syncguard::with_lock(&backend, "report:daily", &options, async |_guard| {
            // Long enough for several heartbeats (one every 100 ms).
            tokio::time::sleep(Duration::from_millis(700)).await;
            Ok::<_, LockError>(())
        })
        .await
    };
    let _attached = request_cx.clone().attach();
    work.await.unwrap();
    drop(_attached);
    request_cx.span().end();

    tracer_provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let holds = named(&spans, "syncguard.hold");
    assert_eq!(holds.len(), 1, "one hold span: {spans:#?}");
    let hold = holds[0];
    assert_eq!(hold.parent_span_id, request_ids.span_id());
    assert_eq!(hold.span_context.trace_id(), request_ids.trace_id());
    assert_eq!(
        attribute(hold, "syncguard.outcome").as_deref(),
        Some("released")
    );
    assert!(attribute(hold, "syncguard.key_hash").is_some());
    assert_eq!(
        attribute(hold, "syncguard.key"),
        None,
        "no raw key by default"
    );

    let extends = named(&spans, "syncguard.extend");
    assert!(extends.len() >= 2, "heartbeats ran: {}", extends.len());
    let releases = named(&spans, "syncguard.release");
    assert_eq!(releases.len(), 1);
    for child in extends.iter().chain(&releases) {
        assert_eq!(
            child.parent_span_id,
            hold.span_context.span_id(),
            "{}",
            child.name
        );
        assert_eq!(child.span_context.trace_id(), request_ids.trace_id());
    }
    let acquire = named(&spans, "syncguard.acquire");
    assert_eq!(acquire.len(), 1);
    assert_eq!(acquire[0].parent_span_id, request_ids.span_id());
}

#[tokio::test]
async fn a_lost_hold_ends_its_span_as_lost() {
    let (exporter, tracer_provider, meter_provider) = providers();
    let backend =
        with_opentelemetry(MemoryBackend::new()).with_providers(&tracer_provider, &meter_provider);
    let options = LockOptions::builder()
        .ttl(Duration::from_millis(100))
        .max_hold(Duration::from_millis(150))
        .build()
        .unwrap();
    let guard = syncguard::acquire(&backend, "job:capped", &options)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the hold cap ends the hold");
    assert_eq!(reason, LostReason::MaxHoldReached);
    drop(guard);

    tracer_provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let holds = named(&spans, "syncguard.hold");
    assert_eq!(holds.len(), 1, "{spans:#?}");
    assert_eq!(
        attribute(holds[0], "syncguard.outcome").as_deref(),
        Some("lost")
    );
    assert_eq!(
        attribute(holds[0], "syncguard.reason").as_deref(),
        Some("max_hold_reached")
    );
    // Without a caller's span, the hold is a root, and its calls are its children.
    assert_eq!(holds[0].parent_span_id, SpanId::INVALID);
    for extend in named(&spans, "syncguard.extend") {
        assert_eq!(extend.parent_span_id, holds[0].span_context.span_id());
    }
}
