//! The callback decorator: [`with_telemetry`], which reports a [`LockEvent`] per operation.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::event::{LockEvent, Operation};
use super::instrumented::{Call, Instrument, Instrumented, decorator};
use crate::backend::LockBackend;
use crate::backend::key::hash_key;
use crate::error::LockError;
use crate::lock_id::LockId;

decorator! {
    /// A backend that reports each operation to a function; see [`with_telemetry`]. The same
    /// backend otherwise; cheap to clone when the wrapped one is.
    TelemetryBackend(EventSink)
}

/// Wraps `backend` so that `on_event` is called with a [`LockEvent`] after every operation.
///
/// The callback runs inline after the operation completes and must not block; a panic in it
/// is caught and logged, and never affects the lock operation or its result.
pub fn with_telemetry<B, F>(backend: B, on_event: F) -> TelemetryBackend<B>
where
    B: LockBackend,
    F: Fn(&LockEvent) + Send + Sync + 'static,
{
    TelemetryBackend(Instrumented::new(
        backend,
        EventSink {
            on_event: Arc::new(on_event),
            include_raw: false,
        },
    ))
}

impl<B> TelemetryBackend<B> {
    /// Also put the raw key and lock id in events ([`LockEvent::key`],
    /// [`LockEvent::lock_id`]). **Sensitive**: for debugging only.
    #[must_use]
    pub fn with_raw_values(self, include_raw: bool) -> Self {
        Self(self.0.map_instrument(|sink| EventSink {
            on_event: Arc::clone(&sink.on_event),
            include_raw,
        }))
    }
}

/// The callback behind [`with_telemetry`].
pub(super) struct EventSink {
    on_event: Arc<dyn Fn(&LockEvent) + Send + Sync>,
    include_raw: bool,
}

impl Instrument for EventSink {
    type Span = ();

    fn start(&self, _: Operation, _: Option<&LockId>, _: &'static str) {}

    fn finish(&self, (): (), call: &Call<'_>, _: &'static str) {
        let event = LockEvent {
            operation: call.operation,
            result: call.result,
            key_hash: call.key.map(hash_key),
            lock_id_hash: call.lock_id.map(|id| hash_key(id.as_str())),
            reason: call.reason,
            error: call.error.map(LockError::code),
            key: call.key.filter(|_| self.include_raw).map(str::to_owned),
            lock_id: call
                .lock_id
                .filter(|_| self.include_raw)
                .map(|id| id.as_str().to_owned()),
        };
        let delivered = catch_unwind(AssertUnwindSafe(|| (self.on_event)(&event)));
        if delivered.is_err() {
            tracing::error!(
                operation = event.operation.as_str(),
                "syncguard telemetry callback panicked; the lock operation was not affected"
            );
        }
    }
}
