//! The policy of a lock: how long it lives, how to wait for it, how to keep it.

use std::time::Duration;

use crate::backend::time::ttl_millis;
use crate::error::LockError;
use crate::retry::RetryPolicy;

/// What to do with the work when its lock is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum OnLost {
    /// Drop the work's future and return [`ErrorCode::LockLost`](crate::ErrorCode::LockLost). The
    /// default: work that runs on after losing its lock may collide with the next owner.
    #[default]
    Cancel,
    /// Let the work run on; it can watch the guard's [`lost`](crate::LockHandle::lost) itself.
    /// Its result is still replaced by [`ErrorCode::LockLost`](crate::ErrorCode::LockLost): it
    /// was not made under the lock throughout.
    Notify,
}

/// How a lock is taken and kept: ttl, waiting, heartbeat, hold cap, what a loss does. The key
/// is not part of it: one `LockOptions` serves every key it is used with.
///
/// Made with [`LockOptions::builder`], which checks the values once, in
/// [`build`](LockOptionsBuilder::build); a `LockOptions` is always valid. `#[locked]` and the
/// Tower layer map their arguments onto it.
///
/// # Default
/// | setting | default |
/// |---|---|
/// | [`ttl`](LockOptionsBuilder::ttl) | 30 s ([`LockOptions::DEFAULT_TTL`]) |
/// | [`retry`](LockOptionsBuilder::retry) | [`RetryPolicy::new`]: 10 retries, 100 ms exponential with equal jitter, 5 s timeout |
/// | [`heartbeat`](LockOptionsBuilder::heartbeat) | on: extends every third of the ttl |
/// | [`max_hold`](LockOptionsBuilder::max_hold) | none: extends for as long as the guard lives |
/// | [`min_hold`](LockOptionsBuilder::min_hold) | none: a release frees the key at once |
/// | [`on_lost`](LockOptionsBuilder::on_lost) | [`OnLost::Cancel`] |
/// | [`show_key`](LockOptionsBuilder::show_key) | off: errors, logs and spans show the key's hash only |
///
/// ```
/// use std::time::Duration;
/// use syncguard::{LockOptions, OnLost, RetryPolicy};
///
/// let options = LockOptions::builder()
///     .ttl(Duration::from_secs(10))
///     .retry(RetryPolicy::wait_for(Duration::from_secs(2)))
///     .max_hold(Duration::from_secs(600))
///     .on_lost(OnLost::Notify)
///     .build()?;
/// assert_eq!(options.ttl(), Duration::from_secs(10));
///
/// // A ttl out of range is refused when the options are built.
/// assert!(LockOptions::builder().ttl(Duration::ZERO).build().is_err());
/// # Ok::<(), syncguard::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockOptions {
    ttl: Duration,
    retry: RetryPolicy,
    heartbeat: bool,
    max_hold: Option<Duration>,
    min_hold: Option<Duration>,
    on_lost: OnLost,
    show_key: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            ttl: Self::DEFAULT_TTL,
            retry: RetryPolicy::new(),
            heartbeat: true,
            max_hold: None,
            min_hold: None,
            on_lost: OnLost::Cancel,
            show_key: false,
        }
    }
}

impl LockOptions {
    /// The default ttl of a lock: 30 seconds.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

    /// A builder starting from the defaults.
    pub fn builder() -> LockOptionsBuilder {
        LockOptionsBuilder {
            options: Self::default(),
        }
    }

    /// A builder starting from these options, to change some of them.
    ///
    /// ```
    /// use syncguard::{LockOptions, RetryPolicy};
    ///
    /// let patient = LockOptions::default();
    /// let hasty = patient.to_builder().retry(RetryPolicy::single_attempt()).build()?;
    /// assert_eq!(hasty.ttl(), patient.ttl());
    /// # Ok::<(), syncguard::LockError>(())
    /// ```
    pub fn to_builder(&self) -> LockOptionsBuilder {
        LockOptionsBuilder {
            options: self.clone(),
        }
    }

    /// How long the lock lives without an extend.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How to wait while the lock is held by someone else.
    pub fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    /// Whether the lock is extended automatically while held.
    pub fn heartbeat(&self) -> bool {
        self.heartbeat
    }

