//! Taking a lock: options, waiting, and running work under the lock.

use std::any::Any;
use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::backend::{AcquireOutcome, Lease, LockBackend};
use crate::guard::{LockGuard, SentAt, Start};
use crate::key::normalize_key;
use crate::key_text::KeyText;
use crate::observe::LockObserver;
use crate::time::ttl_millis;
use crate::{LockError, LostReason, RetryPolicy};

/// The default ttl of a lock: 30 seconds.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// What to do with the work when its lock is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum OnLost {
    /// Drop the work's future and return [`LockError::LockLost`]. The default: work that runs
    /// on after losing its lock may collide with the next owner.
    #[default]
    Cancel,
    /// Let the work run on; it can watch [`LockGuard::lost`] itself. Its result is still
    /// replaced by [`LockError::LockLost`]: it was not made under the lock throughout.
    Notify,
}

/// What to lock and how: the key, the ttl, how long to wait, and how to keep the lock.
///
/// # Default
/// | setting | default |
/// |---|---|
/// | [`ttl`](Self::with_ttl) | 30 s ([`DEFAULT_TTL`]) |
/// | [`retry`](Self::with_retry) | [`RetryPolicy::new`]: 10 retries, 100 ms exponential with equal jitter, 5 s timeout |
/// | [`heartbeat`](Self::with_heartbeat) | on: extends every third of the ttl |
/// | [`max_hold`](Self::with_max_hold) | none: extends for as long as the guard lives |
/// | [`on_lost`](Self::with_on_lost) | [`OnLost::Cancel`] (used by [`with_lock`]) |
///
/// ```
/// use std::time::Duration;
/// use syncguard::{LockOptions, OnLost, RetryPolicy};
///
/// let options = LockOptions::new("tenant:9:billing")
///     .with_ttl(Duration::from_secs(10))
///     .with_retry(RetryPolicy::single_attempt())
///     .with_max_hold(Duration::from_secs(600))
///     .with_on_lost(OnLost::Notify);
/// assert_eq!(options.key(), "tenant:9:billing");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockOptions {
    key: String,
    ttl: Duration,
    retry: RetryPolicy,
    heartbeat: bool,
    max_hold: Option<Duration>,
    on_lost: OnLost,
}

impl LockOptions {
    /// Options for locking `key`, with the defaults above. The key is validated when the lock
    /// is acquired.
    pub fn new(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            ttl: DEFAULT_TTL,
            retry: RetryPolicy::new(),
            heartbeat: true,
            max_hold: None,
            on_lost: OnLost::Cancel,
        }
    }

    /// How long the lock lives without an extend. With the heartbeat on, this is how quickly
    /// a crashed holder's lock frees up, not a limit on the work. Checked when the lock is
    /// acquired: 1 ms to 365 days ([`MAX_TTL`](crate::time::MAX_TTL)), or
    /// [`LockError::InvalidArgument`] before any I/O.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How to wait while the lock is held by someone else.
    #[must_use]
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Whether to extend the lock automatically while it is held.
    #[must_use]
    pub fn with_heartbeat(mut self, heartbeat: bool) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// Stop extending once the lock has been held this long; it then expires at the end of
    /// its last lease and counts as lost ([`LostReason::MaxHoldReached`](crate::LostReason::MaxHoldReached)).
    /// The last extend asks only for what is left of the cap. Any duration is accepted:
    /// one too long to reach (such as [`Duration::MAX`]) is as good as no cap.
    #[must_use]
    pub fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// What [`with_lock`] does with the work when the lock is lost.
    #[must_use]
    pub fn with_on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }

    /// The key to lock.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The ttl.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The waiting policy.
    pub fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    /// Whether the heartbeat is on.
    pub fn heartbeat(&self) -> bool {
        self.heartbeat
    }

    /// The cap on the total hold time, if any.
    pub fn max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// What happens to the work when the lock is lost.
    pub fn on_lost(&self) -> OnLost {
        self.on_lost
    }
}

