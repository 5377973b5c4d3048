//! The one error type of every lock operation.
//!
//! [`LockError`] is opaque, as `std::io::Error` and redis-rs's error are: callers ask it
//! questions ([`code`](LockError::code), the predicates, the accessors), so that a later
//! version can add kinds and details without breaking a `match`. What it holds is the private
//! [`Repr`], one box, so that `Result<T, LockError>` stays a pointer wide plus `T`.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::lock_name::LockName;

/// A boxed driver error, kept as the [`source`](std::error::Error::source) of a [`LockError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `std::result::Result` with [`LockError`] as the error: what every lock operation returns.
///
/// ```
/// fn check(key: &str) -> syncguard::Result<()> {
///     if key.is_empty() {
///         return Err(syncguard::LockError::invalid_argument("the key is empty"));
///     }
///     Ok(())
/// }
/// assert!(check("").is_err());
/// ```
pub type Result<T, E = LockError> = std::result::Result<T, E>;

/// Why a lock operation failed.
///
/// Ask it, rather than matching on its message: [`code`](Self::code) gives its kind (an
/// [`ErrorCode`], whose first eight values are the error codes of the reference design, so a
/// Rust and a TypeScript service report the same failure the same way), the predicates
/// ([`is_retryable`](Self::is_retryable), [`is_contended`](Self::is_contended),
/// [`is_lock_lost`](Self::is_lock_lost)) answer what callers usually branch on, and the
/// accessors give the details ([`lock`](Self::lock), [`lost_reason`](Self::lost_reason),
/// [`attempts`](Self::attempts), [`waited`](Self::waited),
/// [`holder_expires_at_ms`](Self::holder_expires_at_ms),
/// [`holder_lease_left`](Self::holder_lease_left), [`message`](Self::message), and the
/// driver error as [`source`](std::error::Error::source)).
///
/// Contention is *not* an error of a backend: its `acquire` reports it as
/// [`AcquireOutcome::Contended`](crate::backend::AcquireOutcome::Contended),
/// [`try_acquire`](crate::try_acquire) as `Ok(None)`; only [`acquire`](crate::acquire) and
/// what builds on it turn it into an error, [`ErrorCode::Contended`] (no wait was allowed) or
/// [`ErrorCode::AcquisitionTimeout`] (the wait ran out).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> syncguard::Result<()> {
/// use syncguard::{ErrorCode, LockOptions, MemoryBackend, RetryPolicy};
///
/// let backend = MemoryBackend::new();
/// let held = syncguard::acquire(&backend, "job:1", &LockOptions::default()).await?;
/// let hasty = LockOptions::builder().retry(RetryPolicy::single_attempt()).build()?;
/// let error = syncguard::acquire(&backend, "job:1", &hasty).await.unwrap_err();
/// assert_eq!(error.code(), ErrorCode::Contended);
/// assert!(error.is_contended() && error.is_retryable());
/// // The holder's lease (30 s, renewed by its heartbeat) bounds a sensible retry.
/// let left = error.holder_lease_left().expect("the memory backend reports it");
/// assert!(left <= std::time::Duration::from_secs(31));
/// held.release().await?;
/// # Ok(()) }
/// ```
pub struct LockError(Box<Repr>);

/// What a [`LockError`] holds: one variant per [`ErrorCode`]. Private, so that variants and
/// fields can change.
#[derive(Debug, thiserror::Error)]
enum Repr {
    #[error("lock backend unavailable: {message}")]
    ServiceUnavailable {
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    #[error(
        "lock backend rejected the credentials: {message}; check the user, password and permissions in the connection settings"
    )]
    AuthFailed {
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    #[error("invalid argument: {message}")]
    InvalidArgument {
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    #[error("lock backend is rate limiting: {message}")]
    RateLimited {
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    #[error("lock backend timed out: {message}")]
    NetworkTimeout {
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    #[error(
        "lock {lock} is held by another owner; retry later, or wait for it (`RetryPolicy::wait_for` in the options, `wait = \"5s\"` in `#[locked]`)"
    )]
    Contended {
        lock: LockName,
        holder: Option<HolderExpiry>,
    },

    #[error(
        "lock {lock} still held by another owner after {attempts} attempt{} in {waited:?}; wait longer or retry later",
        if *attempts == 1 { "" } else { "s" }
    )]
    AcquisitionTimeout {
        lock: LockName,
        attempts: u32,
        waited: Duration,
        holder: Option<HolderExpiry>,
    },

    #[error("lock operation aborted")]
    Aborted,

    #[error("internal lock error: {message}")]
    Internal {
        message: String,
        #[source]
        source: Option<BoxError>,
    },

    #[error("lock {lock} lost while held: {reason}")]
    LockLost { lock: LockName, reason: LostReason },

    #[error(
        "no default lock backend is configured; call `syncguard::set_default_backend(...)` at startup, or name a backend explicitly"
    )]
    NoDefaultBackend,
}

