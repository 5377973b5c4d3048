//! What the callback decorator reports: [`LockEvent`], one per backend operation.

use std::fmt;

use crate::backend::NotHeldReason;
use crate::error::ErrorCode;

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

/// One backend operation, as [`with_telemetry`](super::with_telemetry) reports it.
/// Identifiers are sanitized hashes (see [`key_hash`](crate::key_hash)); the raw key and lock
/// id are filled only with [`TelemetryBackend::with_raw_values`](super::TelemetryBackend::with_raw_values)(super::TelemetryBackend::with_raw_values).
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
    /// The raw key (**sensitive**), only with [`TelemetryBackend::with_raw_values`](super::TelemetryBackend::with_raw_values).
    pub key: Option<String>,
    /// The raw lock id (**sensitive**), only with [`TelemetryBackend::with_raw_values`](super::TelemetryBackend::with_raw_values).
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
