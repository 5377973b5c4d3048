//! Taking a lock: one attempt, or waiting as the retry policy says.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::key::normalize_key;
use crate::backend::time::{TIME_TOLERANCE_MS, now_ms};
use crate::backend::{
    AcquireOutcome, Contention, Lease, LockBackend, LockObserver, ReleaseWatch, Wake,
};
use crate::error::{HolderExpiry, LockError, Result};
use crate::far_future::later;
use crate::guard::{HeartbeatBy, LockGuard, SentAt, Start};
use crate::lock_name::LockName;
use crate::options::LockOptions;

/// Acquires the lock on `key`, waiting and retrying as the options' [retry
/// policy](crate::LockOptionsBuilder::retry) says, and returns its guard, with the heartbeat
/// running (in a task of its own) unless the options turn it off.
///
/// Must be called within a tokio runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> syncguard::Result<()> {
/// use syncguard::{LockOptions, MemoryBackend, RetryPolicy};
///
/// let backend = MemoryBackend::new();
/// let guard = syncguard::acquire(&backend, "job:1", &LockOptions::default()).await?;
///
/// let hasty = LockOptions::builder().retry(RetryPolicy::single_attempt()).build()?;
/// let busy = syncguard::acquire(&backend, "job:1", &hasty).await.unwrap_err();
/// assert!(busy.is_contended());
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a bad key (before
/// any I/O); [`ErrorCode::Contended`](crate::ErrorCode::Contended) when the key is held and
/// the policy allows no wait;
/// [`ErrorCode::AcquisitionTimeout`](crate::ErrorCode::AcquisitionTimeout) when it stayed held
/// past the policy's wait (both with the holder's expiry,
/// [`LockError::holder_expires_at_ms`]); backend errors as they come (they are not retried).
pub async fn acquire<B>(backend: &B, key: &str, options: &LockOptions) -> Result<LockGuard>
where
    B: LockBackend + Clone + 'static,
{
    Acquisition::new(share(backend), key, options)?
        .wait(HeartbeatBy::Task)
        .await
}

/// Makes one attempt at the lock on `key`: the guard if it was free, `Ok(None)` if someone
/// else holds it. The options' retry policy is not used.
///
/// Must be called within a tokio runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> syncguard::Result<()> {
/// use syncguard::{LockOptions, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let options = LockOptions::default();
/// let first = syncguard::try_acquire(&backend, "report:daily", &options).await?;
/// assert!(first.is_some());
/// assert!(syncguard::try_acquire(&backend, "report:daily", &options).await?.is_none());
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a bad key (before
/// any I/O); backend errors as they come. Contention is not an error.
pub async fn try_acquire<B>(
    backend: &B,
    key: &str,
    options: &LockOptions,
) -> Result<Option<LockGuard>>
where
    B: LockBackend + Clone + 'static,
{
    Acquisition::new(share(backend), key, options)?
        .once(HeartbeatBy::Task)
        .await
}

/// [`acquire`] whose guard's heartbeat the caller runs, from its own `poll`, instead of a task:
/// for an integration that owns the guard inside a future of its own (a Tower service's
/// response future, a job runner). The heartbeat (the extends, and noticing a lease that ran
/// out) runs only while the owner calls [`LockGuard::poll_heartbeat`], each time it is about
/// to return `Pending`; [`LockGuard::spawn_heartbeat`] hands it to a task, for when nobody
/// will poll. Holding a lock then costs no task of its own.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> syncguard::Result<()> {
/// use syncguard::{LockOptions, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let options = LockOptions::default();
/// let mut guard = syncguard::acquire_with_polled_heartbeat(&backend, "job:9", &options).await?;
/// // ... call `guard.poll_heartbeat(cx)` while the work is pending, or:
/// guard.spawn_heartbeat();
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`acquire`].
pub async fn acquire_with_polled_heartbeat<B>(
    backend: &B,
    key: &str,
    options: &LockOptions,
) -> Result<LockGuard>
where
    B: LockBackend + Clone + 'static,
{
    Acquisition::new(share(backend), key, options)?
        .wait(HeartbeatBy::Owner)
        .await
}

/// [`acquire`] on behalf of `holder` ([`LockBackend::acquire_as`]: stored with the lock, so
/// that others can see who holds it), for the crate's own building blocks. Once `stop` is
/// cancelled it waits no more and returns `Ok(None)`; an attempt already under way is
/// finished first, and the lock it took is returned, so that whoever stops can release it
/// (a dropped attempt would leave that to the backend's background release).
pub(crate) async fn acquire_as(
    backend: Arc<dyn LockBackend>,
    key: &str,
    holder: &str,
    options: &LockOptions,
    stop: Option<&CancellationToken>,
) -> Result<Option<LockGuard>> {
    let mut acquisition = Acquisition::new(backend, key, options)?;
    acquisition.holder = Some(holder.to_owned());
    acquisition.wait_until(HeartbeatBy::Task, stop).await
}

/// `backend` behind an `Arc`. A backend that already is an `Arc<dyn LockBackend>` is shared
/// as it is, not wrapped again.
pub(crate) fn share<B: LockBackend + Clone + 'static>(backend: &B) -> Arc<dyn LockBackend> {
    match (backend as &dyn Any).downcast_ref::<Arc<dyn LockBackend>>() {
        Some(shared) => Arc::clone(shared),
        None => Arc::new(backend.clone()),
    }
}