    /// The cap on the total hold time, if any.
    pub fn max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// How long the lock is kept at least, counted from its acquisition, even when released
    /// earlier, if set.
    pub fn min_hold(&self) -> Option<Duration> {
        self.min_hold
    }

    /// What a loss does to the work.
    pub fn on_lost(&self) -> OnLost {
        self.on_lost
    }

    /// Whether errors, logs and spans show the raw key, not only its hash.
    pub fn show_key(&self) -> bool {
        self.show_key
    }
}

/// Builds [`LockOptions`]; see there for the defaults.
#[derive(Debug, Clone)]
#[must_use]
pub struct LockOptionsBuilder {
    options: LockOptions,
}

impl LockOptionsBuilder {
    /// How long the lock lives without an extend: 1 ms to 365 days
    /// ([`MAX_TTL`](crate::backend::time::MAX_TTL)). With the heartbeat on, this is how quickly a
    /// crashed holder's lock frees up, not a limit on the work.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = ttl;
        self
    }

    /// How to wait while the lock is held by someone else, for example
    /// [`RetryPolicy::wait_for`] or [`RetryPolicy::single_attempt`].
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.options.retry = retry;
        self
    }

    /// Whether to extend the lock automatically while it is held (on by default). Without it,
    /// a hold that outlives the ttl loses its lock.
    pub fn heartbeat(mut self, heartbeat: bool) -> Self {
        self.options.heartbeat = heartbeat;
        self
    }

    /// Stop extending once the lock has been held this long; it then expires at the end of
    /// its last lease and counts as lost ([`LostReason::MaxHoldReached`](crate::LostReason::MaxHoldReached)).
    /// The last extend asks only for what is left of the cap. Any duration is accepted: one
    /// too long to reach (such as [`Duration::MAX`]) is as good as no cap.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.options.max_hold = Some(max_hold);
        self
    }

    /// Keep the lock at least this long after it was taken, even when the work finishes (and
    /// releases) earlier: a release before then leaves the lock to expire at that time instead
    /// of freeing the key at once (ShedLock's `lockAtLeastFor`). For scheduled jobs: replicas
    /// whose clocks disagree by less than this do not run the same firing twice. The release
    /// still reports `true`, and nothing is reported lost. 1 ms to 365 days.
    ///
    /// The time is counted on the backend's clock from when it took the lock, and the release
    /// sets the lock's expiry to that fixed time ([`expire_at`]): a release delayed in the
    /// network can never keep the lock past it. One case can: a heartbeat extend already on
    /// the wire when the hold ends (the heartbeat is stopped, but a request sent cannot be
    /// called back) may land after the release and keep the lock up to a ttl from then, held
    /// by nobody; the work's exclusion is not at stake, only how soon the key frees up.
    ///
    /// [`expire_at`]: crate::backend::LockBackend::expire_at
    ///
    /// ```
    /// use std::time::Duration;
    /// use syncguard::LockOptions;
    ///
    /// let nightly = LockOptions::builder().min_hold(Duration::from_secs(60)).build()?;
    /// assert_eq!(nightly.min_hold(), Some(Duration::from_secs(60)));
    /// # Ok::<(), syncguard::LockError>(())
    /// ```
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.options.min_hold = Some(min_hold);
        self
    }

    /// What happens to the work run under the lock ([`with_lock`](crate::with_lock),
    /// [`LockGuard::run`](crate::LockGuard::run), `#[locked]`, the Tower layer) when the lock
    /// is lost.
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.options.on_lost = on_lost;
        self
    }

    /// Show the raw key in errors, log lines and the hold's span, beside its hash. Off by
    /// default: keys may carry personal data (user ids, e-mail addresses).
    pub fn show_key(mut self, show_key: bool) -> Self {
        self.options.show_key = show_key;
        self
    }

    /// The options, once their values are checked.
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a ttl or a `min_hold`
    /// under 1 ms or over 365 days.
    pub fn build(self) -> Result<LockOptions, LockError> {
        ttl_millis(self.options.ttl)?;
        if let Some(min_hold) = self.options.min_hold {
            ttl_millis(min_hold).map_err(|_| {
                LockError::invalid_argument(format!(
                    "min_hold must be between 1ms and 365 days, got {min_hold:?}"
                ))
            })?;
        }
        Ok(self.options)
    }
}