/// Acquires a lock, waiting and retrying as `options` say, and returns its guard (with the
/// heartbeat running unless turned off).
///
/// Must be called within a tokio runtime: the guard's heartbeat is a tokio task.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use syncguard::{LockOptions, MemoryBackend, RetryPolicy};
///
/// let backend = MemoryBackend::new();
/// let first = syncguard::acquire(&backend, &LockOptions::new("job:1")).await?;
/// let busy = syncguard::acquire(
///     &backend,
///     &LockOptions::new("job:1").with_retry(RetryPolicy::single_attempt()),
/// )
/// .await;
/// assert!(busy.unwrap_err().is_contended());
/// first.release().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`LockError::InvalidArgument`] for a bad key or ttl (before any I/O);
/// [`LockError::AcquisitionTimeout`] when the lock stayed held by someone else past the retry
/// policy; backend errors as they come (they are not retried).
pub async fn acquire<B>(backend: &B, options: &LockOptions) -> Result<LockGuard, LockError>
where
    B: LockBackend + Clone + 'static,
{
    acquire_shared(share(backend), options).await
}

/// `backend` behind an `Arc`. A backend that already is an `Arc<dyn LockBackend>` is shared
/// as it is: wrapping it again would cost an allocation and an indirection per call.
pub(crate) fn share<B: LockBackend + Clone + 'static>(backend: &B) -> Arc<dyn LockBackend> {
    match (backend as &dyn Any).downcast_ref::<Arc<dyn LockBackend>>() {
        Some(shared) => Arc::clone(shared),
        None => Arc::new(backend.clone()),
    }
}

/// [`acquire`] on an already shared backend.
pub async fn acquire_shared(
    backend: Arc<dyn LockBackend>,
    options: &LockOptions,
) -> Result<LockGuard, LockError> {
    acquire_keeping(backend, options, false).await
}

/// The waiting loop of every acquire. With `driven`, the guard's keeper is run by its owner
/// ([`LockGuard::poll_keeper`]) instead of a spawned task.
pub(crate) async fn acquire_keeping(
    backend: Arc<dyn LockBackend>,
    options: &LockOptions,
    driven: bool,
) -> Result<LockGuard, LockError> {
    let key = normalize_key(&options.key)?;
    let taken = take_lease(backend.as_ref(), options, &key).await?;
    Ok(taken.into_guard(backend, KeyText::from(key.into_owned()), options, driven))
}

/// [`acquire_keeping`] with a driven keeper, for an owner that has the key of this one
/// acquisition apart from the options it shares with others (whose own key is not read): the
/// key moves into the guard instead of being copied, and comes back with the error.
pub(crate) async fn acquire_driven(
    backend: Arc<dyn LockBackend>,
    key: String,
    options: &LockOptions,
) -> Result<LockGuard, (LockError, String)> {
    let normalized = match normalize_key(&key) {
        Ok(normalized) => normalized,
        Err(error) => return Err((error, key)),
    };
    let taken = take_lease(backend.as_ref(), options, &normalized).await;
    let normalized = owned(normalized);
    driven_guard(taken, backend, KeyText::from(key), normalized, options)
        .map_err(|(error, key)| (error, key.into_string()))
}

/// What `acquire_driven_now` decided.
#[derive(Debug)]
pub enum AcquiredNow {
    /// The lock was taken: as from `acquire_driven`.
    Acquired(LockGuard),
    /// The acquisition failed: as from `acquire_driven`, with the key given back.
    Failed(LockError, String),
    /// The backend cannot answer without waiting, or the key is held and the options wait for
    /// it: nothing was taken, and `acquire_driven` with the key given back will decide
    /// (starting its wait over).
    Later(String),
}

