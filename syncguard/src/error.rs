//! The one error type of every lock operation.

use std::fmt;
use std::time::Duration;

use crate::lock_name::LockName;

/// A boxed driver error, kept as the [`source`](std::error::Error::source) of a [`LockError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a lock operation failed.
///
/// The first eight variants are the error codes of the reference design, so a Rust and a
/// TypeScript service report the same failure the same way ([`LockError::code`] gives the
/// reference name). Contention is *not* an error: a backend's `acquire` reports it as
/// [`AcquireOutcome::Contended`](crate::backend::AcquireOutcome::Contended),
/// [`try_acquire`](crate::try_acquire) as `Ok(None)`; only [`acquire`](crate::acquire) and
/// what builds on it turn it into [`LockError::Contended`] (no wait was allowed) or
/// [`LockError::AcquisitionTimeout`] (the wait ran out).
///
/// Branch on the predicates ([`is_retryable`](Self::is_retryable),
/// [`is_lock_lost`](Self::is_lock_lost), [`code`](Self::code)) rather than on messages.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The backend could not be reached or refused service (connection refused or reset,
    /// server shutting down, transaction conflict). Retrying later may succeed.
    #[error("lock backend unavailable: {message}")]
    ServiceUnavailable {
        /// What happened, for humans.
        message: String,
        /// The driver error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// The backend rejected the credentials or the permissions of this client.
    #[error(
        "lock backend rejected the credentials: {message}; check the user, password and permissions in the connection settings"
    )]
    AuthFailed {
        /// What happened, for humans.
        message: String,
        /// The driver error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// An argument was malformed (empty or oversized key, malformed lock id, zero ttl, bad
    /// table name or prefix) or the backend rejected the data as invalid. Nothing was changed.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// What was wrong and what is accepted.
        message: String,
        /// The driver error, if the backend raised it.
        #[source]
        source: Option<BoxError>,
    },

    /// The backend is throttling this client (rate limit, quota, exhausted pool).
    #[error("lock backend is rate limiting: {message}")]
    RateLimited {
        /// What happened, for humans.
        message: String,
        /// The driver error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// A network, pool or statement timeout elapsed before the backend answered. The
    /// operation may or may not have been applied.
    #[error("lock backend timed out: {message}")]
    NetworkTimeout {
        /// What happened, for humans.
        message: String,
        /// The driver error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// The lock is held by someone else, and the retry policy allowed no wait
    /// ([`RetryPolicy::single_attempt`](crate::RetryPolicy::single_attempt)).
    #[error(
        "lock {lock} is held by another owner; retry later, or wait for it with `RetryPolicy::wait_for`"
    )]
    Contended {
        /// The lock.
        lock: LockName,
    },

    /// The lock stayed held by someone else for as long as the caller was willing to wait.
    #[error(
        "lock {lock} still held by another owner after {attempts} attempt{} in {elapsed:?}; wait longer or retry later",
        if *attempts == 1 { "" } else { "s" }
    )]
    AcquisitionTimeout {
        /// The lock.
        lock: LockName,
        /// How many acquire attempts were made.
        attempts: u32,
        /// How long the caller waited in total.
        elapsed: Duration,
    },

    /// The operation was cancelled on request before it completed.
    #[error("lock operation aborted")]
    Aborted,

    /// An unexpected failure: unclassified driver errors, corrupt stored data, or a fence
    /// counter past its safe maximum.
    #[error("internal lock error: {message}")]
    Internal {
        /// What happened, for humans.
        message: String,
        /// The driver error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// The lock was lost while the work was running under it: the work was (or should be)
    /// stopped because another owner may now hold the lock.
    #[error("lock {lock} lost while held: {reason}")]
    LockLost {
        /// The lock.
        lock: LockName,
        /// Why the holder no longer owns the lock.
        reason: LostReason,
    },

    /// A lock was requested from the process-wide default backend, but none was set.
    #[error(
        "no default lock backend is configured; call `syncguard::set_default_backend(...)` at startup, or name a backend explicitly"
    )]
    NoDefaultBackend,
}

