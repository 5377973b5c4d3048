//! OpenTelemetry spans and metrics (feature `opentelemetry`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry::global::{self, BoxedSpan, BoxedTracer};
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider};
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider,
};
use opentelemetry::{Context, KeyValue};

use super::event::Operation;
use super::instrumented::{Call, Instrument, Instrumented, decorator};
use crate::backend::key::hash_key;
use crate::backend::{Lease, LockBackend, LockObserver};
use crate::error::{LockError, LostReason};
use crate::lock_id::LockId;

/// The instrumentation scope name of every span and instrument.
const SCOPE: &str = "syncguard";

decorator! {
    /// A backend that records OpenTelemetry spans and metrics; see [`with_opentelemetry`].
    /// The same backend otherwise; cheap to clone when the wrapped one is.
    OpenTelemetryBackend(OpenTelemetry)
}

/// Wraps `backend` so that every operation records a span (`syncguard.acquire`,
/// `syncguard.release`, `syncguard.extend`, `syncguard.is_locked`, `syncguard.lookup`) and
/// metrics, with the global tracer and meter providers. Waits, hold times, heartbeats and
/// losses reported by [`acquire`](crate::acquire) and [`LockGuard`](crate::LockGuard) (and so
/// by [`with_lock`](crate::with_lock), `#[locked]` and the Tower layer) are recorded too.
///
/// | metric | kind | attributes |
/// |---|---|---|
/// | `syncguard.operations` | counter | `syncguard.operation`, `syncguard.result`, `syncguard.reason`, `syncguard.backend` |
/// | `syncguard.operation.duration` | histogram, s | `syncguard.operation`, `syncguard.result`, `syncguard.backend` |
/// | `syncguard.acquire.wait` | histogram, s | `syncguard.result` (`acquired` / `gave_up`), `syncguard.backend` |
/// | `syncguard.lock.held` | histogram, s | `syncguard.outcome` (`released` / `lost`), `syncguard.backend` |
/// | `syncguard.heartbeats` | counter | `syncguard.result` (`ok` / `fail`), `syncguard.backend` |
/// | `syncguard.locks.lost` | counter | `syncguard.reason`, `syncguard.backend` |
///
/// # Spans
/// - `syncguard.acquire`, `syncguard.is_locked`, `syncguard.lookup`: one per call, children of
///   the caller's current context.
/// - `syncguard.hold`: from the acquisition to the release or the loss of a lock taken through
///   [`acquire`](crate::acquire) and what builds on it, a child of the caller's context, with
///   `syncguard.outcome` (`released`, `not_held`, `release_failed`, `lost`) at its end.
/// - `syncguard.extend` (the heartbeat's included) and `syncguard.release`: children of their
///   lock's hold span, so that a long hold is one trace, not one root trace per heartbeat.
///
/// Span attributes: `syncguard.backend`, `syncguard.operation`, `syncguard.result`,
/// `syncguard.reason`, `syncguard.key_hash`, `syncguard.lock_id_hash`, `syncguard.fence`, and
/// `error.type` with an error status on failure. Raw keys and lock ids are never exported
/// unless [`OpenTelemetryBackend::with_raw_values`] turns them on.
///
/// ```
/// use syncguard::MemoryBackend;
/// use syncguard::telemetry::with_opentelemetry;
///
/// let backend = with_opentelemetry(MemoryBackend::new());
/// syncguard::set_default_backend(backend)?;
/// # Ok::<(), syncguard::LockError>(())
/// ```
pub fn with_opentelemetry<B: LockBackend>(backend: B) -> OpenTelemetryBackend<B> {
    let tracer = global::tracer(SCOPE);
    let meter = global::meter(SCOPE);
    OpenTelemetryBackend(Instrumented::new(
        backend,
        OpenTelemetry::new(tracer, &meter, false),
    ))
}

impl<B> OpenTelemetryBackend<B> {
    /// Records with these providers instead of the global ones.
    #[must_use]
    pub fn with_providers<T, M>(self, tracer_provider: &T, meter_provider: &M) -> Self
    where
        T: TracerProvider,
        T::Tracer: Send + Sync + 'static,
        <T::Tracer as opentelemetry::trace::Tracer>::Span: Send + Sync + 'static,
        M: MeterProvider,
    {
        let tracer = BoxedTracer::new(Box::new(tracer_provider.tracer(SCOPE)));
        let meter = meter_provider.meter(SCOPE);
        Self(
            self.0
                .map_instrument(|old| OpenTelemetry::new(tracer, &meter, old.include_raw)),
        )
    }

