//! What a guard, its handles and its heartbeat share: the lease as the guard believes it, one
//! extend at a time, and the loss.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, timeout_at};
use tokio_util::sync::CancellationToken;

use super::lease::{Belief, LeaseClock, millis, whole_millis};
use crate::backend::LockObserver;
use crate::backend::{ExtendOutcome, LockBackend, ReleaseOutcome};
use crate::error::{LockError, LostReason};
use crate::far_future::later;
use crate::fence::Fence;
use crate::lock_id::LockId;
use crate::lock_name::LockName;
use crate::options::OnLost;

pub(crate) struct Shared {
    /// The (normalized) key.
    pub(super) key: String,
    /// How errors, logs and the span name the lock.
    pub(super) name: LockName,
    /// The hold's span: the heartbeat runs in it, and it records how the hold ended.
    pub(super) span: tracing::Span,
    /// What a loss does to the work run under the lock.
    pub(super) on_lost: OnLost,
    pub(super) lock_id: LockId,
    pub(super) fence: Fence,
    /// The ttl the heartbeat asks for.
    pub(super) ttl: Duration,
    /// Whether the heartbeat extends the lease: a lease that runs out without it is
    /// [`LostReason::TtlElapsed`], which says what to change.
    pub(super) heartbeat: bool,
    pub(super) acquired_at: Instant,
    /// When the hold cap is reached; `None` without a cap.
    pub(super) hold_until: Option<Instant>,
    /// Until when a release leaves the lock in place (`min_hold`); `None`: a release frees it.
    pub(super) keep_until: Option<Instant>,
    /// The same on the backend's time authority (Unix ms): the acquire's expiry less its ttl
    /// is when the backend took the lock, so the lock is kept exactly `min_hold` there, and
    /// never longer, however late the release that asks for it lands.
    pub(super) keep_until_ms: Option<u64>,
    clock: LeaseClock,
    belief: Mutex<Belief>,
    /// Held for the whole of an extend, the heartbeat's or a manual one: with one extend in
    /// flight, replies cannot be applied in another order than the backend applied them.
    extending: tokio::sync::Mutex<()>,
    /// Woken when the deadline moves or the lock is lost.
    changed: Notify,
    /// The holder released the lock (or dropped the guard): nothing more is reported lost.
    ended: AtomicBool,
    lost_reason: OnceLock<LostReason>,
    /// Cancelled when the lock is lost. Made on first use: most holders never ask for it.
    lost_token: OnceLock<CancellationToken>,
    /// Set once the span has its outcome.
    outcome_recorded: OnceLock<()>,
    observer: Option<Arc<dyn LockObserver>>,
}

/// What one extend achieved.
pub(super) enum Extension {
    Extended,
    Lost,
    /// A backend error: the lock may still be held, and the extend may or may not apply.
    Failed(LockError),
}

/// An extend on its way: the deadline allows for it being applied at once, and unless it is
/// answered (`settled`), dropping this records it as unsettled, whether it failed, timed out
/// or its future was dropped in flight.
struct InFlight<'a> {
    shared: &'a Shared,
    sent_at: Instant,
    ttl: Duration,
    settled: bool,
}

impl<'a> InFlight<'a> {
    fn send(shared: &'a Shared, ttl: Duration) -> Self {
        let sent_at = Instant::now();
        shared.belief_mut().sending(sent_at, ttl);
        shared.changed.notify_waiters();
        Self {
            shared,
            sent_at,
            ttl,
            settled: false,
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.shared.belief_mut().unsettled(self.ttl);
        }
    }
}

/// A fresh lease, as the guard starts with it.
pub(crate) struct Start {
    pub(crate) key: String,
    pub(crate) show_key: bool,
    pub(crate) on_lost: OnLost,
    pub(crate) lock_id: LockId,
    pub(crate) fence: Fence,
    pub(crate) ttl: Duration,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) min_hold: Option<Duration>,
    pub(crate) expires_at_ms: u64,
    pub(crate) sent_at: Instant,
    pub(crate) sent_wall_ms: u64,
    pub(crate) heartbeat: bool,
    pub(crate) observer: Option<Arc<dyn LockObserver>>,
}