impl fmt::Debug for LockError {
    /// The kind and its details, as a variant would print (`Contended { lock: .., .. }`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl From<Repr> for LockError {
    fn from(repr: Repr) -> Self {
        Self(Box::new(repr))
    }
}

/// What a [`LockError`] is: its kind, one per way a lock operation fails. Also the reference
/// design's name of the failure, for logs, metrics and cross-language comparisons
/// ([`as_str`](Self::as_str)). Non-exhaustive: later versions may add kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The backend could not be reached or refused service (connection refused or reset,
    /// server shutting down, transaction conflict). Retrying later may succeed.
    ServiceUnavailable,
    /// The backend rejected the credentials or the permissions of this client.
    AuthFailed,
    /// An argument was malformed (empty or oversized key, malformed lock id, zero ttl, bad
    /// table name or prefix) or the backend rejected the data as invalid. Nothing was changed.
    InvalidArgument,
    /// The backend is throttling this client (rate limit, quota, exhausted pool).
    RateLimited,
    /// A network, pool or statement timeout elapsed before the backend answered. The
    /// operation may or may not have been applied.
    NetworkTimeout,
    /// The lock stayed held by someone else for as long as the caller was willing to wait
    /// ([`LockError::attempts`], [`LockError::waited`], and the holder's expiry at the last
    /// refusal: [`LockError::holder_expires_at_ms`]).
    AcquisitionTimeout,
    /// The lock is held by someone else, and the retry policy allowed no wait
    /// ([`RetryPolicy::single_attempt`](crate::RetryPolicy::single_attempt)); the holder's
    /// expiry is [`LockError::holder_expires_at_ms`]. Not a code of the reference design,
    /// which reports a held lock as a result, not an error.
    Contended,
    /// The operation was cancelled on request before it completed.
    Aborted,
    /// An unexpected failure: unclassified driver errors, corrupt stored data, or a fence
    /// counter past its safe maximum.
    Internal,
    /// The lock was lost while the work was running under it: the work was (or should be)
    /// stopped because another owner may now hold the lock ([`LockError::lost_reason`]).
    LockLost,
    /// A lock was requested from the process-wide default backend, but none was set.
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
    /// The lease ran out with the heartbeat off
    /// ([`LockOptionsBuilder::heartbeat`](crate::LockOptionsBuilder::heartbeat)`(false)`):
    /// nothing was going to extend it, and the work outlasted the ttl. Give a longer ttl, or
    /// turn the heartbeat on.
    TtlElapsed,
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
            Self::TtlElapsed => {
                "the ttl ran out with the heartbeat off, so nothing extended the lease; give a longer ttl, or turn the heartbeat on"
            }
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
                Repr::$variant { message: message.into(), source: None }.into()
            }
        )*
    };
}

impl LockError {
    constructors! {
        /// An [`ErrorCode::ServiceUnavailable`] error saying `message`, without a source
        /// (add one with [`with_source`](Self::with_source)). For backend authors.
        service_unavailable => ServiceUnavailable;
        /// An [`ErrorCode::AuthFailed`] error saying `message`, without a source.
        auth_failed => AuthFailed;
        /// An [`ErrorCode::InvalidArgument`] error saying `message` (what was wrong and what
        /// is accepted), without a source.
        invalid_argument => InvalidArgument;
        /// An [`ErrorCode::RateLimited`] error saying `message`, without a source.
        rate_limited => RateLimited;
        /// An [`ErrorCode::NetworkTimeout`] error saying `message`, without a source.
        network_timeout => NetworkTimeout;
        /// An [`ErrorCode::Internal`] error saying `message`, without a source.
        internal => Internal;
    }

    /// An [`ErrorCode::Aborted`] error: the operation was cancelled on request before it
    /// completed.
    ///
    /// ```
    /// let error = syncguard::LockError::aborted();
    /// assert_eq!(error.code(), syncguard::ErrorCode::Aborted);
    /// assert_eq!(error.to_string(), "lock operation aborted");
    /// ```
    pub fn aborted() -> Self {
        Repr::Aborted.into()
    }

