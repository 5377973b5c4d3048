//! LockServiceCentral's lock semantics (its specification's section 4) over any syncguard
//! backend that stores holders.
//!
//! | LSC | here |
//! |---|---|
//! | record `namespace:lockName` | the syncguard key `namespace:lockName` |
//! | owner + instanceId | the lock's holder ([`holder`](crate::holder)) |
//! | acquire: free, expired or same holder → replace with `expiry = now + D` | `acquire_as(key, D, holder)`: re-entrant by holder, which restarts the lease and keeps the lock id and fence |
//! | renew: live and same holder → `expiry += D`, `leaseDuration += D` | lookup, holder check, `extend_by(lock id, D)`; `leaseDuration = expiry − acquire second` |
//! | release: none or expired → success; other holder → 423; else delete | lookup, holder check, `release(lock id)` |
//! | `expiry`, epoch seconds, inclusive | `floor(expires_at_ms / 1000)` |
//!
//! The lock id never leaves the server: a client proves ownership with its pair, and the
//! server acts with the lock id it looked up, so a lock that changed hands in between (a new
//! lock id) is never touched. Every time is the backend's (its time authority).

use std::sync::Arc;
use std::time::Duration;

use syncguard::backend::LockBackend;
use syncguard::{Fence, LockError, LockInfo, RevealedLockInfo, get_by_key};

use crate::holder;

/// How often a release retries when the lock changed under it (a lapse and a re-acquire by
/// the same holder between the lookup and the release).
const RELEASE_ATTEMPTS: usize = 3;

/// A held lock, as a successful acquire or renew reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The last second the lock is held in (epoch seconds, inclusive).
    pub(crate) expiry: u64,
    /// Seconds from the acquisition to `expiry`: D after an acquire, the running total after
    /// renews.
    pub(crate) lease_duration: u64,
    /// The acquisition's fencing token.
    pub(crate) fence: Fence,
}

/// A held lock, as GET reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holding {
    /// The owner, when the lock was taken through this server (`None`: a lock taken by a
    /// syncguard client directly, which has no owner).
    pub(crate) owner: Option<String>,
    /// The last second the lock is held in.
    pub(crate) expiry: u64,
    /// The acquisition's fencing token.
    pub(crate) fence: Fence,
}

/// What an operation did, in the words of LSC's request log (`lock_service_outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Found,
    NotFound,
    Acquired,
    AcquireConflict,
    Renewed,
    RenewNotFound,
    RenewMismatch,
    RenewExpired,
    Released,
    ReleasedNotFound,
    ReleasedExpired,
    ReleaseConflict,
}

impl Outcome {
    /// The log spelling.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Found => "FOUND",
            Self::NotFound => "NOT_FOUND",
            Self::Acquired => "ACQUIRED",
            Self::AcquireConflict => "ACQUIRE_CONFLICT",
            Self::Renewed => "RENEWED",
            Self::RenewNotFound => "RENEW_NOT_FOUND",
            Self::RenewMismatch => "RENEW_MISMATCH",
            Self::RenewExpired => "RENEW_EXPIRED",
            Self::Released => "RELEASED",
            Self::ReleasedNotFound => "RELEASED_NOT_FOUND",
            Self::ReleasedExpired => "RELEASED_EXPIRED",
            Self::ReleaseConflict => "RELEASE_CONFLICT",
        }
    }

    /// LSC's `lock_result`: `success`, `conflict` or `not_found`.
    pub(crate) const fn result(self) -> &'static str {
        match self {
            Self::NotFound | Self::ReleasedNotFound | Self::RenewNotFound => "not_found",
            Self::AcquireConflict
            | Self::RenewMismatch
            | Self::RenewExpired
            | Self::ReleaseConflict => "conflict",
            _ => "success",
        }
    }
}

/// The answer of a mutation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Held by the caller: 200 with the lock.
    Granted(Grant),
    /// Released, or nothing to release: 200 `{"success":true,...}`.
    Cleared,
    /// Another holder's lock, or none to renew: 423.
    Refused,
}

/// LSC's operations over a backend.
#[derive(Clone)]
pub(crate) struct Locks {
    backend: Arc<dyn LockBackend>,
}

impl Locks {
    pub(crate) fn new(backend: Arc<dyn LockBackend>) -> Self {
        Self { backend }
    }

