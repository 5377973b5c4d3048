//! Holding a lock: the guard, its heartbeat, and loss detection.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::backend::{ExtendOutcome, Lease, LockBackend, ReleaseOutcome};
use crate::key_text::KeyText;
use crate::observe::LockObserver;
use crate::time::now_ms;
use crate::{Fence, LockError, LockId, LostReason};

/// A held lock. It keeps the lock alive with a heartbeat (unless turned off), tells the holder
/// when the lock is lost, and releases it.
///
/// Get one from [`acquire`](crate::acquire), or let [`with_lock`](crate::with_lock) manage it.
///
/// - **Heartbeat.** A background task extends the lock when a third of its ttl has passed,
///   scheduling from the expiry each extend returns. It rides out backend errors while the
///   lease lasts. [`LockOptions::with_max_hold`](crate::LockOptions::with_max_hold) caps the
///   total hold time.
/// - **Loss.** The lock is lost when an extend answers that it is no longer held, or when the
///   lease runs out without a successful extend. Observe it with [`lost`](Self::lost) (await),
///   [`is_lost`](Self::is_lost) (poll) or [`lost_token`](Self::lost_token) (a
///   [`CancellationToken`] that fires).
/// - **Release.** [`release`](Self::release) releases now and reports the result. Dropping
///   the guard stops the heartbeat and releases **in the background**: the lock stays held
///   until that spawned release reaches the backend (or, without a tokio runtime, until its
///   ttl runs out). Call `release().await` when the next owner should not wait. (A backend
///   that answers at once, such as `MemoryBackend`, is released
///   during the drop itself.)
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use std::time::Duration;
/// use syncguard::{LockOptions, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let options = LockOptions::new("invoice:7").with_ttl(Duration::from_secs(10));
/// let guard = syncguard::acquire(&backend, &options).await?;
/// let fence = guard.fence(); // hand this to the resource you write to
/// tokio::select! {
///     _ = tokio::time::sleep(Duration::from_millis(10)) => {} // the work
///     reason = guard.lost() => return Err(syncguard::LockError::LockLost { reason }),
/// }
/// assert!(guard.release().await?);
/// # let _ = fence; Ok(()) }
/// ```
#[must_use = "dropping a LockGuard releases the lock (in the background) at once"]
pub struct LockGuard {
    shared: Arc<Shared>,
    backend: Arc<dyn LockBackend>,
    keeper: Keeper,
    /// Whether dropping the guard should still release the lock.
    release_on_drop: bool,
}

/// What keeps the lock alive (heartbeat and loss detection).
enum Keeper {
    /// A spawned task, aborted when this is dropped: it runs with nobody polling the guard.
    Task {
        _abort_on_drop: AbortOnDropHandle<()>,
    },
    /// Run by the guard's owner through [`LockGuard::poll_keeper`], inside the owner's task,
    /// so that holding a lock for a short request costs no task, no cross-thread wake-up and
    /// no timer. The future is only created once the owner has to wait.
    Driven {
        policy: KeepPolicy,
        // Only ever reached through `&mut` (`get_mut`, no locking): the mutex is there to
        // keep `LockGuard: Sync`, which the future (holding backend futures) is not.
        running: Option<Mutex<KeepFuture>>,
    },
    /// Released, or lost (the keeper ends once it marks the lock lost).
    Stopped,
}

type KeepFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// State shared between the guard and its keeper task.
struct Shared {
    key: KeyText,
    lock_id: LockId,
    fence: Fence,
    ttl: Duration,
    acquired_at: Instant,
    clock: LeaseClock,
    lease: Mutex<LeaseState>,
    /// Wakes the keeper when a manual extend moved the deadline.
    renewed: Notify,
    /// Set once, when the lock is lost.
    lost_reason: OnceLock<LostReason>,
    /// Cancelled when the lock is lost. Made on first use: most holders never ask for it.
    lost_token: OnceLock<CancellationToken>,
    observer: Option<Arc<dyn LockObserver>>,
}