impl Shared {
    pub(super) fn new(start: Start) -> Self {
        let Start {
            key,
            show_key,
            on_lost,
            lock_id,
            fence,
            ttl,
            max_hold,
            min_hold,
            expires_at_ms,
            sent_at,
            sent_wall_ms,
            heartbeat,
            observer,
        } = start;
        let ttl = whole_millis(ttl);
        let hold_until = max_hold.map(|max| later(sent_at, max));
        // Counted from the answer, which came after the backend took the lock: never short.
        let keep_until = min_hold.map(|min| later(Instant::now(), min));
        let taken_at_ms = expires_at_ms.saturating_sub(millis(ttl));
        let keep_until_ms = min_hold.map(|min| taken_at_ms.saturating_add(millis(min)));
        let mut belief = Belief::granted(sent_at, ttl, expires_at_ms);
        belief.reaches_cap = hold_until.is_some_and(|cap| belief.deadline >= cap);
        let name = LockName::new(&key, show_key);
        let span = tracing::info_span!(
            "syncguard.hold",
            key_hash = name.key_hash(),
            key = tracing::field::Empty,
            %fence,
            outcome = tracing::field::Empty,
        );
        if let Some(key) = name.key() {
            span.record("key", key);
        }
        Self {
            key,
            name,
            span,
            on_lost,
            lock_id,
            fence,
            ttl,
            heartbeat,
            acquired_at: sent_at,
            hold_until,
            keep_until,
            keep_until_ms,
            clock: LeaseClock::calibrate(sent_wall_ms, ttl, expires_at_ms),
            belief: Mutex::new(belief),
            extending: tokio::sync::Mutex::new(()),
            changed: Notify::new(),
            ended: AtomicBool::new(false),
            lost_reason: OnceLock::new(),
            lost_token: OnceLock::new(),
            outcome_recorded: OnceLock::new(),
            observer,
        }
    }

    fn belief_mut(&self) -> MutexGuard<'_, Belief> {
        self.belief.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn belief(&self) -> Belief {
        *self.belief_mut()
    }

    /// Records how the hold ended in its span (the first outcome stays).
    pub(super) fn record_outcome(&self, outcome: &'static str) {
        if self.outcome_recorded.set(()).is_ok() {
            self.span.record("outcome", outcome);
        }
    }

    /// Why the lock is lost, if it is, as of now: a loss already recorded, or a deadline that
    /// has passed (recorded here, whoever asks first). Never `None` for a lease that may have
    /// run out, whether or not the heartbeat has run since.
    pub(crate) fn loss(&self) -> Option<LostReason> {
        if let Some(reason) = self.lost_reason.get() {
            // Whoever sees the loss sees the token cancelled, even while the thread that
            // recorded it has not reached its own cancel yet.
            if let Some(token) = self.lost_token.get()
                && !token.is_cancelled()
            {
                token.cancel();
            }
            return Some(*reason);
        }
        if self.ended.load(Ordering::Acquire) {
            return None;
        }
        let belief = self.belief();
        let now = Instant::now();
        if belief.deadline > now {
            return None;
        }
        // Without a heartbeat nothing extends the lease, so a hold cap reached meanwhile is
        // not what ended it: the ttl is.
        let reason = if !self.heartbeat {
            LostReason::TtlElapsed
        } else if belief.reaches_cap || self.hold_until.is_some_and(|cap| now >= cap) {
            LostReason::MaxHoldReached
        } else {
            LostReason::LeaseExpired
        };
        Some(self.mark_lost(reason))
    }

    /// Whether the lock can still be relied on: neither released (or dropped) by its guard nor
    /// lost.
    pub(super) fn is_held(&self) -> bool {
        !self.ended.load(Ordering::Acquire) && self.loss().is_none()
    }

