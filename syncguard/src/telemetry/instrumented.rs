//! The decorator both telemetry backends are made of: a backend whose every call an
//! [`Instrument`] observes.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::event::{EventReason, EventResult, Operation};
use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockInfo, LockObserver,
    Lookup, ReleaseNotifier, ReleaseOutcome,
};
use crate::error::LockError;
use crate::fence::Fence;
use crate::lock_id::LockId;

/// What one backend call did, as the decorators see it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Call<'a> {
    pub(super) operation: Operation,
    pub(super) key: Option<&'a str>,
    pub(super) lock_id: Option<&'a LockId>,
    pub(super) result: EventResult,
    pub(super) reason: Option<EventReason>,
    pub(super) error: Option<&'a LockError>,
    // Recorded by the OpenTelemetry instrument only.
    #[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
    pub(super) fence: Option<Fence>,
    #[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
    pub(super) elapsed: Duration,
}

/// What a decorator does around each backend call: the callback of `with_telemetry`, or
/// (feature `opentelemetry`) the spans and metrics of `with_opentelemetry`.
pub(super) trait Instrument: Send + Sync + 'static {
    type Span: Send;
    fn start(
        &self,
        operation: Operation,
        lock_id: Option<&LockId>,
        backend: &'static str,
    ) -> Self::Span;
    fn finish(&self, span: Self::Span, call: &Call<'_>, backend: &'static str);
    fn observer(self: &Arc<Self>, _backend: &'static str) -> Option<Arc<dyn LockObserver>> {
        None
    }
}

/// A backend wrapped by a telemetry decorator: the same backend, reporting every operation.
/// Cheap to clone when the inner backend is. Users see it as the [`decorator!`] types.
pub(super) struct Instrumented<B, I> {
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
    pub(super) fn new(inner: B, instrument: I) -> Self {
        Self {
            inner,
            instrument: Arc::new(instrument),
        }
    }

    /// The wrapped backend.
    pub(super) fn inner(&self) -> &B {
        &self.inner
    }

    /// The same backend with another instrument made from this one.
    pub(super) fn map_instrument(self, change: impl FnOnce(&I) -> I) -> Self {
        let instrument = change(&self.instrument);
        Self::new(self.inner, instrument)
    }
}

impl<B: fmt::Debug, I> fmt::Debug for Instrumented<B, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instrumented")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
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

/// Declares a public decorator type: a newtype over [`Instrumented`] with one instrument, so
/// that users name one type per decorator and the machinery stays private.
macro_rules! decorator {
    ($(#[$doc:meta])* $name:ident($instrument:ty)) => {
        $(#[$doc])*
        pub struct $name<B>(super::instrumented::Instrumented<B, $instrument>);

        impl<B: Clone> Clone for $name<B> {
            fn clone(&self) -> Self {
                Self(self.0.clone())
            }
        }

        impl<B: std::fmt::Debug> std::fmt::Debug for $name<B> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_tuple(stringify!($name)).field(self.0.inner()).finish()
            }
        }

        impl<B> $name<B> {
            /// The wrapped backend.
            pub fn inner(&self) -> &B {
                self.0.inner()
            }
        }

        crate::backend::forward_backend!(impl[B: crate::backend::LockBackend] $name<B> => |this| this.0);
    };
}
pub(super) use decorator;