#[derive(Clone, Copy)]
struct LeaseState {
    /// Local instant by which the lock must be assumed gone.
    deadline: Instant,
    expires_at_ms: u64,
}

/// Converts the backend's authoritative expiry into a local deadline.
///
/// The offset between the time authority and the local clock is estimated from the acquire:
/// the backend computed `expires_at_ms - ttl` at some moment after the request was sent, so
/// `expires_at_ms - ttl - local_send_time` over-estimates the authority's lead. Over-estimating
/// makes every deadline early, never late.
#[derive(Clone, Copy)]
struct LeaseClock {
    authority_lead_ms: i64,
}

impl LeaseClock {
    fn calibrate(sent_wall_ms: Option<u64>, ttl: Duration, expires_at_ms: u64) -> Self {
        let Some(sent_wall_ms) = sent_wall_ms else {
            return Self {
                authority_lead_ms: 0,
            };
        };
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        Self {
            authority_lead_ms: (expires_at_ms as i64)
                .saturating_sub(ttl_ms)
                .saturating_sub(sent_wall_ms as i64),
        }
    }

    /// The local deadline of a lease granted for `ttl` by a request sent at `sent_at`: the
    /// earlier of the ttl counted from the send (needs no clock agreement) and the
    /// authoritative expiry translated to local time.
    fn deadline(self, sent_at: Instant, ttl: Duration, expires_at_ms: u64) -> Instant {
        let authority_now = (now_ms() as i64).saturating_add(self.authority_lead_ms);
        let left_ms = (expires_at_ms as i64).saturating_sub(authority_now).max(0);
        let by_expiry = Instant::now() + Duration::from_millis(left_ms as u64);
        (sent_at + ttl).min(by_expiry)
    }
}

/// When an acquire request was sent, on the monotonic and the wall clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SentAt {
    pub(crate) instant: Instant,
    /// `None` for a request the backend answered at once, on the local clock
    /// ([`LockBackend::try_acquire_now`]): its own reading is the send time, so the authority
    /// leads by nothing, and the wall clock need not be read twice.
    pub(crate) wall_ms: Option<u64>,
}

impl SentAt {
    pub(crate) fn now() -> Self {
        Self {
            instant: Instant::now(),
            wall_ms: Some(now_ms()),
        }
    }

    /// For a request the backend answers at once.
    pub(crate) fn at_once() -> Self {
        Self {
            instant: Instant::now(),
            wall_ms: None,
        }
    }
}

/// How a guard keeps and watches its lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeepPolicy {
    pub(crate) heartbeat: bool,
    pub(crate) max_hold: Option<Duration>,
    /// Whether the guard's owner runs the keeper ([`LockGuard::poll_keeper`]) instead of a
    /// spawned task.
    pub(crate) driven: bool,
}

impl LockGuard {
    /// Wraps a fresh lease. With `policy.driven`, the owner runs the keeper (heartbeat and
    /// loss detection) with [`poll_keeper`](Self::poll_keeper); otherwise a task is spawned
    /// for it.
    ///
    /// Must be called within a tokio runtime.
    pub(crate) fn start(
        backend: Arc<dyn LockBackend>,
        key: KeyText,
        ttl: Duration,
        lease: Lease,
        sent: SentAt,
        policy: KeepPolicy,
        observer: Option<Arc<dyn LockObserver>>,
    ) -> Self {
        let clock = LeaseClock::calibrate(sent.wall_ms, ttl, lease.expires_at_ms);
        let sent_at = sent.instant;
        let shared = Arc::new(Shared {
            key,
            lock_id: lease.lock_id,
            fence: lease.fence,
            ttl,
            acquired_at: sent_at,
            lease: Mutex::new(LeaseState {
                // What `clock.deadline` would say: the clock was calibrated on this very lease,
                // so its authoritative expiry is the ttl from the send. No clock reading needed.
                deadline: sent_at + ttl,
                expires_at_ms: lease.expires_at_ms,
            }),
            clock,
            renewed: Notify::new(),
            lost_reason: OnceLock::new(),
            lost_token: OnceLock::new(),
            observer,
        });
        let keeper = if policy.driven {
            Keeper::Driven {
                policy,
                running: None,
            }
        } else {
            let task = tokio::spawn(keep(Arc::clone(&shared), Arc::clone(&backend), policy));
            Keeper::Task {
                _abort_on_drop: AbortOnDropHandle::new(task),
            }
        };
        Self {
            shared,
            backend,
            keeper,
            release_on_drop: true,
        }
    }

