//! Telemetry: decorators that are themselves backends and report every operation.
//!
//! - [`with_telemetry`] calls your function with a [`LockEvent`] per operation, as the
//!   reference design's `withTelemetry` does: operation, ok/fail, sanitized hashes of the key
//!   and lock id, and the failure reason (`locked`, `expired`, `not-found`). It returns a
//!   [`TelemetryBackend`].
//! - `with_opentelemetry` (feature `opentelemetry`) records a span per operation and
//!   metrics, including the waits, hold times, heartbeats and losses that the guard reports.
//!   It returns an `OpenTelemetryBackend`.
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

mod callback;
mod event;
mod instrumented;
#[cfg(feature = "opentelemetry")]
mod otel;

pub use callback::{TelemetryBackend, with_telemetry};
pub use event::{EventReason, EventResult, LockEvent, Operation};
#[cfg(feature = "opentelemetry")]
pub use otel::{OpenTelemetryBackend, with_opentelemetry};
