//! What the backend operations exchange: leases, outcomes, queries, capabilities.

use std::fmt;

use crate::fence::Fence;
use crate::lock_id::LockId;

/// A successful acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// The handle for release and extend.
    pub lock_id: LockId,
    /// When the lock expires, in Unix milliseconds of the backend's time authority.
    pub expires_at_ms: u64,
    /// The fencing token of this acquisition.
    pub fence: Fence,
}

impl Lease {
    /// A lease, as a backend reports it.
    pub fn new(lock_id: LockId, expires_at_ms: u64, fence: Fence) -> Self {
        Self {
            lock_id,
            expires_at_ms,
            fence,
        }
    }
}

/// The result of one acquire attempt. Non-exhaustive, as are the other outcomes: later
/// versions may report more.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
#[non_exhaustive]
pub enum AcquireOutcome {
    /// The lock was taken.
    Acquired(Lease),
    /// A live lock already holds the key (telemetry reason `"locked"`), and what the backend
    /// learnt of it.
    Contended(Contention),
}

impl AcquireOutcome {
    /// A refusal, with the holder's expiry if the backend learnt it (see [`Contention`]).
    pub const fn contended(holder_expires_at_ms: Option<u64>) -> Self {
        Self::Contended(Contention {
            holder_expires_at_ms,
        })
    }

    /// The lease, if the lock was taken.
    pub fn lease(self) -> Option<Lease> {
        match self {
            Self::Acquired(lease) => Some(lease),
            Self::Contended(_) => None,
        }
    }

    /// Whether another owner holds the key.
    pub const fn is_contended(&self) -> bool {
        matches!(self, Self::Contended(_))
    }
}

/// What a refused acquire learnt of the lock that holds the key.
///
/// A waiter uses the holder's expiry to bound its sleep: a lock that expires without being
/// released announces nothing, so the waiter tries again when the lease ends rather than at
/// its next poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Contention {
    /// The holder's expiry, as [`Lease::expires_at_ms`] gives it (Unix milliseconds of the
    /// backend's time authority; the lock stays live for the
    /// [tolerance](crate::backend::time::TIME_TOLERANCE_MS) past it), if the backend learnt it with the
    /// refusal (no extra I/O is spent on it).
    pub holder_expires_at_ms: Option<u64>,
}

/// Why a release or extend found no live lock for its lock id, when the backend learnt it
/// without extra I/O. Telemetry reports it; the public outcome is just "not held".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NotHeldReason {
    /// The lock was found but had expired.
    Expired,
    /// No lock was found for the lock id.
    NotFound,
}

impl NotHeldReason {
    /// The telemetry spelling: `"expired"` or `"not-found"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::NotFound => "not-found",
        }
    }
}

impl fmt::Display for NotHeldReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// The lock was live and is now released.
    Released,
    /// No live lock was held by the lock id; nothing changed. The reason is `None` when the
    /// backend could not tell without extra I/O.
    NotHeld(Option<NotHeldReason>),
}

impl ReleaseOutcome {
    /// Whether this call released the lock.
    pub const fn is_released(&self) -> bool {
        matches!(self, Self::Released)
    }
}

/// The result of an extend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
#[non_exhaustive]
pub enum ExtendOutcome {
    /// The lock now expires at `expires_at_ms` (Unix ms, the backend's time authority).
    Extended {
        /// The new authoritative expiry: schedule the next extend from it.
        expires_at_ms: u64,
    },
    /// No live lock was held by the lock id; nothing changed (an expired lock is not revived).
    NotHeld(Option<NotHeldReason>),
}

impl ExtendOutcome {
    /// The new expiry, if the lock was extended.
    pub const fn expires_at_ms(&self) -> Option<u64> {
        match self {
            Self::Extended { expires_at_ms } => Some(*expires_at_ms),
            Self::NotHeld(_) => None,
        }
    }
}

/// What a [`LockBackend::lookup`](super::LockBackend::lookup) looks for. Exhaustive: a backend answers every query.
#[derive(Debug, Clone, Copy)]
pub enum Lookup<'a> {
    /// The live lock on this key (direct access).
    Key(&'a str),
    /// The live lock held by this lock id (reverse lookup, then an ownership check).
    LockId(&'a LockId),
}

/// Whose clock decides expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimeAuthority {
    /// The server's clock (PostgreSQL `now()`, Redis `TIME`): client clocks do not matter.
    Server,
    /// Each client's clock: clients must be NTP-synchronized well within the 1 s tolerance.
    Client,
}

/// What a backend is and guarantees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The backend's name (`"memory"`, `"postgres"`, `"redis"`, `"firestore"`).
    pub backend: &'static str,
    /// Whether acquisitions carry fencing tokens (all built-in backends do).
    pub supports_fencing: bool,
    /// Whose clock decides expiry.
    pub time_authority: TimeAuthority,
    /// Whether the backend stores holders:
    /// [`acquire_as`](super::LockBackend::acquire_as) and
    /// [`extend_by`](super::LockBackend::extend_by).
    pub holders: bool,
}

impl Capabilities {
    /// Capabilities of a fencing backend.
    pub const fn new(backend: &'static str, time_authority: TimeAuthority) -> Self {
        Self {
            backend,
            supports_fencing: true,
            time_authority,
            holders: false,
        }
    }

    /// These capabilities, with holders stored.
    #[must_use]
    pub const fn with_holders(mut self) -> Self {
        self.holders = true;
        self
    }
}