    /// Runs the keeper of a driven guard: extends the lock when due and notices its loss.
    /// `Ready` with the reason once the lock is lost, `Pending` while it is held (the waker of
    /// `cx` is woken when the next extend is due, or when an extend in flight completes).
    ///
    /// The owner calls it whenever its task is polled while it holds the lock; a heartbeat
    /// only happens while somebody polls. A guard whose keeper is a task (from
    /// [`acquire`](crate::acquire), or after [`detach_keeper`](Self::detach_keeper)) is kept
    /// by that task: this only reports whether it is lost, and registers no waker.
    pub(crate) fn poll_keeper(&mut self, cx: &mut Context<'_>) -> Poll<LostReason> {
        let Self {
            shared,
            backend,
            keeper,
            ..
        } = self;
        if let Keeper::Driven { policy, running } = keeper {
            let keeping = running.get_or_insert_with(|| {
                Mutex::new(Box::pin(keep(
                    Arc::clone(shared),
                    Arc::clone(backend),
                    *policy,
                )))
            });
            let keeping = keeping
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if keeping.as_mut().poll(cx).is_ready() {
                *keeper = Keeper::Stopped;
            }
        }
        match self.lost_reason() {
            Some(reason) => Poll::Ready(reason),
            None => Poll::Pending,
        }
    }

    /// Hands the keeper of a driven guard over to a spawned task, for when the lock must be
    /// kept while nobody polls the guard. The guard then behaves as one from
    /// [`acquire`](crate::acquire). No effect on a guard whose keeper is already a task, or
    /// whose lock is lost.
    ///
    /// Must be called within a tokio runtime.
    pub(crate) fn detach_keeper(&mut self) {
        let Keeper::Driven { policy, running } = &mut self.keeper else {
            return;
        };
        let running = running.take().map(|running| {
            running
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        });
        let keeping = running.unwrap_or_else(|| {
            Box::pin(keep(
                Arc::clone(&self.shared),
                Arc::clone(&self.backend),
                *policy,
            ))
        });
        self.keeper = Keeper::Task {
            _abort_on_drop: AbortOnDropHandle::new(tokio::spawn(keeping)),
        };
    }

    /// The (NFC-normalized) key this guard holds.
    pub fn key(&self) -> &str {
        self.shared.key.as_str()
    }

    /// The lock id of this acquisition.
    pub fn lock_id(&self) -> &LockId {
        &self.shared.lock_id
    }

    /// The fencing token of this acquisition: pass it to the resource the lock protects.
    pub fn fence(&self) -> Fence {
        self.shared.fence
    }

    /// The ttl each extend asks for.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The latest authoritative expiry (Unix ms of the backend's time authority).
    pub fn expires_at_ms(&self) -> u64 {
        self.shared.lease().expires_at_ms
    }

    /// How long the lock has been held.
    pub fn held_for(&self) -> Duration {
        self.shared.acquired_at.elapsed()
    }

    /// Whether the lock has been lost.
    pub fn is_lost(&self) -> bool {
        self.shared.is_lost()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason.get().copied()
    }

    /// Completes when the lock is lost, with the reason; never completes while it is held.
    pub async fn lost(&self) -> LostReason {
        self.shared.lost_token().cancelled().await;
        self.lost_reason().unwrap_or(LostReason::NotHeld)
    }