/// [`acquire_driven`] without a future, for a backend that answers at once
/// ([`LockBackend::try_acquire_now`]).
pub(crate) fn acquire_driven_now(
    backend: &Arc<dyn LockBackend>,
    key: KeyText,
    options: &LockOptions,
) -> AcquiredNow {
    let normalized = match normalize_key(key.as_str()) {
        Ok(normalized) => normalized,
        Err(error) => return AcquiredNow::Failed(error, key.into_string()),
    };
    let taken = take_lease_now(backend.as_ref(), options, &normalized);
    let normalized = owned(normalized);
    let Some(taken) = taken else {
        return AcquiredNow::Later(key.into_string());
    };
    match driven_guard(taken, Arc::clone(backend), key, normalized, options) {
        Ok(guard) => AcquiredNow::Acquired(guard),
        Err((error, key)) => AcquiredNow::Failed(error, key.into_string()),
    }
}

/// The normalized key, if normalizing changed it (then the caller's key is not the one held).
fn owned(normalized: Cow<'_, str>) -> Option<String> {
    match normalized {
        Cow::Owned(normalized) => Some(normalized),
        Cow::Borrowed(_) => None,
    }
}

/// The guard of a driven acquisition; the key (normalized if that changed it) moves into it.
fn driven_guard(
    taken: Result<Taken, LockError>,
    backend: Arc<dyn LockBackend>,
    key: KeyText,
    normalized: Option<String>,
    options: &LockOptions,
) -> Result<LockGuard, (LockError, KeyText)> {
    match taken {
        Ok(taken) => {
            let key = normalized.map_or(key, KeyText::from);
            Ok(taken.into_guard(backend, key, options, true))
        }
        Err(error) => Err((error, key)),
    }
}

/// A lease just taken, with what its guard needs.
struct Taken {
    lease: Lease,
    sent: SentAt,
    observer: Option<Arc<dyn LockObserver>>,
}

impl Taken {
    fn into_guard(
        self,
        backend: Arc<dyn LockBackend>,
        key: KeyText,
        options: &LockOptions,
        driven: bool,
    ) -> LockGuard {
        let start = Start {
            key,
            lock_id: self.lease.lock_id,
            fence: self.lease.fence,
            ttl: options.ttl,
            max_hold: options.max_hold,
            expires_at_ms: self.lease.expires_at_ms,
            sent_at: self.sent.instant,
            sent_wall_ms: self.sent.wall_ms,
            observer: self.observer,
        };
        LockGuard::start(backend, start, options.heartbeat, driven)
    }
}

/// The attempts of one acquisition: when the first was sent (the start of the wait), how
/// many were made, and who hears of the result.
struct Attempts<'k> {
    key: &'k str,
    observer: Option<Arc<dyn LockObserver>>,
    first: SentAt,
    made: u32,
}

impl<'k> Attempts<'k> {
    fn start(
        backend: &dyn LockBackend,
        options: &LockOptions,
        key: &'k str,
        first: SentAt,
    ) -> Result<Self, LockError> {
        ttl_millis(options.ttl)?;
        Ok(Self {
            key,
            observer: backend.observer(),
            first,
            made: 0,
        })
    }

    /// When the next attempt is sent.
    fn send(&mut self) -> SentAt {
        self.made += 1;
        if self.made == 1 {
            self.first
        } else {
            SentAt::now()
        }
    }

    /// The lease of an attempt that took the lock; `None` if the key is held.
    fn settle(
        &mut self,
        outcome: Result<AcquireOutcome, LockError>,
        sent: SentAt,
    ) -> Result<Option<Taken>, LockError> {
        match outcome {
            Ok(AcquireOutcome::Acquired(lease)) => {
                if let Some(observer) = &self.observer {
                    observer.acquired(self.key, &lease, self.first.instant.elapsed(), self.made);
                }
                Ok(Some(Taken {
                    lease,
                    sent,
                    observer: self.observer.take(),
                }))
            }
            Ok(AcquireOutcome::Contended) => Ok(None),
            Err(error) => Err(self.gave_up(error)),
        }
    }