    /// An [`ErrorCode::LockLost`] error: the lock named `lock` was lost, for `reason`, while
    /// the work ran under it. For integrations that run work under a guard themselves (a
    /// response body that streams under the lock, say) and must end it with the loss.
    ///
    /// ```
    /// use syncguard::{LockError, LockName, LostReason};
    ///
    /// let error = LockError::lock_lost(LockName::new("job:1", false), LostReason::NotHeld);
    /// assert!(error.is_lock_lost());
    /// assert_eq!(error.lost_reason(), Some(LostReason::NotHeld));
    /// ```
    pub fn lock_lost(lock: LockName, reason: LostReason) -> Self {
        Repr::LockLost { lock, reason }.into()
    }

    /// The error of [`acquire`](crate::acquire) on a held lock, after a single attempt.
    pub(crate) fn contended(lock: LockName, holder: Option<HolderExpiry>) -> Self {
        Repr::Contended { lock, holder }.into()
    }

    /// The error of [`acquire`](crate::acquire) on a lock that stayed held through a wait.
    pub(crate) fn acquisition_timeout(
        lock: LockName,
        attempts: u32,
        waited: Duration,
        holder: Option<HolderExpiry>,
    ) -> Self {
        Repr::AcquisitionTimeout {
            lock,
            attempts,
            waited,
            holder,
        }
        .into()
    }

    /// The error of the default backend asked for before one was set.
    pub(crate) fn no_default_backend() -> Self {
        Repr::NoDefaultBackend.into()
    }

    /// Attaches a driver error as the source. Errors of a kind without a driver error (about
    /// one lock, or [`ErrorCode::Aborted`] and [`ErrorCode::NoDefaultBackend`]) are returned
    /// unchanged.
    #[must_use]
    pub fn with_source(mut self, error: impl Into<BoxError>) -> Self {
        match &mut *self.0 {
            Repr::ServiceUnavailable { source, .. }
            | Repr::AuthFailed { source, .. }
            | Repr::InvalidArgument { source, .. }
            | Repr::RateLimited { source, .. }
            | Repr::NetworkTimeout { source, .. }
            | Repr::Internal { source, .. } => *source = Some(error.into()),
            Repr::AcquisitionTimeout { .. }
            | Repr::Contended { .. }
            | Repr::Aborted
            | Repr::LockLost { .. }
            | Repr::NoDefaultBackend => {}
        }
        self
    }

    /// What kind of error this is, as the reference design names it.
    pub fn code(&self) -> ErrorCode {
        match &*self.0 {
            Repr::ServiceUnavailable { .. } => ErrorCode::ServiceUnavailable,
            Repr::AuthFailed { .. } => ErrorCode::AuthFailed,
            Repr::InvalidArgument { .. } => ErrorCode::InvalidArgument,
            Repr::RateLimited { .. } => ErrorCode::RateLimited,
            Repr::NetworkTimeout { .. } => ErrorCode::NetworkTimeout,
            Repr::AcquisitionTimeout { .. } => ErrorCode::AcquisitionTimeout,
            Repr::Contended { .. } => ErrorCode::Contended,
            Repr::Aborted => ErrorCode::Aborted,
            Repr::Internal { .. } => ErrorCode::Internal,
            Repr::LockLost { .. } => ErrorCode::LockLost,
            Repr::NoDefaultBackend => ErrorCode::NoDefaultBackend,
        }
    }