    /// Also export the raw key and lock id as `syncguard.key` and `syncguard.lock_id`.
    /// **Sensitive**: for debugging only.
    #[must_use]
    pub fn with_raw_values(self, include_raw: bool) -> Self {
        Self(self.0.map_instrument(|old| OpenTelemetry {
            include_raw,
            ..old.clone()
        }))
    }
}

/// The spans and instruments behind [`with_opentelemetry`].
#[derive(Clone)]
pub(super) struct OpenTelemetry {
    tracer: Arc<BoxedTracer>,
    operations: Counter<u64>,
    duration: Histogram<f64>,
    wait: Histogram<f64>,
    held: Histogram<f64>,
    heartbeats: Counter<u64>,
    lost: Counter<u64>,
    include_raw: bool,
    /// The context of each lock's open `syncguard.hold` span, by lock id.
    holds: Arc<Mutex<HashMap<LockId, Context>>>,
}

impl OpenTelemetry {
    fn new(tracer: BoxedTracer, meter: &Meter, include_raw: bool) -> Self {
        Self {
            tracer: Arc::new(tracer),
            operations: meter
                .u64_counter("syncguard.operations")
                .with_description("Backend operations, by operation, result and reason")
                .build(),
            duration: meter
                .f64_histogram("syncguard.operation.duration")
                .with_unit("s")
                .with_description("Duration of backend operations")
                .build(),
            wait: meter
                .f64_histogram("syncguard.acquire.wait")
                .with_unit("s")
                .with_description("Time from asking for a lock to getting it or giving up")
                .build(),
            held: meter
                .f64_histogram("syncguard.lock.held")
                .with_unit("s")
                .with_description("Time a lock was held, until released or lost")
                .build(),
            heartbeats: meter
                .u64_counter("syncguard.heartbeats")
                .with_description("Automatic extends by the heartbeat, by result")
                .build(),
            lost: meter
                .u64_counter("syncguard.locks.lost")
                .with_description("Locks lost while held, by reason")
                .build(),
            include_raw,
            holds: Arc::default(),
        }
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, HashMap<LockId, Context>> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens the hold span of a lock just acquired, under the caller's context.
    fn begin_hold(&self, key: &str, lease: &Lease, backend: &'static str) {
        let mut attributes = vec![
            KeyValue::new("syncguard.backend", backend),
            KeyValue::new("syncguard.key_hash", hash_key(key)),
            KeyValue::new("syncguard.lock_id_hash", hash_key(lease.lock_id.as_str())),
            KeyValue::new("syncguard.fence", lease.fence.to_string()),
        ];
        if self.include_raw {
            attributes.push(KeyValue::new("syncguard.key", key.to_owned()));
            attributes.push(KeyValue::new(
                "syncguard.lock_id",
                lease.lock_id.to_string(),
            ));
        }
        let builder = self
            .tracer
            .span_builder("syncguard.hold")
            .with_kind(SpanKind::Internal)
            .with_attributes(attributes);
        let span = self.tracer.build_with_context(builder, &Context::current());
        let hold = Context::current_with_span(span);
        self.holds().insert(lease.lock_id.clone(), hold);
    }

    /// Closes the hold span of `lock_id`, if open.
    fn end_hold(&self, lock_id: &LockId, outcome: &'static str, reason: Option<&'static str>) {
        let Some(hold) = self.holds().remove(lock_id) else {
            return;
        };
        let span = hold.span();
        span.set_attribute(KeyValue::new("syncguard.outcome", outcome));
        if let Some(reason) = reason {
            span.set_attribute(KeyValue::new("syncguard.reason", reason));
            span.set_status(Status::error(format!("lock lost: {reason}")));
        }
        span.end();
    }
}

fn span_name(operation: Operation) -> &'static str {
    match operation {
        Operation::Acquire => "syncguard.acquire",
        Operation::Release => "syncguard.release",
        Operation::Extend => "syncguard.extend",
        Operation::IsLocked => "syncguard.is_locked",
        Operation::Lookup => "syncguard.lookup",
    }
}

impl Instrument for OpenTelemetry {
    type Span = BoxedSpan;

