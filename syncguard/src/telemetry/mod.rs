//! Telemetry: decorators that are themselves backends and report every operation.
//!
//! - [`with_telemetry`] calls your function with a [`LockEvent`] per operation, as the
//!   reference design's `withTelemetry` does: operation, ok/fail, sanitized hashes of the key
//!   and lock id, and the failure reason (`locked`, `expired`, `not-found`).
//! - `with_opentelemetry` (feature `opentelemetry`) records a span per operation and
//!   metrics, including the waits, hold times, heartbeats and losses that the guard reports.
//!
//! Nothing is hashed or recorded unless a decorator is in use, and a decorated backend passes
//! the same conformance suite as the one it wraps.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
//! use std::sync::{Arc, Mutex};
//! use syncguard::telemetry::{with_telemetry, EventResult, Operation};
//! use syncguard::{LockOptions, MemoryBackend};
//!
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let sink = Arc::clone(&seen);
//! let backend = with_telemetry(MemoryBackend::new(), move |event| {
//!     sink.lock().unwrap().push((event.operation, event.result));
//! });
//! let guard = syncguard::acquire(&backend, "job:1", &LockOptions::default()).await?;
//! guard.release().await?;
//! assert_eq!(
//!     *seen.lock().unwrap(),
//!     [(Operation::Acquire, EventResult::Ok), (Operation::Release, EventResult::Ok)]
//! );
//! # Ok(()) }
//! ```

#[cfg(feature = "opentelemetry")]
mod otel;

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "opentelemetry")]
pub use otel::{OpenTelemetry, OpenTelemetryBackend, with_opentelemetry};

use crate::backend::LockObserver;
use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockInfo, Lookup,
    NotHeldReason, ReleaseNotifier, ReleaseOutcome,
};
use crate::error::{ErrorCode, LockError};
use crate::fence::Fence;
use crate::key::hash_key;
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
/// [`Instrumented::include_raw`].
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
    /// The raw key (**sensitive**), only when `include_raw` is on.
    pub key: Option<String>,
    /// The raw lock id (**sensitive**), only when `include_raw` is on.
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

/// What one backend call did, as the decorators see it.
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
pub struct Call<'a> {
    pub(crate) operation: Operation,
    pub(crate) key: Option<&'a str>,
    pub(crate) lock_id: Option<&'a LockId>,
    pub(crate) result: EventResult,
    pub(crate) reason: Option<EventReason>,
    pub(crate) error: Option<&'a LockError>,
    // Recorded by the OpenTelemetry instrument only.
    #[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
    pub(crate) fence: Option<Fence>,
    #[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
    pub(crate) elapsed: Duration,
}

/// What a decorator does around each backend call. Sealed: the crate provides
/// [`EventSink`] and (feature `opentelemetry`) `OpenTelemetry`.
pub trait Instrument: Send + Sync + 'static + sealed::Sealed {
    #[doc(hidden)]
    type Span: Send;
    #[doc(hidden)]
    fn start(
        &self,
        operation: Operation,
        lock_id: Option<&LockId>,
        backend: &'static str,
    ) -> Self::Span;
    #[doc(hidden)]
    fn finish(&self, span: Self::Span, call: &Call<'_>, backend: &'static str);
    #[doc(hidden)]
    fn observer(self: &Arc<Self>, _backend: &'static str) -> Option<Arc<dyn LockObserver>> {
        None
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A backend wrapped by a telemetry decorator: the same backend, reporting every operation.
/// Cheap to clone when the inner backend is.
pub struct Instrumented<B, I> {
    inner: B,
    instrument: Arc<I>,
}

impl<B: Clone, I> Clone for Instrumented<B, I> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            instrument: Arc::clone(&self.instrument),
        }
    }
}

impl<B, I> Instrumented<B, I> {
    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }
}

impl<B: fmt::Debug, I> fmt::Debug for Instrumented<B, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instrumented")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// A backend that reports each operation to a function; see [`with_telemetry`].
pub type TelemetryBackend<B> = Instrumented<B, EventSink>;

/// Wraps `backend` so that `on_event` is called with a [`LockEvent`] after every operation.
///
/// The callback runs inline after the operation completes and must not block; a panic in it
/// is caught and logged, and never affects the lock operation or its result.
pub fn with_telemetry<B, F>(backend: B, on_event: F) -> TelemetryBackend<B>
where
    B: LockBackend,
    F: Fn(&LockEvent) + Send + Sync + 'static,
{
    Instrumented {
        inner: backend,
        instrument: Arc::new(EventSink {
            on_event: Arc::new(on_event),
            include_raw: false,
        }),
    }
}

impl<B> TelemetryBackend<B> {
    /// Also put the raw key and lock id in events. **Sensitive**: for debugging only.
    #[must_use]
    pub fn include_raw(self, include_raw: bool) -> Self {
        let on_event = Arc::clone(&self.instrument.on_event);
        Self {
            inner: self.inner,
            instrument: Arc::new(EventSink {
                on_event,
                include_raw,
            }),
        }
    }
}