    /// The live lock on `key`, with its raw holder and lock id.
    async fn lookup(&self, key: &str) -> Result<Option<RevealedLockInfo>, LockError> {
        get_by_key(&*self.backend, key)
            .await
            .map(|found| found.map(LockInfo::reveal))
    }

    /// GET: the live lock on `key`, if any.
    pub(crate) async fn status(&self, key: &str) -> Result<(Option<Holding>, Outcome), LockError> {
        Ok(match self.lookup(key).await? {
            Some(raw) => (
                Some(Holding {
                    owner: raw.holder.as_deref().and_then(holder::owner_of),
                    expiry: seconds(raw.info.expires_at_ms),
                    fence: raw.info.fence,
                }),
                Outcome::Found,
            ),
            None => (None, Outcome::NotFound),
        })
    }

    /// Acquire for `seconds`: a free or expired key, or the holder's own live lock (whose
    /// lease restarts at now + `seconds`).
    pub(crate) async fn acquire(
        &self,
        key: &str,
        holder: &str,
        seconds: u32,
    ) -> Result<(Answer, Outcome), LockError> {
        let ttl = Duration::from_secs(u64::from(seconds));
        Ok(
            match self.backend.acquire_as(key, ttl, holder).await?.lease() {
                Some(lease) => (
                    Answer::Granted(Grant {
                        expiry: self::seconds(lease.expires_at_ms),
                        lease_duration: u64::from(seconds),
                        fence: lease.fence,
                    }),
                    Outcome::Acquired,
                ),
                None => (Answer::Refused, Outcome::AcquireConflict),
            },
        )
    }

    /// Renew by `seconds`: the holder's live lock expires `seconds` later than it did.
    pub(crate) async fn renew(
        &self,
        key: &str,
        holder: &str,
        seconds: u32,
    ) -> Result<(Answer, Outcome), LockError> {
        let Some(raw) = self.lookup(key).await? else {
            return Ok((Answer::Refused, Outcome::RenewNotFound));
        };
        if raw.holder.as_deref() != Some(holder) {
            return Ok((Answer::Refused, Outcome::RenewMismatch));
        }
        let by = Duration::from_secs(u64::from(seconds));
        Ok(
            match self
                .backend
                .extend_by(&raw.lock_id, by)
                .await?
                .expires_at_ms()
            {
                Some(expires_at_ms) => {
                    let expiry = self::seconds(expires_at_ms);
                    (
                        Answer::Granted(Grant {
                            expiry,
                            lease_duration: expiry
                                .saturating_sub(self::seconds(raw.info.acquired_at_ms)),
                            fence: raw.info.fence,
                        }),
                        Outcome::Renewed,
                    )
                }
                // It lapsed (or changed hands) since the lookup.
                None => (Answer::Refused, Outcome::RenewExpired),
            },
        )
    }

    /// Release: the holder's live lock is released; a missing or expired one counts as
    /// released; another holder's live lock is refused.
    pub(crate) async fn release(
        &self,
        key: &str,
        holder: &str,
    ) -> Result<(Answer, Outcome), LockError> {
        let mut retried = false;
        for _ in 0..RELEASE_ATTEMPTS {
            let Some(raw) = self.lookup(key).await? else {
                let outcome = if retried {
                    Outcome::ReleasedExpired
                } else {
                    Outcome::ReleasedNotFound
                };
                return Ok((Answer::Cleared, outcome));
            };
            if raw.holder.as_deref() != Some(holder) {
                return Ok((Answer::Refused, Outcome::ReleaseConflict));
            }
            if self.backend.release(&raw.lock_id).await?.is_released() {
                return Ok((Answer::Cleared, Outcome::Released));
            }
            // Not held by that lock id any more: it lapsed, or was released or re-taken
            // meanwhile. Look again.
            retried = true;
        }
        Ok((Answer::Refused, Outcome::ReleaseConflict))
    }

    /// Whether the backend answers (readiness): a cheap `is_locked`.
    pub(crate) async fn ping(&self) -> Result<(), LockError> {
        self.backend
            .is_locked("syncguard-server:readiness")
            .await
            .map(drop)
    }
}

/// Epoch milliseconds to LSC's epoch seconds (floor).
const fn seconds(ms: u64) -> u64 {
    ms / 1000
}