    fn start(
        &self,
        operation: Operation,
        lock_id: Option<&LockId>,
        backend: &'static str,
    ) -> BoxedSpan {
        // The calls on a held lock belong to its hold.
        let hold = lock_id.and_then(|id| self.holds().get(id).cloned());
        let parent = hold.unwrap_or_else(Context::current);
        let builder = self
            .tracer
            .span_builder(span_name(operation))
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("syncguard.backend", backend),
                KeyValue::new("syncguard.operation", operation.as_str()),
            ]);
        self.tracer.build_with_context(builder, &parent)
    }

    fn finish(&self, mut span: BoxedSpan, call: &Call<'_>, backend: &'static str) {
        let mut attributes = vec![KeyValue::new("syncguard.result", call.result.as_str())];
        if let Some(reason) = call.reason {
            attributes.push(KeyValue::new("syncguard.reason", reason.as_str()));
        }
        if let Some(key) = call.key {
            attributes.push(KeyValue::new("syncguard.key_hash", hash_key(key)));
            if self.include_raw {
                attributes.push(KeyValue::new("syncguard.key", key.to_owned()));
            }
        }
        if let Some(lock_id) = call.lock_id {
            attributes.push(KeyValue::new(
                "syncguard.lock_id_hash",
                hash_key(lock_id.as_str()),
            ));
            if self.include_raw {
                attributes.push(KeyValue::new("syncguard.lock_id", lock_id.to_string()));
            }
        }
        if let Some(fence) = call.fence {
            attributes.push(KeyValue::new("syncguard.fence", fence.to_string()));
        }
        if let Some(error) = call.error {
            attributes.push(KeyValue::new("error.type", error.code().as_str()));
            span.set_status(Status::error(error.to_string()));
        }
        span.set_attributes(attributes);
        span.end();
        // A release, whatever its answer, ends the hold it belongs to.
        if let (Operation::Release, Some(lock_id)) = (call.operation, call.lock_id) {
            let outcome = match (call.result, call.error) {
                (super::EventResult::Ok, _) => "released",
                (_, Some(_)) => "release_failed",
                (_, None) => "not_held",
            };
            self.end_hold(lock_id, outcome, None);
        }

        let mut labels = vec![
            KeyValue::new("syncguard.operation", call.operation.as_str()),
            KeyValue::new("syncguard.result", call.result.as_str()),
            KeyValue::new("syncguard.backend", backend),
        ];
        self.duration.record(call.elapsed.as_secs_f64(), &labels);
        if let Some(reason) = call.reason {
            labels.push(KeyValue::new("syncguard.reason", reason.as_str()));
        }
        if let Some(error) = call.error {
            labels.push(KeyValue::new("error.type", error.code().as_str()));
        }
        self.operations.add(1, &labels);
    }

    fn observer(self: &Arc<Self>, backend: &'static str) -> Option<Arc<dyn LockObserver>> {
        Some(Arc::new(Observer {
            otel: Arc::clone(self),
            backend,
        }))
    }
}

/// Records what the guard and the acquire helper report.
struct Observer {
    otel: Arc<OpenTelemetry>,
    backend: &'static str,
}

impl Observer {
    fn labels(&self, name: &'static str, value: &'static str) -> [KeyValue; 2] {
        [
            KeyValue::new(name, value),
            KeyValue::new("syncguard.backend", self.backend),
        ]
    }
}

impl LockObserver for Observer {
    fn acquired(&self, key: &str, lease: &Lease, wait: Duration, _attempts: u32) {
        self.otel.begin_hold(key, lease, self.backend);
        self.otel.wait.record(
            wait.as_secs_f64(),
            &self.labels("syncguard.result", "acquired"),
        );
    }

    fn gave_up(&self, _key: &str, _error: &LockError, wait: Duration, _attempts: u32) {
        self.otel.wait.record(
            wait.as_secs_f64(),
            &self.labels("syncguard.result", "gave_up"),
        );
    }

    fn heartbeat(&self, _key: &str, _lock_id: &LockId, ok: bool) {
        let result = if ok { "ok" } else { "fail" };
        self.otel
            .heartbeats
            .add(1, &self.labels("syncguard.result", result));
    }

    fn released(&self, _key: &str, lock_id: &LockId, held: Duration) {
        self.otel.end_hold(lock_id, "released", None);
        self.otel.held.record(
            held.as_secs_f64(),
            &self.labels("syncguard.outcome", "released"),
        );
    }

    fn lost(&self, _key: &str, lock_id: &LockId, reason: LostReason, held: Duration) {
        self.otel.held.record(
            held.as_secs_f64(),
            &self.labels("syncguard.outcome", "lost"),
        );
        let reason = match reason {
            LostReason::NotHeld => "not_held",
            LostReason::LeaseExpired => "lease_expired",
            LostReason::TtlElapsed => "ttl_elapsed",
            LostReason::MaxHoldReached => "max_hold_reached",
            LostReason::Shutdown => "shutdown",
        };
        self.otel.end_hold(lock_id, "lost", Some(reason));
        self.otel
            .lost
            .add(1, &self.labels("syncguard.reason", reason));
    }
}