/// The reference design's name for a [`LockError`], for logs, metrics and cross-language
/// comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// See [`LockError::ServiceUnavailable`].
    ServiceUnavailable,
    /// See [`LockError::AuthFailed`].
    AuthFailed,
    /// See [`LockError::InvalidArgument`].
    InvalidArgument,
    /// See [`LockError::RateLimited`].
    RateLimited,
    /// See [`LockError::NetworkTimeout`].
    NetworkTimeout,
    /// See [`LockError::AcquisitionTimeout`].
    AcquisitionTimeout,
    /// See [`LockError::Contended`]. Not a code of the reference design, which reports a
    /// held lock as a result, not an error.
    Contended,
    /// See [`LockError::Aborted`].
    Aborted,
    /// See [`LockError::Internal`].
    Internal,
    /// See [`LockError::LockLost`].
    LockLost,
    /// See [`LockError::NoDefaultBackend`].
    NoDefaultBackend,
}

impl ErrorCode {
    /// The code as the reference design spells it (`"ServiceUnavailable"`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ServiceUnavailable => "ServiceUnavailable",
            Self::AuthFailed => "AuthFailed",
            Self::InvalidArgument => "InvalidArgument",
            Self::RateLimited => "RateLimited",
            Self::NetworkTimeout => "NetworkTimeout",
            Self::AcquisitionTimeout => "AcquisitionTimeout",
            Self::Contended => "Contended",
            Self::Aborted => "Aborted",
            Self::Internal => "Internal",
            Self::LockLost => "LockLost",
            Self::NoDefaultBackend => "NoDefaultBackend",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a held lock was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The backend answered that this lock id no longer holds the lock: it expired, or it was
    /// released or taken over behind the holder's back.
    NotHeld,
    /// The lease ran out before it was extended (the backend was unreachable or too slow, or
    /// the holder's thread was blocked past the lease), so the holder can no longer assume it
    /// owns the lock.
    LeaseExpired,
    /// The configured maximum hold time was reached, so the heartbeat stopped extending and
    /// the lease ran out.
    MaxHoldReached,
    /// [`shutdown`](crate::shutdown) released the lock while the guard still held it.
    Shutdown,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotHeld => "the backend no longer holds it for this owner",
            Self::LeaseExpired => "the lease expired before it could be extended",
            Self::MaxHoldReached => "the maximum hold time was reached",
            Self::Shutdown => "syncguard::shutdown released it",
        })
    }
}

macro_rules! constructors {
    ($($(#[$doc:meta])* $name:ident => $variant:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(message: impl Into<String>) -> Self {
                Self::$variant { message: message.into(), source: None }
            }
        )*
    };
}

impl LockError {
    constructors! {
        /// A [`LockError::ServiceUnavailable`] without a source.
        service_unavailable => ServiceUnavailable;
        /// A [`LockError::AuthFailed`] without a source.
        auth_failed => AuthFailed;
        /// A [`LockError::InvalidArgument`] without a source.
        invalid_argument => InvalidArgument;
        /// A [`LockError::RateLimited`] without a source.
        rate_limited => RateLimited;
        /// A [`LockError::NetworkTimeout`] without a source.
        network_timeout => NetworkTimeout;
        /// A [`LockError::Internal`] without a source.
        internal => Internal;
    }

    /// Attaches a driver error as the source. Variants without a source slot are returned
    /// unchanged.
    #[must_use]
    pub fn with_source(mut self, error: impl Into<BoxError>) -> Self {
        match &mut self {
            Self::ServiceUnavailable { source, .. }
            | Self::AuthFailed { source, .. }
            | Self::InvalidArgument { source, .. }
            | Self::RateLimited { source, .. }
            | Self::NetworkTimeout { source, .. }
            | Self::Internal { source, .. } => *source = Some(error.into()),
            Self::AcquisitionTimeout { .. }
            | Self::Contended { .. }
            | Self::Aborted
            | Self::LockLost { .. }
            | Self::NoDefaultBackend => {}
        }
        self
    }