    /// Records the loss (the first reason stays) and returns the reason recorded. Nothing is
    /// recorded once the holder let go of the lock: an answer that arrives after the release
    /// is no loss.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> LostReason {
        if self.ended.load(Ordering::Acquire) {
            return self.lost_reason().unwrap_or(reason);
        }
        if self.lost_reason.set(reason).is_ok() {
            // The work first: cancelled before the loss is logged or observed.
            if let Some(token) = self.lost_token.get() {
                token.cancel();
            }
            self.record_outcome("lost");
            tracing::warn!(parent: &self.span, lock = %self.name, fence = %self.fence, %reason, "syncguard lock lost");
            if let Some(observer) = &self.observer {
                observer.lost(&self.key, &self.lock_id, reason, self.acquired_at.elapsed());
            }
            self.changed.notify_waiters();
        }
        *self.lost_reason.get().unwrap_or(&reason)
    }

    /// The loss as recorded so far (not checking the deadline).
    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.lost_reason.get().copied()
    }

    /// [`shutdown`](super::shutdown::shutdown) is about to release the lock: a holder that
    /// still has it learns that it is lost first.
    pub(super) fn end_by_shutdown(&self) {
        if !self.ended.load(Ordering::Acquire) {
            self.mark_lost(LostReason::Shutdown);
        }
        self.end();
    }

    /// The hold cap leaves no room for another extend: the current lease is the last.
    pub(super) fn lease_reaches_cap(&self) {
        self.belief_mut().reaches_cap = true;
    }

    /// The holder let go of the lock: from now on nothing is reported lost.
    pub(super) fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }

    pub(super) fn lost_token(&self) -> &CancellationToken {
        let token = self.lost_token.get_or_init(CancellationToken::new);
        // A loss recorded before the token existed did not cancel it.
        if self.loss().is_some() {
            token.cancel();
        }
        token
    }

    /// Completes when the lock is lost, with the reason, also when the deadline passes while
    /// nobody else looks; never while it is held.
    pub(super) async fn lost(&self) -> LostReason {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(reason) = self.loss() {
                return reason;
            }
            if self.ended.load(Ordering::Acquire) {
                // Released, not lost: nothing more will be reported.
                return std::future::pending().await;
            }
            let deadline = self.belief().deadline;
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                () = changed => {}
            }
        }
    }

    /// Notified when the deadline moves or the lock is lost.
    pub(super) fn changed(&self) -> &Notify {
        &self.changed
    }

    /// Extends the lease to *now + `ttl`*, after any extend already in flight, and never
    /// waits past the deadline. `reaches_cap`: this is the last extend the hold cap allows.
    pub(super) async fn extend(
        &self,
        backend: &dyn LockBackend,
        ttl: Duration,
        reaches_cap: bool,
    ) -> Extension {
        let ttl = whole_millis(ttl);
        let _one_at_a_time = self.extending.lock().await;
        if self.loss().is_some() {
            return Extension::Lost;
        }
        let mut in_flight = InFlight::send(self, ttl);
        // Read after the send: the extend itself may have shortened the lease.
        let deadline = self.belief().deadline;
        let reply = timeout_at(deadline, backend.extend(&self.lock_id, ttl)).await;
        let extension = match reply {
            Ok(Ok(ExtendOutcome::Extended { expires_at_ms })) => {
                in_flight.settled = true;
                let mut belief = self.belief_mut();
                belief.extended(self.clock, in_flight.sent_at, ttl, expires_at_ms);
                belief.reaches_cap |= reaches_cap;
                Extension::Extended
            }
            Ok(Ok(ExtendOutcome::NotHeld(_))) => {
                in_flight.settled = true;
                self.mark_lost(LostReason::NotHeld);
                Extension::Lost
            }
            Ok(Err(error)) => Extension::Failed(error),
            Err(_deadline_passed) => {
                drop(in_flight);
                if self.loss().is_none() {
                    self.mark_lost(LostReason::LeaseExpired);
                }
                Extension::Lost
            }
        };
        self.changed.notify_waiters();
        if self.loss().is_some() {
            return Extension::Lost;
        }
        extension
    }

    /// Lets the lock go: released, or, before its `min_hold` is over, left to expire then: its
    /// expiry set to the end of the minimum hold on the backend's clock (which the caller
    /// counts as a release). A fixed time, not a ttl: a request that lands late (held up in a
    /// partition) can never keep the lock past it.
    pub(super) async fn let_go(
        &self,
        backend: &dyn LockBackend,
    ) -> Result<ReleaseOutcome, LockError> {
        let keeps = self
            .keep_until
            .is_some_and(|until| until.saturating_duration_since(Instant::now()).as_millis() >= 1);
        let (true, Some(until_ms)) = (keeps, self.keep_until_ms) else {
            return backend.release(&self.lock_id).await;
        };
        Ok(match backend.expire_at(&self.lock_id, until_ms).await? {
            ExtendOutcome::Extended { .. } => ReleaseOutcome::Released,
            ExtendOutcome::NotHeld(reason) => ReleaseOutcome::NotHeld(reason),
        })
    }

    pub(super) fn report_heartbeat(&self, ok: bool) {
        if let Some(observer) = &self.observer {
            observer.heartbeat(&self.key, &self.lock_id, ok);
        }
    }

    /// Records the answer to the release: whether it released the lock, or the error.
    pub(super) fn report_release(
        &self,
        outcome: Result<ReleaseOutcome, LockError>,
    ) -> Result<bool, LockError> {
        let released = match outcome {
            Ok(outcome) => outcome.is_released(),
            Err(error) => {
                self.record_outcome("release_failed");
                return Err(error);
            }
        };
        if released {
            self.record_outcome("released");
            if let Some(observer) = &self.observer {
                observer.released(&self.key, &self.lock_id, self.acquired_at.elapsed());
            }
        } else {
            self.record_outcome("not_held");
        }
        Ok(released)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::backend::time::now_ms;

    /// Holds the thread that records a loss inside the observer's `lost` until released.
    struct SlowObserver {
        entered: Mutex<mpsc::Sender<()>>,
        go_on: Mutex<mpsc::Receiver<()>>,
    }

    impl LockObserver for SlowObserver {
        fn lost(&self, _: &str, _: &LockId, _: LostReason, _: Duration) {
            let _ = self.entered.lock().unwrap().send(());
            let _ = self.go_on.lock().unwrap().recv();
        }
    }

    fn shared(observer: Arc<dyn LockObserver>) -> Shared {
        let wall = now_ms();
        Shared::new(Start {
            key: "state-test".to_owned(),
            show_key: false,
            on_lost: OnLost::Cancel,
            lock_id: LockId::generate(),
            fence: Fence::new(1).unwrap(),
            ttl: Duration::from_secs(30),
            max_hold: None,
            min_hold: None,
            expires_at_ms: wall + 30_000,
            sent_at: Instant::now(),
            sent_wall_ms: wall,
            heartbeat: true,
            observer: Some(observer),
        })
    }

    /// Whoever sees the loss sees the work's token cancelled, even while the thread that
    /// recorded the loss is still busy telling the observer.
    #[test]
    fn a_loss_seen_is_a_token_cancelled() {
        let (entered, is_entered) = mpsc::channel();
        let (go_on, released) = mpsc::channel();
        let shared = Arc::new(shared(Arc::new(SlowObserver {
            entered: Mutex::new(entered),
            go_on: Mutex::new(released),
        })));
        let token = shared.lost_token().clone();
        let recorder = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || shared.mark_lost(LostReason::NotHeld))
        };
        is_entered.recv().unwrap();
        assert_eq!(shared.loss(), Some(LostReason::NotHeld));
        assert!(
            token.is_cancelled(),
            "the loss is visible: so is the cancel"
        );
        go_on.send(()).unwrap();
        assert_eq!(recorder.join().unwrap(), LostReason::NotHeld);
    }
}