    /// A token that is cancelled when the lock is lost, for work that already listens to a
    /// [`CancellationToken`]. It is not cancelled by a release.
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.lost_token().clone()
    }

    /// Extends the lock now to *now + `ttl`*, on top of (or instead of) the heartbeat.
    /// Returns `false`, and marks the lock lost, if it was no longer held.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a bad ttl; backend errors as they come (the lock is
    /// not marked lost for those: the lease may still be valid).
    pub async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let sent_at = Instant::now();
        match self.backend.extend(&self.shared.lock_id, ttl).await? {
            ExtendOutcome::Extended { expires_at_ms } => {
                self.shared.renew(sent_at, ttl, expires_at_ms);
                self.shared.renewed.notify_one();
                Ok(true)
            }
            ExtendOutcome::NotHeld(_) => {
                self.shared.mark_lost(LostReason::NotHeld);
                Ok(false)
            }
        }
    }

    /// Stops the heartbeat and releases the lock. Returns `true` if this call released it,
    /// `false` if it was no longer held (expired or taken over).
    ///
    /// # Errors
    /// Backend errors as they come; the lock then expires at the end of its ttl.
    pub async fn release(mut self) -> Result<bool, LockError> {
        if let Some(released) = self.release_now() {
            return released;
        }
        self.keeper = Keeper::Stopped; // stops the heartbeat
        let outcome = self.backend.release(&self.shared.lock_id).await;
        // If this future is dropped before here, the drop releases in the background instead.
        self.released(outcome)
    }

    /// [`release`](Self::release) without a future, when the backend answers at once
    /// ([`LockBackend::try_release_now`]); `None`, with nothing done, when it cannot. The
    /// guard is then spent: dropping it releases nothing more.
    pub(crate) fn release_now(&mut self) -> Option<Result<bool, LockError>> {
        let outcome = self.backend.try_release_now(&self.shared.lock_id)?;
        self.keeper = Keeper::Stopped;
        Some(self.released(outcome))
    }

    fn released(&mut self, outcome: Result<ReleaseOutcome, LockError>) -> Result<bool, LockError> {
        // Reached the backend: no second release on drop.
        self.release_on_drop = false;
        let released = outcome?.is_released();
        if released {
            self.shared.report_released();
        }
        Ok(released)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.keeper = Keeper::Stopped;
        // A lock the backend already disowned needs no release; one whose lease merely ran
        // out locally (backend unreachable) may still be stored, so release it.
        if !self.release_on_drop || self.lost_reason() == Some(LostReason::NotHeld) {
            return;
        }
        // A backend that answers at once needs no task for it.
        if let Some(outcome) = self.backend.try_release_now(&self.shared.lock_id) {
            report_dropped_release(&self.shared, outcome);
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(
                "LockGuard dropped outside a tokio runtime; the lock will expire at the end of its ttl"
            );
            return;
        };
        let backend = Arc::clone(&self.backend);
        let shared = Arc::clone(&self.shared);
        runtime.spawn(async move {
            let outcome = backend.release(&shared.lock_id).await;
            report_dropped_release(&shared, outcome);
        });
    }
}

fn report_dropped_release(shared: &Shared, outcome: Result<ReleaseOutcome, LockError>) {
    match outcome {
        Ok(outcome) if outcome.is_released() => shared.report_released(),
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(%error, "release of a dropped LockGuard failed; the lock will expire at the end of its ttl");
        }
    }
}

/// A cheap handle on what a [`LockGuard`] holds (key, lock id, fence) and on its loss, for
/// code that must not own the guard, such as a request's extensions. Cloning it copies no
/// string. It does not keep the lock: that stays the guard's job.
#[derive(Clone)]
pub struct GuardView {
    shared: Arc<Shared>,
}

impl GuardView {
    /// The view of `guard`.
    pub fn of(guard: &LockGuard) -> Self {
        Self {
            shared: Arc::clone(&guard.shared),
        }
    }

    /// As [`LockGuard::key`].
    pub fn key(&self) -> &str {
        self.shared.key.as_str()
    }

    /// As [`LockGuard::lock_id`].
    pub fn lock_id(&self) -> &LockId {
        &self.shared.lock_id
    }

    /// As [`LockGuard::fence`].
    pub fn fence(&self) -> Fence {
        self.shared.fence
    }