/// What one attempt came to.
enum Attempt {
    /// The lock, and when it was asked for.
    Taken(Lease, SentAt),
    /// Held by another.
    Refused(Contention),
}

/// The local instant when a lease that expires at `expires_at_ms` (Unix milliseconds of the
/// backend's time authority) stops counting as live: past the tolerance. Clock skew only moves
/// a wake-up: an attempt decides, never this.
fn lease_over_at(expires_at_ms: u64) -> Instant {
    lease_ends_at(expires_at_ms) + Duration::from_millis(1)
}

/// When a lease that expires at `expires_at_ms` (store time) stops counting as live, by this
/// host's clock: its expiry plus the tolerance, at most a day from now.
fn lease_ends_at(expires_at_ms: u64) -> Instant {
    let ends_at_ms = expires_at_ms.saturating_add(TIME_TOLERANCE_MS);
    let until = Duration::from_millis(ends_at_ms.saturating_sub(now_ms()));
    Instant::now() + until.min(LONGEST_HOLDER_WAIT)
}

/// The furthest a holder's lease end is trusted to be: past it, the policy's delays rule.
const LONGEST_HOLDER_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// The attempts of one acquisition: when it began (the start of the wait), how many were
/// made, and who hears of the result.
struct Acquisition<'o> {
    backend: Arc<dyn LockBackend>,
    /// The normalized key.
    key: String,
    options: &'o LockOptions,
    observer: Option<Arc<dyn LockObserver>>,
    /// Who the lock is taken for ([`LockBackend::acquire_as`]); `None`: a plain acquire.
    holder: Option<String>,
    /// When the acquisition began: the start of the wait.
    began: Instant,
    made: u32,
    /// The holder's expiry as the last refusal (or the release queue) reported it: for the
    /// error, if the lock stays held.
    holder_expires_at_ms: Option<u64>,
}

impl<'o> Acquisition<'o> {
    fn new(backend: Arc<dyn LockBackend>, key: &str, options: &'o LockOptions) -> Result<Self> {
        let key = normalize_key(key)?.into_owned();
        Ok(Self {
            observer: backend.observer(),
            backend,
            key,
            options,
            holder: None,
            began: Instant::now(),
            made: 0,
            holder_expires_at_ms: None,
        })
    }

    /// One attempt: the lease and when it was asked for, or what the refusal said.
    async fn attempt(&mut self) -> Result<Attempt> {
        self.made += 1;
        // Each attempt's own time: a waiter queued behind others makes its first attempt long
        // after the wait began, and its lease counts from the request that took it.
        let sent = SentAt::now();
        let ttl = self.options.ttl();
        let outcome = match &self.holder {
            Some(holder) => self.backend.acquire_as(&self.key, ttl, holder).await,
            None => self.backend.acquire(&self.key, ttl).await,
        };
        match outcome {
            Ok(AcquireOutcome::Acquired(lease)) => {
                if let Some(observer) = &self.observer {
                    let waited = self.began.elapsed();
                    observer.acquired(&self.key, &lease, waited, self.made);
                }
                Ok(Attempt::Taken(lease, sent))
            }
            Ok(AcquireOutcome::Contended(contention)) => {
                self.holder_expires_at_ms = contention.holder_expires_at_ms;
                Ok(Attempt::Refused(contention))
            }
            Err(error) => Err(self.gave_up(error)),
        }
    }

    /// Attempts until the lock is taken or the retry policy gives up: at the policy's delays,
    /// and (on a backend that announces releases) when a release is announced or the holder's
    /// lease ends. See [`RetryPolicy`](crate::RetryPolicy) for what a waiter may expect.
    async fn wait(self, heartbeat_by: HeartbeatBy) -> Result<LockGuard> {
        match self.wait_until(heartbeat_by, None).await? {
            Some(guard) => Ok(guard),
            None => unreachable!("a wait without a stop token ends with the lock or an error"),
        }
    }