/// The callback behind [`with_telemetry`].
pub struct EventSink {
    on_event: Arc<dyn Fn(&LockEvent) + Send + Sync>,
    include_raw: bool,
}

impl sealed::Sealed for EventSink {}

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

/// What a call's result reports: its result, reason, fence and new lock id.
type Classified<'a> = (
    EventResult,
    Option<EventReason>,
    Option<Fence>,
    Option<&'a LockId>,
);

impl<B: LockBackend, I: Instrument> Instrumented<B, I> {
    async fn observe<'a, T>(
        &'a self,
        operation: Operation,
        key: Option<&'a str>,
        lock_id: Option<&'a LockId>,
        call: BoxFuture<'a, Result<T, LockError>>,
        classify: impl FnOnce(&T) -> Classified<'_>,
    ) -> Result<T, LockError> {
        let backend = self.inner.capabilities().backend;
        let span = self.instrument.start(operation, lock_id, backend);
        let started = Instant::now();
        let result = call.await;
        let elapsed = started.elapsed();
        let (outcome, reason, fence, new_lock_id, error) = match &result {
            Ok(value) => {
                let (outcome, reason, fence, new_lock_id) = classify(value);
                (outcome, reason, fence, new_lock_id, None)
            }
            Err(error) => (EventResult::Fail, None, None, None, Some(error)),
        };
        self.instrument.finish(
            span,
            &Call {
                operation,
                key,
                lock_id: lock_id.or(new_lock_id),
                result: outcome,
                reason,
                error,
                fence,
                elapsed,
            },
            backend,
        );
        result
    }
}

impl<B: LockBackend, I: Instrument> LockBackend for Instrumented<B, I> {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.observe(
            Operation::Acquire,
            Some(key),
            None,
            self.inner.acquire(key, ttl),
            classify_acquire,
        ))
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        Box::pin(self.observe(
            Operation::Release,
            None,
            Some(lock_id),
            self.inner.release(lock_id),
            |outcome| match outcome {
                ReleaseOutcome::Released => (EventResult::Ok, None, None, None),
                ReleaseOutcome::NotHeld(reason) => {
                    (EventResult::Fail, reason.map(EventReason::from), None, None)
                }
            },
        ))
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(self.observe(
            Operation::Extend,
            None,
            Some(lock_id),
            self.inner.extend(lock_id, ttl),
            classify_extend,
        ))
    }

    fn acquire_as<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.observe(
            Operation::Acquire,
            Some(key),
            None,
            self.inner.acquire_as(key, ttl, holder),
            classify_acquire,
        ))
    }

    fn extend_by<'a>(
        &'a self,
        lock_id: &'a LockId,
        by: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(self.observe(
            Operation::Extend,
            None,
            Some(lock_id),
            self.inner.extend_by(lock_id, by),
            classify_extend,
        ))
    }

    fn expire_at<'a>(
        &'a self,
        lock_id: &'a LockId,
        expires_at_ms: u64,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(self.observe(
            Operation::Extend,
            None,
            Some(lock_id),
            self.inner.expire_at(lock_id, expires_at_ms),
            classify_extend,
        ))
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(self.observe(
            Operation::IsLocked,
            Some(key),
            None,
            self.inner.is_locked(key),
            |_| (EventResult::Ok, None, None, None),
        ))
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        let (key, lock_id) = match query {
            Lookup::Key(key) => (Some(key), None),
            Lookup::LockId(lock_id) => (None, Some(lock_id)),
        };
        Box::pin(self.observe(
            Operation::Lookup,
            key,
            lock_id,
            self.inner.lookup(query),
            |info| (EventResult::Ok, None, info.as_ref().map(|i| i.fence), None),
        ))
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn observer(&self) -> Option<Arc<dyn LockObserver>> {
        self.instrument
            .observer(self.inner.capabilities().backend)
            .or_else(|| self.inner.observer())
    }

    fn release_notifier(&self) -> Option<ReleaseNotifier> {
        self.inner.release_notifier()
    }
}

/// What an acquire's outcome reports.
fn classify_acquire(outcome: &AcquireOutcome) -> Classified<'_> {
    match outcome {
        AcquireOutcome::Acquired(lease) => (
            EventResult::Ok,
            None,
            Some(lease.fence),
            Some(&lease.lock_id),
        ),
        AcquireOutcome::Contended(_) => (EventResult::Fail, Some(EventReason::Locked), None, None),
    }
}

/// What an extend's outcome reports.
fn classify_extend(outcome: &ExtendOutcome) -> Classified<'_> {
    match outcome {
        ExtendOutcome::Extended { .. } => (EventResult::Ok, None, None, None),
        ExtendOutcome::NotHeld(reason) => {
            (EventResult::Fail, reason.map(EventReason::from), None, None)
        }
    }
}