    /// As [`LockGuard::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.shared.is_lost()
    }

    /// As [`LockGuard::lost_reason`].
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason.get().copied()
    }

    /// The token [`LockGuard::lost_token`] clones.
    pub fn lost_token(&self) -> &CancellationToken {
        self.shared.lost_token()
    }
}

impl fmt::Debug for GuardView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardView")
            .field("key", &self.shared.key)
            .field("lock_id", &self.shared.lock_id)
            .field("fence", &self.shared.fence)
            .field("lost", &self.lost_reason())
            .finish()
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock_id", &self.shared.lock_id)
            .field("fence", &self.shared.fence)
            .field("expires_at_ms", &self.expires_at_ms())
            .field("lost", &self.lost_reason())
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn lease(&self) -> LeaseState {
        *self
            .lease
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn renew(&self, sent_at: Instant, ttl: Duration, expires_at_ms: u64) {
        let deadline = self.clock.deadline(sent_at, ttl, expires_at_ms);
        let mut lease = self
            .lease
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *lease = LeaseState {
            deadline,
            expires_at_ms,
        };
    }

    fn is_lost(&self) -> bool {
        self.lost_reason.get().is_some()
    }

    fn lost_token(&self) -> &CancellationToken {
        let token = self.lost_token.get_or_init(CancellationToken::new);
        // With the fence in `mark_lost`: a loss recorded before the token existed is seen
        // here, one recorded after sees the token there.
        fence(Ordering::SeqCst);
        if self.is_lost() {
            token.cancel();
        }
        token
    }

    fn mark_lost(&self, reason: LostReason) {
        if self.lost_reason.set(reason).is_ok() {
            tracing::warn!(fence = %self.fence, %reason, "syncguard lock lost");
            if let Some(observer) = &self.observer {
                observer.lost(self.key.as_str(), reason, self.acquired_at.elapsed());
            }
            fence(Ordering::SeqCst);
            if let Some(token) = self.lost_token.get() {
                token.cancel();
            }
        }
    }

    fn report_released(&self) {
        if let Some(observer) = &self.observer {
            observer.released(self.key.as_str(), self.acquired_at.elapsed());
        }
    }

    fn report_heartbeat(&self, ok: bool) {
        if let Some(observer) = &self.observer {
            observer.heartbeat(self.key.as_str(), ok);
        }
    }
}

/// What one heartbeat extend achieved.
enum Renewal {
    Renewed,
    NotHeld,
    Failed,
    DeadlinePassed,
    /// The hold cap leaves no room for another extend.
    CapReached,
}