    /// [`wait`](Self::wait), which also ends (with `None`) once `stop` is cancelled: between
    /// attempts, never during one.
    async fn wait_until(
        mut self,
        heartbeat_by: HeartbeatBy,
        stop: Option<&CancellationToken>,
    ) -> Result<Option<LockGuard>> {
        let retry = *self.options.retry();
        let deadline = later(self.began, retry.timeout());
        let mut delays = retry.delays();
        let waits = retry.max_retries() > 0 && !retry.timeout().is_zero();
        // Joined before the first attempt, so that no release between a refusal and the wait
        // goes unseen.
        // Asked for only when used: a backend may open a connection to listen.
        let mut watch = (waits && retry.wake_on_release())
            .then(|| self.backend.release_notifier())
            .flatten()
            .map(|notifier| notifier.watch(&self.key));
        // A newcomer behind earlier waiters of this process waits for its turn.
        let mut attempt_now = watch.as_ref().is_none_or(ReleaseWatch::is_first);
        // The next attempt the policy's delays allow (and the delay it came from), and when
        // the holder's lease ends.
        let mut next_poll: Option<(Instant, Duration)> = None;
        let mut holder_ends: Option<Instant> = None;
        let stopped = async {
            match stop {
                Some(stop) => stop.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(stopped);
        loop {
            if stop.is_some_and(CancellationToken::is_cancelled) {
                return Ok(None);
            }
            if attempt_now {
                match self.attempt().await? {
                    Attempt::Taken(lease, sent) => {
                        if let Some(watch) = watch.take() {
                            watch.acquired(lease.expires_at_ms);
                        }
                        return Ok(Some(self.guard(lease, sent, heartbeat_by)));
                    }
                    Attempt::Refused(contention) => {
                        holder_ends = contention.holder_expires_at_ms.map(lease_over_at);
                    }
                }
            }
            let now = Instant::now();
            // Past the deadline (the last attempt is made at it), nothing more.
            if now >= deadline {
                return Err(self.contended());
            }
            if next_poll.is_none() {
                match delays.next() {
                    Some(delay) => next_poll = Some((later(now, delay), delay)),
                    None => return Err(self.contended()),
                }
            }
            // Only the first waiter polls; the others wait for their turn (or the deadline).
            let mut wake_at = deadline;
            if watch.as_ref().is_none_or(ReleaseWatch::is_first) {
                wake_at = wake_at.min(next_poll.map_or(deadline, |(at, _)| at));
                if let Some(ends) = holder_ends.filter(|ends| *ends > now) {
                    wake_at = wake_at.min(ends);
                }
            }
            let woken = async {
                match watch.as_mut() {
                    Some(watch) => watch.woken().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut stopped => return Ok(None),
                wake = woken => match wake {
                    Wake::Wait { holder_expires_at_ms } => {
                        attempt_now = false;
                        // A newer holder than the last refusal's, when known.
                        if holder_expires_at_ms.is_some() {
                            self.holder_expires_at_ms = holder_expires_at_ms;
                        }
                        holder_ends = holder_expires_at_ms.map(lease_over_at);
                        // First in line behind a lock that was just taken: a poll that fell
                        // due while waiting for the turn would only be refused, so the
                        // pending delay counts from now.
                        next_poll = next_poll.map(|(_, delay)| (later(Instant::now(), delay), delay));
                    }
                    _ => attempt_now = true,
                },
                () = tokio::time::sleep_until(wake_at) => {
                    attempt_now = true;
                    // What came due is used up: a poll, or the holder's lease end.
                    next_poll = next_poll.filter(|(poll, _)| *poll > wake_at);
                    holder_ends = holder_ends.filter(|ends| *ends > wake_at);
                }
            }
        }
    }

    /// One attempt; contention is `None`.
    async fn once(mut self, heartbeat_by: HeartbeatBy) -> Result<Option<LockGuard>> {
        match self.attempt().await? {
            Attempt::Taken(lease, sent) => Ok(Some(self.guard(lease, sent, heartbeat_by))),
            Attempt::Refused(_) => {
                // Reported as a wait that gave up; the caller gets no error.
                let _ = self.contended();
                Ok(None)
            }
        }
    }

    /// The error for a key that stayed held, reported: [`ErrorCode::Contended`] after a
    /// single attempt, [`ErrorCode::AcquisitionTimeout`] after a wait, with the holder's
    /// expiry as the last refusal reported it.
    fn contended(&self) -> LockError {
        let lock = LockName::new(&self.key, self.options.show_key());
        let holder = self.holder_expires_at_ms.map(|at_ms| HolderExpiry {
            at_ms,
            lease_ends: lease_ends_at(at_ms),
        });
        let error = if self.made <= 1 {
            LockError::contended(lock, holder)
        } else {
            LockError::acquisition_timeout(lock, self.made, self.began.elapsed(), holder)
        };
        self.gave_up(error)
    }

    fn gave_up(&self, error: LockError) -> LockError {
        if let Some(observer) = &self.observer {
            let waited = self.began.elapsed();
            observer.gave_up(&self.key, &error, waited, self.made);
        }
        error
    }

    fn guard(self, lease: Lease, sent: SentAt, heartbeat_by: HeartbeatBy) -> LockGuard {
        let options = self.options;
        let start = Start {
            key: self.key,
            show_key: options.show_key(),
            on_lost: options.on_lost(),
            lock_id: lease.lock_id,
            fence: lease.fence,
            ttl: options.ttl(),
            max_hold: options.max_hold(),
            min_hold: options.min_hold(),
            expires_at_ms: lease.expires_at_ms,
            sent_at: sent.instant,
            sent_wall_ms: sent.wall_ms,
            heartbeat: options.heartbeat(),
            observer: self.observer,
        };
        LockGuard::start(self.backend, start, heartbeat_by)
    }
}