    /// Whether the same call may succeed if made again later: the failure was transient
    /// (backend unavailable, throttled or slow, the lock busy or lost to another owner).
    /// Bad arguments, bad credentials, internal errors and missing configuration are not.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.code(),
            ErrorCode::ServiceUnavailable
                | ErrorCode::RateLimited
                | ErrorCode::NetworkTimeout
                | ErrorCode::AcquisitionTimeout
                | ErrorCode::Contended
                | ErrorCode::LockLost
        )
    }

    /// Whether the lock was lost while held ([`ErrorCode::LockLost`]).
    pub fn is_lock_lost(&self) -> bool {
        self.code() == ErrorCode::LockLost
    }

    /// Whether the lock was held by someone else ([`ErrorCode::Contended`], or
    /// [`ErrorCode::AcquisitionTimeout`] after waiting).
    pub fn is_contended(&self) -> bool {
        matches!(
            self.code(),
            ErrorCode::Contended | ErrorCode::AcquisitionTimeout
        )
    }

    /// The lock this error is about, when the error is about one lock (contention, timeout,
    /// loss).
    pub fn lock(&self) -> Option<&LockName> {
        match &*self.0 {
            Repr::Contended { lock, .. }
            | Repr::AcquisitionTimeout { lock, .. }
            | Repr::LockLost { lock, .. } => Some(lock),
            _ => None,
        }
    }

    /// Why the lock was lost, for an [`ErrorCode::LockLost`] error.
    pub fn lost_reason(&self) -> Option<LostReason> {
        match &*self.0 {
            Repr::LockLost { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    /// How many acquire attempts were made, for an [`ErrorCode::AcquisitionTimeout`] error
    /// (an [`ErrorCode::Contended`] error made one).
    pub fn attempts(&self) -> Option<u32> {
        match &*self.0 {
            Repr::AcquisitionTimeout { attempts, .. } => Some(*attempts),
            _ => None,
        }
    }

    /// How long the caller waited for the lock in total, for an
    /// [`ErrorCode::AcquisitionTimeout`] error.
    pub fn waited(&self) -> Option<Duration> {
        match &*self.0 {
            Repr::AcquisitionTimeout { waited, .. } => Some(*waited),
            _ => None,
        }
    }

    /// When the holder's lease ends, for a contended error ([`ErrorCode::Contended`], or
    /// [`ErrorCode::AcquisitionTimeout`] as of its last refusal), if the backend reported it
    /// with the refusal (every built-in backend does): Unix milliseconds of the backend's
    /// [time authority](crate::backend::TimeAuthority) (the server's clock for PostgreSQL and
    /// Redis), as [`Lease::expires_at_ms`](crate::backend::Lease::expires_at_ms) gives it.
    /// The lock stays live for the [tolerance](crate::backend::time::TIME_TOLERANCE_MS) past it, and
    /// the holder's heartbeat may extend it meanwhile; a release frees it earlier.
    pub fn holder_expires_at_ms(&self) -> Option<u64> {
        self.holder().map(|holder| holder.at_ms)
    }

    fn holder(&self) -> Option<HolderExpiry> {
        match &*self.0 {
            Repr::Contended { holder, .. } | Repr::AcquisitionTimeout { holder, .. } => *holder,
            _ => None,
        }
    }

    /// How long, from now, the holder can keep the lock without extending its lease: until
    /// [`holder_expires_at_ms`](Self::holder_expires_at_ms) plus the 1 s
    /// [liveness tolerance](crate::backend::time::TIME_TOLERANCE_MS), by this host's clock; zero once
    /// past. The longest a retry can be refused unless the holder extends its lease (its
    /// heartbeat does, every third of its ttl), so a bound for a `Retry-After`, not a
    /// prediction.
    ///
    /// The expiry is in the backend's time authority: where that is the server's clock
    /// (PostgreSQL, Redis), this host's clock offset from it moves the result by as much. A
    /// lease is never longer than its ttl, so bound the result by the ttl the holders use (plus
    /// the tolerance) before telling a client to wait that long.
    pub fn holder_lease_left(&self) -> Option<Duration> {
        let holder = self.holder()?;
        Some(holder.lease_ends.saturating_duration_since(Instant::now()))
    }

    /// What happened, for humans, as the backend (or the check that refused an argument)
    /// said it: the message of the six kinds made with one
    /// ([`service_unavailable`](Self::service_unavailable) and the others); `None` for the
    /// kinds whose message is made from their details.
    pub fn message(&self) -> Option<&str> {
        match &*self.0 {
            Repr::ServiceUnavailable { message, .. }
            | Repr::AuthFailed { message, .. }
            | Repr::InvalidArgument { message, .. }
            | Repr::RateLimited { message, .. }
            | Repr::NetworkTimeout { message, .. }
            | Repr::Internal { message, .. } => Some(message),
            _ => None,
        }
    }
}

/// The holder's expiry a refusal reported: as the store gave it, and when the lease it
/// allows ends by this host's monotonic clock (the expiry plus the liveness tolerance, read
/// against the store's time when the refusal came).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HolderExpiry {
    pub(crate) at_ms: u64,
    pub(crate) lease_ends: Instant,
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
        assert_eq!(LockError::aborted().code().to_string(), "Aborted");
        let timeout =
            LockError::acquisition_timeout(LockName::new("job:1", false), 1, Duration::ZERO, None);
        assert_eq!(timeout.code(), ErrorCode::AcquisitionTimeout);
        assert!(
            timeout.to_string().contains("after 1 attempt in"),
            "{timeout}"
        );
        let contended = LockError::contended(LockName::new("job:1", true), None);
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
        assert_eq!(err.message(), Some("connect"));
    }

    #[test]
    fn retryable_classification() {
        assert!(LockError::service_unavailable("x").is_retryable());
        assert!(LockError::network_timeout("x").is_retryable());
        assert!(LockError::rate_limited("x").is_retryable());
        assert!(
            LockError::lock_lost(LockName::new("k", false), LostReason::NotHeld).is_retryable()
        );
        assert!(!LockError::invalid_argument("x").is_retryable());
        assert!(!LockError::auth_failed("x").is_retryable());
        assert!(!LockError::internal("x").is_retryable());
        assert!(!LockError::no_default_backend().is_retryable());
        assert!(!LockError::aborted().is_retryable());
    }

    /// One box: a `Result` of a lock operation is no wider than a pointer plus its value.
    #[test]
    fn the_error_is_a_pointer_wide() {
        use std::mem::size_of;
        assert_eq!(size_of::<LockError>(), size_of::<usize>());
        assert_eq!(size_of::<Result<()>>(), size_of::<usize>());
        assert_eq!(size_of::<Result<u64>>(), 2 * size_of::<usize>());
    }

    /// The details of each kind, and only of its kind.
    #[test]
    fn the_accessors_answer_for_their_kind() {
        let lock = LockName::new("job:1", false);
        let far = 1_900_000_000_000;
        let holder = HolderExpiry {
            at_ms: far,
            lease_ends: Instant::now() + Duration::from_secs(61),
        };
        let contended = LockError::contended(lock.clone(), Some(holder));
        assert_eq!(contended.lock(), Some(&lock));
        assert_eq!(contended.holder_expires_at_ms(), Some(far));
        let left = contended.holder_lease_left().unwrap();
        // 60 s plus the 1 s tolerance, less the few milliseconds this test took.
        assert!(
            left > Duration::from_secs(59) && left <= Duration::from_secs(61),
            "{left:?}"
        );
        assert_eq!((contended.attempts(), contended.waited()), (None, None));

        let waited = Duration::from_millis(250);
        let past = HolderExpiry {
            at_ms: 1,
            lease_ends: Instant::now(),
        };
        let timeout = LockError::acquisition_timeout(lock.clone(), 3, waited, Some(past));
        assert_eq!(
            (timeout.attempts(), timeout.waited()),
            (Some(3), Some(waited))
        );
        assert_eq!(
            timeout.holder_lease_left(),
            Some(Duration::ZERO),
            "long past"
        );
        assert_eq!(timeout.lost_reason(), None);

        let unknown = LockError::contended(lock.clone(), None);
        assert_eq!(unknown.holder_lease_left(), None);

        let lost = LockError::lock_lost(lock.clone(), LostReason::Shutdown);
        assert_eq!(lost.lost_reason(), Some(LostReason::Shutdown));
        assert_eq!(lost.holder_expires_at_ms(), None);
        assert_eq!(lost.message(), None);

        let invalid = LockError::invalid_argument("bad").with_source(std::fmt::Error);
        assert_eq!(invalid.lock(), None);
        assert_eq!(invalid.holder_expires_at_ms(), None);
        // Debug shows the kind as a variant would.
        assert!(
            format!("{invalid:?}").starts_with("InvalidArgument {"),
            "{invalid:?}"
        );
    }

    /// A lease that ran out with the heartbeat off says so, and what to change; one that ran
    /// out while the heartbeat tried keeps its message.
    #[test]
    fn a_lease_without_heartbeat_says_what_to_change() {
        let lock = LockName::new("job:1", false);
        let off = LockError::lock_lost(lock.clone(), LostReason::TtlElapsed).to_string();
        assert!(off.contains("heartbeat off"), "{off}");
        assert!(
            off.contains("longer ttl") && off.contains("turn the heartbeat on"),
            "{off}"
        );
        assert!(!off.contains("before it could be extended"), "{off}");
        let on = LockError::lock_lost(lock, LostReason::LeaseExpired).to_string();
        assert!(
            on.ends_with("the lease expired before it could be extended"),
            "{on}"
        );
    }
}
