//! The callback decorator: [`with_telemetry`] and the [`LockEvent`] it reports.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::instrumented::{Call, Instrument, Instrumented, decorator};
use crate::backend::key::hash_key;
use crate::backend::{LockBackend, NotHeldReason};
use crate::error::{ErrorCode, LockError};
use crate::lock_id::LockId;

/// The five backend operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// `acquire`.
    Acquire,
    /// `release`.
    Release,
    /// `extend`.
    Extend,
    /// `is_locked`.
    IsLocked,
    /// `lookup`, by key or lock id.
    Lookup,
}

impl Operation {
    /// The reference design's name: `acquire`, `release`, `extend`, `isLocked`, `lookup`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Release => "release",
            Self::Extend => "extend",
            Self::IsLocked => "isLocked",
            Self::Lookup => "lookup",
        }
    }
}

/// Whether an operation did what was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventResult {
    /// Acquired, released, extended; `is_locked` and `lookup` are always ok unless they error.
    Ok,
    /// Contended, not held, or an error.
    Fail,
}

impl EventResult {
    /// `ok` or `fail`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Fail => "fail",
        }
    }
}

/// Why an operation failed, when it failed as a domain outcome rather than an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventReason {
    /// Acquire: another owner holds the key.
    Locked,
    /// Release or extend: the lock had expired.
    Expired,
    /// Release or extend: no lock for the lock id.
    NotFound,
}

impl EventReason {
    /// `locked`, `expired` or `not-found`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Locked => "locked",
            Self::Expired => "expired",
            Self::NotFound => "not-found",
        }
    }
}

impl From<NotHeldReason> for EventReason {
    fn from(reason: NotHeldReason) -> Self {
        match reason {
            NotHeldReason::Expired => Self::Expired,
            NotHeldReason::NotFound => Self::NotFound,
        }
    }
}

/// One backend operation, as [`with_telemetry`] reports it. Identifiers are sanitized hashes
/// (see [`hash_key`]); the raw key and lock id are filled only with
/// [`TelemetryBackend::with_raw_values`].
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockEvent {
    /// Which operation.
    pub operation: Operation,
    /// Ok or fail.
    pub result: EventResult,
    /// Hash of the key, for operations on a key.
    pub key_hash: Option<String>,
    /// Hash of the lock id, for operations on a lock id (and a successful acquire).
    pub lock_id_hash: Option<String>,
    /// Why it failed, for contention and not-held outcomes.
    pub reason: Option<EventReason>,
    /// The error's code, when the operation returned an error.
    pub error: Option<ErrorCode>,
    /// The raw key (**sensitive**), only with [`TelemetryBackend::with_raw_values`].
    pub key: Option<String>,
    /// The raw lock id (**sensitive**), only with [`TelemetryBackend::with_raw_values`].
    pub lock_id: Option<String>,
}

impl fmt::Debug for LockEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("LockEvent");
        debug
            .field("operation", &self.operation.as_str())
            .field("result", &self.result.as_str())
            .field("key_hash", &self.key_hash)
            .field("lock_id_hash", &self.lock_id_hash)
            .field("reason", &self.reason.map(EventReason::as_str))
            .field("error", &self.error);
        if self.key.is_some() || self.lock_id.is_some() {
            debug.field("key", &"<raw>").field("lock_id", &"<raw>");
        }
        debug.finish()
    }
}

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