    /// The reference design's code for this error.
    pub const fn code(&self) -> ErrorCode {
        match self {
            Self::ServiceUnavailable { .. } => ErrorCode::ServiceUnavailable,
            Self::AuthFailed { .. } => ErrorCode::AuthFailed,
            Self::InvalidArgument { .. } => ErrorCode::InvalidArgument,
            Self::RateLimited { .. } => ErrorCode::RateLimited,
            Self::NetworkTimeout { .. } => ErrorCode::NetworkTimeout,
            Self::AcquisitionTimeout { .. } => ErrorCode::AcquisitionTimeout,
            Self::Contended { .. } => ErrorCode::Contended,
            Self::Aborted => ErrorCode::Aborted,
            Self::Internal { .. } => ErrorCode::Internal,
            Self::LockLost { .. } => ErrorCode::LockLost,
            Self::NoDefaultBackend => ErrorCode::NoDefaultBackend,
        }
    }

    /// Whether the same call may succeed if made again later: the failure was transient
    /// (backend unavailable, throttled or slow, the lock busy or lost to another owner).
    /// Bad arguments, bad credentials, internal errors and missing configuration are not.
    pub const fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::ServiceUnavailable { .. }
                | Self::RateLimited { .. }
                | Self::NetworkTimeout { .. }
                | Self::AcquisitionTimeout { .. }
                | Self::Contended { .. }
                | Self::LockLost { .. }
        )
    }

    /// Whether the lock was lost while held.
    pub const fn is_lock_lost(&self) -> bool {
        matches!(self, Self::LockLost { .. })
    }

    /// Whether the lock was held by someone else ([`Contended`](Self::Contended), or
    /// [`AcquisitionTimeout`](Self::AcquisitionTimeout) after waiting).
    pub const fn is_contended(&self) -> bool {
        matches!(
            self,
            Self::Contended { .. } | Self::AcquisitionTimeout { .. }
        )
    }

    /// The lock this error is about, when the error is about one lock (contention, timeout,
    /// loss).
    pub fn lock(&self) -> Option<&LockName> {
        match self {
            Self::Contended { lock }
            | Self::AcquisitionTimeout { lock, .. }
            | Self::LockLost { lock, .. } => Some(lock),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn codes_use_reference_names() {
        assert_eq!(
            LockError::invalid_argument("x").code().as_str(),
            "InvalidArgument"
        );
        assert_eq!(LockError::Aborted.code().to_string(), "Aborted");
        let timeout = LockError::AcquisitionTimeout {
            lock: LockName::new("job:1", false),
            attempts: 1,
            elapsed: Duration::ZERO,
        };
        assert_eq!(timeout.code(), ErrorCode::AcquisitionTimeout);
        assert!(
            timeout.to_string().contains("after 1 attempt in"),
            "{timeout}"
        );
        let contended = LockError::Contended {
            lock: LockName::new("job:1", true),
        };
        assert_eq!(contended.code().as_str(), "Contended");
        assert!(contended.is_contended() && contended.is_retryable());
        assert!(contended.to_string().contains("\"job:1\""), "{contended}");
    }

    #[test]
    fn source_is_kept() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = LockError::service_unavailable("connect").with_source(io);
        let source = err.source().expect("source kept");
        assert_eq!(source.to_string(), "refused");
        assert!(err.to_string().contains("connect"));
    }

    #[test]
    fn retryable_classification() {
        assert!(LockError::service_unavailable("x").is_retryable());
        assert!(LockError::network_timeout("x").is_retryable());
        assert!(LockError::rate_limited("x").is_retryable());
        assert!(
            LockError::LockLost {
                lock: LockName::new("k", false),
                reason: LostReason::NotHeld
            }
            .is_retryable()
        );
        assert!(!LockError::invalid_argument("x").is_retryable());
        assert!(!LockError::auth_failed("x").is_retryable());
        assert!(!LockError::internal("x").is_retryable());
        assert!(!LockError::NoDefaultBackend.is_retryable());
        assert!(!LockError::Aborted.is_retryable());
    }
}