    /// The error for a key that stayed held, reported.
    fn timed_out(&self) -> LockError {
        self.gave_up(LockError::AcquisitionTimeout {
            attempts: self.made,
            elapsed: self.first.instant.elapsed(),
        })
    }

    fn gave_up(&self, error: LockError) -> LockError {
        if let Some(observer) = &self.observer {
            observer.gave_up(self.key, &error, self.first.instant.elapsed(), self.made);
        }
        error
    }
}

/// Tries to take the lock on the (normalized) `key`, waiting and retrying as `options` say.
async fn take_lease(
    backend: &dyn LockBackend,
    options: &LockOptions,
    key: &str,
) -> Result<Taken, LockError> {
    let mut attempts = Attempts::start(backend, options, key, SentAt::now())?;
    let retry = &options.retry;
    let mut delays = retry.delays();
    loop {
        let sent = attempts.send();
        let outcome = match backend.try_acquire_now(key, options.ttl) {
            Some(outcome) => outcome,
            None => backend.acquire(key, options.ttl).await,
        };
        if let Some(taken) = attempts.settle(outcome, sent)? {
            return Ok(taken);
        }
        let remaining = retry
            .timeout()
            .saturating_sub(attempts.first.instant.elapsed());
        match delays.next() {
            // Cut short at the timeout, where the last attempt is made.
            Some(delay) if !remaining.is_zero() => {
                // Boxed: a timer is large, and most acquisitions never wait.
                Box::pin(tokio::time::sleep(delay.min(remaining))).await;
            }
            _ => return Err(attempts.timed_out()),
        }
    }
}

/// The first attempt of [`take_lease`], made without waiting: `None` if the backend cannot
/// answer at once ([`LockBackend::try_acquire_now`]), or if the key is held and the policy
/// would wait for it.
fn take_lease_now(
    backend: &dyn LockBackend,
    options: &LockOptions,
    key: &str,
) -> Option<Result<Taken, LockError>> {
    let mut attempts = match Attempts::start(backend, options, key, SentAt::at_once()) {
        Ok(attempts) => attempts,
        Err(error) => return Some(Err(error)),
    };
    let sent = attempts.send();
    let outcome = backend.try_acquire_now(key, options.ttl)?;
    match attempts.settle(outcome, sent) {
        Ok(Some(taken)) => Some(Ok(taken)),
        Ok(None) if options.retry.max_retries() == 0 => Some(Err(attempts.timed_out())),
        Ok(None) => None,
        Err(error) => Some(Err(error)),
    }
}

/// Runs `work` under the lock: acquires (waiting as `options` say), keeps the lock alive while
/// the work runs, and releases it on every path, errors included.
///
/// It returns the work's result only if the lock was held until the work finished. If the
/// lock is lost while the work runs, the work's future is dropped and
/// [`LockError::LockLost`] is returned at once (with [`OnLost::Notify`] the work runs on and
/// can watch [`LockGuard::lost`] itself, and its result is then dropped for `LockLost`). Work
/// that finishes after its lease ran out while nothing noticed (it blocked its thread, or
/// the runtime was stalled) also gets `LockLost`: the lock may have passed to someone else
/// meanwhile, so its side effects were not exclusive; the [fence](LockGuard::fence) handed
/// to the resource is what lets that resource refuse them.
///
/// The final release is waited for up to a second, then left to the background; after a
/// loss it is not waited for at all. Its errors are logged, not returned: the work's result
/// matters more, and the lock expires at the end of its ttl anyway.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use syncguard::{LockOptions, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let fence = syncguard::with_lock(&backend, &LockOptions::new("report:daily"), async |guard| {
///     // ... the work, exclusive across every process sharing the backend ...
///     Ok::<_, syncguard::LockError>(guard.fence())
/// })
/// .await?;
/// println!("ran with fence {fence}");
/// # Ok(()) }
/// ```
///
/// # Errors
/// The work's own error, or a [`LockError`] converted into `E`: acquisition failures as in
/// [`acquire`], and [`LockError::LockLost`] when the lock was lost before the work finished.
pub async fn with_lock<B, F, T, E>(backend: &B, options: &LockOptions, work: F) -> Result<T, E>
where
    B: LockBackend + Clone + 'static,
    F: AsyncFnOnce(&LockGuard) -> Result<T, E>,
    E: From<LockError>,
{
    let guard = acquire(backend, options).await?;
    let result = run_guarded(&guard, options.on_lost, work(&guard))
        .await
        .unwrap_or_else(|reason| Err(LockError::LockLost { reason }.into()));
    release_logged(guard).await;
    result
}