/// The keeper task: extends the lock on schedule (if the heartbeat is on) and marks it lost
/// when an extend says it is gone or its lease runs out.
async fn keep(shared: Arc<Shared>, backend: Arc<dyn LockBackend>, policy: KeepPolicy) {
    let ttl = shared.ttl;
    // After a failed extend, retry this often while the lease lasts.
    let retry_every = (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    // A lease that ends once the hold cap is reached ended because of the cap, whichever path
    // notices it first (a keeper woken late on a loaded machine may find the deadline passed).
    let lapsed = || {
        if policy
            .max_hold
            .is_some_and(|max| shared.acquired_at.elapsed() >= max)
        {
            LostReason::MaxHoldReached
        } else {
            LostReason::LeaseExpired
        }
    };
    loop {
        let LeaseState { deadline, .. } = shared.lease();
        let now = Instant::now();
        if deadline <= now {
            shared.mark_lost(lapsed());
            return;
        }
        let cap_left = policy
            .max_hold
            .map(|max| (shared.acquired_at + max).saturating_duration_since(now));
        let lease_covers_cap = cap_left.is_some_and(|left| deadline - now >= left);

        if policy.heartbeat && !lease_covers_cap {
            // Extend once a third of the ttl has passed since the lease was granted.
            let due = deadline.checked_sub(ttl - ttl / 3).unwrap_or(now).max(now);
            tokio::select! {
                () = sleep_until(due) => {}
                () = shared.renewed.notified() => continue,
            }
            let extend_ttl = policy.max_hold.map_or(ttl, |max| {
                (shared.acquired_at + max)
                    .saturating_duration_since(Instant::now())
                    .min(ttl)
            });
            match renew(&shared, backend.as_ref(), extend_ttl, deadline).await {
                Renewal::Renewed => {}
                Renewal::NotHeld => {
                    shared.mark_lost(LostReason::NotHeld);
                    return;
                }
                Renewal::Failed => {
                    let now = Instant::now();
                    sleep(retry_every.min(deadline.saturating_duration_since(now))).await;
                }
                Renewal::DeadlinePassed => {
                    shared.mark_lost(lapsed());
                    return;
                }
                Renewal::CapReached => {
                    // Less than 1 ms of the hold cap left: let the current lease run out.
                    sleep_until(deadline).await;
                    shared.mark_lost(LostReason::MaxHoldReached);
                    return;
                }
            }
            continue;
        }

        // No heartbeat, or the lease already reaches the hold cap: wait for the lease to run
        // out, unless a manual extend moves it.
        tokio::select! {
            () = sleep_until(deadline) => {
                if shared.lease().deadline <= Instant::now() {
                    let reason = if lease_covers_cap && policy.heartbeat {
                        LostReason::MaxHoldReached
                    } else {
                        lapsed()
                    };
                    shared.mark_lost(reason);
                    return;
                }
            }
            () = shared.renewed.notified() => {}
        }
    }
}

async fn renew(
    shared: &Shared,
    backend: &dyn LockBackend,
    ttl: Duration,
    deadline: Instant,
) -> Renewal {
    if ttl < Duration::from_millis(1) {
        return Renewal::CapReached;
    }
    let sent_at = Instant::now();
    match timeout_at(deadline, backend.extend(&shared.lock_id, ttl)).await {
        Err(_elapsed) => {
            shared.report_heartbeat(false);
            Renewal::DeadlinePassed
        }
        Ok(Ok(ExtendOutcome::Extended { expires_at_ms })) => {
            shared.renew(sent_at, ttl, expires_at_ms);
            shared.report_heartbeat(true);
            Renewal::Renewed
        }
        Ok(Ok(ExtendOutcome::NotHeld(_))) => {
            shared.report_heartbeat(false);
            Renewal::NotHeld
        }
        Ok(Err(error)) => {
            shared.report_heartbeat(false);
            tracing::warn!(%error, fence = %shared.fence, "syncguard heartbeat extend failed; retrying while the lease lasts");
            Renewal::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_never_later_than_ttl_from_send() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(10);
        let wall = now_ms();
        // Authority clock 1 h ahead of ours: the ttl bound still applies.
        let clock = LeaseClock::calibrate(Some(wall), ttl, wall + 3_600_000 + 10_000);
        let deadline = clock.deadline(sent, ttl, wall + 3_600_000 + 10_000);
        assert!(deadline <= sent + ttl);
        assert!(deadline + Duration::from_millis(500) >= sent + ttl);
    }

    #[test]
    fn deadline_follows_a_shorter_authoritative_expiry() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(10);
        let wall = now_ms();
        let clock = LeaseClock::calibrate(Some(wall), ttl, wall + 10_000);
        // A later extend reports an expiry only 2 s ahead (e.g. a shortened lease).
        let deadline = clock.deadline(sent, ttl, now_ms() + 2_000);
        assert!(deadline <= Instant::now() + Duration::from_millis(2_000));
        assert!(deadline + Duration::from_millis(500) >= Instant::now() + Duration::from_secs(2));
    }

    #[test]
    fn an_answer_at_once_is_on_our_own_clock() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(10);
        let clock = LeaseClock::calibrate(None, ttl, now_ms() + 10_000);
        assert_eq!(clock.authority_lead_ms, 0);
        // A later extend to 2 s from now is read as 2 s from now here.
        let deadline = clock.deadline(sent, ttl, now_ms() + 2_000);
        assert!(deadline <= Instant::now() + Duration::from_millis(2_000));
        assert!(deadline + Duration::from_millis(500) >= Instant::now() + Duration::from_secs(2));
    }
}