/// Drives `work` while watching `guard` for loss, as `on_lost` says: with
/// [`OnLost::Cancel`], a loss drops `work` and returns the reason. Either way, work that
/// finishes when the lock is lost (its lease ran out while it ran) returns the reason, not
/// its result.
pub async fn run_guarded<R>(
    guard: &LockGuard,
    on_lost: OnLost,
    work: impl Future<Output = R>,
) -> Result<R, LostReason> {
    let result = match on_lost {
        OnLost::Notify => work.await,
        OnLost::Cancel => {
            tokio::select! {
                // A finished work is judged below, by the lease at the moment it finished.
                biased;
                result = work => result,
                reason = guard.lost() => return Err(reason),
            }
        }
    };
    match guard.lost_reason() {
        Some(reason) => Err(reason),
        None => Ok(result),
    }
}

/// How long the final release of [`with_lock`] is waited for before it is left to the
/// background: the caller should learn the outcome of its work promptly even when the
/// backend is slow or unreachable.
const FINAL_RELEASE_WAIT: Duration = Duration::from_secs(1);

/// Releases `guard` at the end of the work, logging (not returning) failures. A lost lock
/// is not waited for: one the backend disowned needs no release, any other is released in
/// the background by the guard's drop. Otherwise the release is waited for up to
/// a second, then goes on in the background.
pub async fn release_logged(guard: LockGuard) {
    if guard.is_lost() {
        return;
    }
    let fence = guard.fence();
    match tokio::time::timeout(FINAL_RELEASE_WAIT, guard.release()).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, %fence, "syncguard release failed; the lock will expire at the end of its ttl");
        }
        Err(_elapsed) => {
            tracing::debug!(%fence, "syncguard release still unanswered; it goes on in the background");
        }
    }
}

static DEFAULT_BACKEND: OnceLock<Arc<dyn LockBackend>> = OnceLock::new();

/// Sets the process-wide default backend, used by `#[locked]` when no backend is named.
/// Call it once at startup.
///
/// ```
/// use syncguard::MemoryBackend;
///
/// syncguard::set_default_backend(MemoryBackend::new())?;
/// assert!(syncguard::default_backend().is_ok());
/// // A second call is refused and changes nothing.
/// assert!(syncguard::set_default_backend(MemoryBackend::new()).is_err());
/// # Ok::<(), syncguard::LockError>(())
/// ```
///
/// # Errors
/// [`LockError::InvalidArgument`] if a default backend was already set; the first one stays.
pub fn set_default_backend<B: LockBackend + 'static>(backend: B) -> Result<(), LockError> {
    DEFAULT_BACKEND.set(Arc::new(backend)).map_err(|_| {
        LockError::invalid_argument(
            "a default lock backend is already set; set it once, at startup",
        )
    })
}

/// The process-wide default backend.
///
/// # Errors
/// [`LockError::NoDefaultBackend`] if [`set_default_backend`] was not called.
pub fn default_backend() -> Result<Arc<dyn LockBackend>, LockError> {
    DEFAULT_BACKEND
        .get()
        .cloned()
        .ok_or(LockError::NoDefaultBackend)
}
