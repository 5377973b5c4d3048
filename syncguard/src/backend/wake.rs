//! Waking waiters when a lock is released: the per-key queues of the waiters in this process,
//! which a backend that learns of releases (its own, or announced by its server) feeds.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use tokio::sync::Notify;

/// Where a backend announces the releases it learns of, so that the waiters of this process
/// wake at once instead of at their next poll ([`LockBackend::release_notifier`]).
///
/// The waiters of one key queue in arrival order, and only the first one tries the lock when a
/// release is announced: a waiter that has waited longest is never beaten by a newcomer of
/// this process (waiters of other processes still race it). The notifier is cheap to clone
/// (clones share the queues) and costs nothing while nobody waits.
///
/// Notifications are hints, never proof: a waiter still takes the lock with an acquire, and
/// still polls (at the retry policy's delays and at the holder's lease end) for releases that
/// nobody announces: expiries, peers that do not publish, and notifications lost on a
/// reconnect, which a backend reports with [`missed_releases`](Self::missed_releases).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use syncguard::backend::{ReleaseNotifier, Wake};
///
/// let notifier = ReleaseNotifier::new();
/// let mut first = notifier.watch("job:1");
/// let second = notifier.watch("job:1");
/// assert!(first.is_first() && !second.is_first());
///
/// notifier.released("job:1"); // what a backend calls when it learns of a release
/// assert_eq!(first.woken().await, Wake::Attempt);
/// # }
/// ```
///
/// [`LockBackend::release_notifier`]: super::LockBackend::release_notifier
#[derive(Clone, Default)]
pub struct ReleaseNotifier {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    queues: Mutex<HashMap<String, Queue>>,
    /// Waiters of every key: a release with nobody waiting skips the mutex.
    waiting: AtomicUsize,
    /// Told which keys are waited on, by a backend that listens per key (set once).
    listener: OnceLock<Arc<dyn KeyListener>>,
}

/// What a backend that listens for releases key by key (sharded Pub/Sub on a Redis Cluster)
/// is told by its notifier: which keys someone in this process waits on. Crate-private: the
/// public API of the notifier is the same for every backend.
///
/// Both calls are made with the notifier's queues locked, so that they come in the order the
/// queues changed: they must not block, and must not call the notifier back.
pub(crate) trait KeyListener: Send + Sync {
    /// A waiter of `key` waits (it was refused, or queues behind one that was), or an observer
    /// follows it: listen for its releases.
    fn listen(&self, key: &str);
    /// Nobody in this process waits on or follows `key` any more: stop listening.
    fn forget(&self, key: &str);
}

#[derive(Default)]
struct Queue {
    waiters: VecDeque<(u64, Arc<Slot>)>,
    /// Subscribers that follow the key's releases without waiting for the lock: every one of
    /// them hears of every release.
    observers: Vec<(u64, Arc<Notify>)>,
    next_ticket: u64,
    /// Whether the listener was told to listen for this key (it is told to forget it when the
    /// queue goes).
    listened: bool,
}

impl Queue {
    fn is_empty(&self) -> bool {
        self.waiters.is_empty() && self.observers.is_empty()
    }

    fn wake_observers(&self) {
        for (_, observer) in &self.observers {
            observer.notify_one();
        }
    }
}

/// One waiter's mailbox: what it was woken for, and the wake-up itself.
#[derive(Default)]
struct Slot {
    wake: Mutex<Option<Wake>>,
    notify: Notify,
}

impl Slot {
    /// Leaves `wake` for the waiter; an attempt outranks a hint to keep waiting.
    fn post(&self, wake: Wake) {
        let mut pending = lock(&self.wake);
        *pending = match (pending.take(), wake) {
            (Some(Wake::Attempt), _) | (_, Wake::Attempt) => Some(Wake::Attempt),
            (_, wait) => Some(wait),
        };
        drop(pending);
        self.notify.notify_one();
    }
}

/// Why a waiter was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Wake {
    /// The lock may be free (a release was announced, releases may have been missed, or the
    /// waiter ahead left without the lock): try it now.
    Attempt,
    /// The waiter is first in line now, behind a waiter that took the lock, whose lease ends
    /// at this time (Unix milliseconds of the backend's time authority): keep waiting, and
    /// poll.
    Wait {
        /// When the new holder's lease ends, if known.
        holder_expires_at_ms: Option<u64>,
    },
}

impl std::fmt::Debug for ReleaseNotifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseNotifier")
            .field("waiting", &self.shared.waiting.load(Ordering::Relaxed))
            .finish()
    }
}

impl ReleaseNotifier {
    /// A notifier with nobody waiting.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the listener told which keys are waited on (once: a later one is ignored). Keys
    /// listened for before it was set are not replayed: see [`listened_keys`](Self::listened_keys).
    // Only the Redis Cluster's subscriber listens per key.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    pub(crate) fn set_listener(&self, listener: Arc<dyn KeyListener>) {
        let _ = self.shared.listener.set(listener);
    }

    /// The keys the listener was told to listen for and not to forget since.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    pub(crate) fn listened_keys(&self) -> Vec<String> {
        self.queues()
            .iter()
            .filter(|(_, queue)| queue.listened)
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Tells the listener, if any, to listen for `key` unless it was told already.
    fn listen(&self, queues: &mut HashMap<String, Queue>, key: &str) {
        let Some(listener) = self.shared.listener.get() else {
            return;
        };
        if let Some(queue) = queues.get_mut(key)
            && !queue.listened
        {
            queue.listened = true;
            listener.listen(key);
        }
    }

    /// Removes the queue of `key` (empty now), telling the listener to forget the key.
    fn remove_queue(&self, queues: &mut HashMap<String, Queue>, key: &str) {
        if let Some(queue) = queues.remove(key)
            && queue.listened
            && let Some(listener) = self.shared.listener.get()
        {
            listener.forget(key);
        }
    }

    /// Announces a release of `key` (the normalized key, as the backend's operations get it):
    /// the first waiter of that key in this process tries the lock.
    pub fn released(&self, key: &str) {
        if self.shared.waiting.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(queue) = self.queues().get(key) {
            if let Some((_, first)) = queue.waiters.front() {
                first.post(Wake::Attempt);
            }
            queue.wake_observers();
        }
    }

    /// Announces that releases may have gone unannounced (a subscription was lost and is
    /// back): the first waiter of every key tries its lock.
    pub fn missed_releases(&self) {
        for queue in self.queues().values() {
            if let Some((_, first)) = queue.waiters.front() {
                first.post(Wake::Attempt);
            }
            queue.wake_observers();
        }
    }

    /// Whether any waiter of this process waits, for any key (a backend may listen only then).
    pub fn is_watched(&self) -> bool {
        self.shared.waiting.load(Ordering::Acquire) > 0
    }

    /// Joins the queue of `key`'s waiters, at its end. The waiter leaves the queue when the
    /// [`ReleaseWatch`] is dropped or [`acquired`](ReleaseWatch::acquired).
    pub fn watch(&self, key: &str) -> ReleaseWatch {
        let slot = Arc::new(Slot::default());
        let mut queues = self.queues();
        let queue = queues.entry(key.to_owned()).or_default();
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.waiters.push_back((ticket, Arc::clone(&slot)));
        self.shared.waiting.fetch_add(1, Ordering::AcqRel);
        drop(queues);
        ReleaseWatch {
            notifier: self.clone(),
            key: key.to_owned(),
            ticket,
            slot,
            left: false,
            listening: false,
        }
    }

    /// Follows the releases of `key` without waiting for the lock (to watch who holds it, say):
    /// every release announced for it wakes the [`ReleaseSubscription`], which takes no place
    /// in the waiters' queue. Dropping it unsubscribes.
    pub fn subscribe(&self, key: &str) -> ReleaseSubscription {
        let notify = Arc::new(Notify::new());
        let mut queues = self.queues();
        let queue = queues.entry(key.to_owned()).or_default();
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.observers.push((ticket, Arc::clone(&notify)));
        self.shared.waiting.fetch_add(1, Ordering::AcqRel);
        // An observer follows the key from now on.
        self.listen(&mut queues, key);
        drop(queues);
        ReleaseSubscription {
            notifier: self.clone(),
            key: key.to_owned(),
            ticket,
            notify,
        }
    }

    fn queues(&self) -> MutexGuard<'_, HashMap<String, Queue>> {
        lock(&self.shared.queues)
    }

    /// Takes waiter `ticket` out of `key`'s queue; if it was first, the next one is woken with
    /// `next`.
    fn leave(&self, key: &str, ticket: u64, next: Wake) {
        let mut queues = self.queues();
        let Some(queue) = queues.get_mut(key) else {
            return;
        };
        let Some(position) = queue.waiters.iter().position(|(t, _)| *t == ticket) else {
            return;
        };
        queue.waiters.remove(position);
        self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
        if queue.is_empty() {
            self.remove_queue(&mut queues, key);
        } else if position == 0
            && let Some((_, first)) = queue.waiters.front()
        {
            first.post(next);
        }
    }
}

/// A subscription to the releases of one key (see [`ReleaseNotifier::subscribe`]).
pub struct ReleaseSubscription {
    notifier: ReleaseNotifier,
    key: String,
    ticket: u64,
    notify: Arc<Notify>,
}

impl std::fmt::Debug for ReleaseSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseSubscription")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ReleaseSubscription {
    /// Waits for the next announced release of the key (or a reconnect after which releases
    /// may have been missed). One that came while nobody waited is kept for the next call.
    pub async fn released(&mut self) {
        self.notify.notified().await;
    }
}

impl Drop for ReleaseSubscription {
    fn drop(&mut self) {
        let mut queues = self.notifier.queues();
        let Some(queue) = queues.get_mut(&self.key) else {
            return;
        };
        let before = queue.observers.len();
        queue.observers.retain(|(ticket, _)| *ticket != self.ticket);
        if queue.observers.len() < before {
            self.notifier.shared.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        if queue.is_empty() {
            self.notifier.remove_queue(&mut queues, &self.key);
        }
    }
}

/// A place in the queue of one key's waiters (see [`ReleaseNotifier`]). Dropping it leaves the
/// queue; if it was first, the next waiter tries the lock.
pub struct ReleaseWatch {
    notifier: ReleaseNotifier,
    key: String,
    ticket: u64,
    slot: Arc<Slot>,
    left: bool,
    /// Whether the notifier's listener was asked to listen for the key on this waiter's
    /// behalf (the first time it waits).
    listening: bool,
}

impl std::fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseWatch")
            .field("key", &self.key)
            .field("ticket", &self.ticket)
            .finish_non_exhaustive()
    }
}

impl ReleaseWatch {
    /// Whether no earlier waiter of this process waits for the key.
    pub fn is_first(&self) -> bool {
        self.notifier
            .queues()
            .get(&self.key)
            .and_then(|queue| queue.waiters.front())
            .is_some_and(|(ticket, _)| *ticket == self.ticket)
    }

    /// Waits until this waiter is woken, and says why. A wake-up that came while nobody
    /// waited is kept for the next call, so none is lost between a refused attempt and the
    /// wait.
    pub async fn woken(&mut self) -> Wake {
        // Listened for from the first wait, not from joining: a waiter joins before its first
        // attempt, and most attempts take the lock without waiting.
        if !self.listening {
            self.listening = true;
            if self.notifier.shared.listener.get().is_some() {
                let mut queues = self.notifier.queues();
                self.notifier.listen(&mut queues, &self.key);
            }
        }
        loop {
            if let Some(wake) = lock(&self.slot.wake).take() {
                return wake;
            }
            self.slot.notify.notified().await;
        }
    }

    /// Leaves the queue having taken the lock, whose lease ends at `expires_at_ms`: the next
    /// waiter becomes first and keeps waiting (polling up to that time), rather than trying a
    /// lock that was just taken.
    pub fn acquired(mut self, expires_at_ms: u64) {
        self.left = true;
        self.notifier.leave(
            &self.key,
            self.ticket,
            Wake::Wait {
                holder_expires_at_ms: Some(expires_at_ms),
            },
        );
    }
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        if !self.left {
            // A waiter that gives up may have taken the last announcement with it.
            self.notifier.leave(&self.key, self.ticket, Wake::Attempt);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section completes its update before anything that could panic.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn woken_soon(watch: &mut ReleaseWatch) -> Option<Wake> {
        tokio::time::timeout(Duration::from_millis(50), watch.woken())
            .await
            .ok()
    }

    #[tokio::test]
    async fn only_the_first_waiter_is_woken_and_the_queue_moves_on() {
        let notifier = ReleaseNotifier::new();
        let mut a = notifier.watch("k");
        let mut b = notifier.watch("k");
        let mut other = notifier.watch("other");
        assert!(notifier.is_watched());
        notifier.released("k");
        assert_eq!(woken_soon(&mut a).await, Some(Wake::Attempt));
        assert_eq!(woken_soon(&mut b).await, None);
        assert_eq!(woken_soon(&mut other).await, None);

        // The first takes the lock: the next is first, told to wait until the lease ends.
        a.acquired(1_000);
        assert!(b.is_first());
        assert_eq!(
            woken_soon(&mut b).await,
            Some(Wake::Wait {
                holder_expires_at_ms: Some(1_000)
            })
        );
        // A waiter that gives up while first hands the turn on with an attempt.
        let mut c = notifier.watch("k");
        drop(b);
        assert_eq!(woken_soon(&mut c).await, Some(Wake::Attempt));
        drop(c);
        drop(other);
        assert!(!notifier.is_watched());
        assert!(notifier.queues().is_empty(), "nothing is left behind");
    }

    #[tokio::test]
    async fn wake_ups_are_kept_and_attempts_win_over_hints() {
        let notifier = ReleaseNotifier::new();
        let mut a = notifier.watch("k");
        // Posted before anyone waits: kept.
        notifier.released("k");
        let b = notifier.watch("k");
        a.slot.post(Wake::Wait {
            holder_expires_at_ms: None,
        });
        assert_eq!(woken_soon(&mut a).await, Some(Wake::Attempt));
        assert_eq!(woken_soon(&mut a).await, None);
        notifier.missed_releases();
        assert_eq!(woken_soon(&mut a).await, Some(Wake::Attempt));
        drop(b);
        assert!(a.is_first());
    }

    #[tokio::test]
    async fn subscribers_hear_every_release_and_take_no_turn() {
        let notifier = ReleaseNotifier::new();
        let mut a = notifier.subscribe("k");
        let mut b = notifier.subscribe("k");
        let mut waiter = notifier.watch("k");
        assert!(
            waiter.is_first(),
            "subscribers are not in the waiters' queue"
        );
        notifier.released("k");
        for subscriber in [&mut a, &mut b] {
            tokio::time::timeout(Duration::from_millis(50), subscriber.released())
                .await
                .expect("every subscriber hears the release");
        }
        assert_eq!(woken_soon(&mut waiter).await, Some(Wake::Attempt));
        notifier.missed_releases();
        tokio::time::timeout(Duration::from_millis(50), a.released())
            .await
            .expect("and of missed releases");
        drop((a, b, waiter));
        assert!(!notifier.is_watched());
        assert!(notifier.queues().is_empty());
    }

    /// Records what the notifier tells its listener.
    #[derive(Default)]
    struct Told(Mutex<Vec<String>>);

    impl KeyListener for Told {
        fn listen(&self, key: &str) {
            lock(&self.0).push(format!("listen {key}"));
        }
        fn forget(&self, key: &str) {
            lock(&self.0).push(format!("forget {key}"));
        }
    }

    impl Told {
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *lock(&self.0))
        }
    }

    #[tokio::test]
    async fn the_listener_hears_of_keys_waited_on_once_and_of_their_end() {
        let notifier = ReleaseNotifier::new();
        let told = Arc::new(Told::default());
        notifier.set_listener(told.clone());
        // Joining is not waiting: an acquire that takes the lock at once costs no listening.
        drop(notifier.watch("k"));
        assert_eq!(told.take(), Vec::<String>::new());

        let mut a = notifier.watch("k");
        let mut b = notifier.watch("k");
        assert_eq!(woken_soon(&mut a).await, None);
        assert_eq!(woken_soon(&mut b).await, None);
        assert_eq!(woken_soon(&mut a).await, None);
        assert_eq!(told.take(), ["listen k"], "once per key, on the first wait");
        assert_eq!(notifier.listened_keys(), ["k"]);
        let observer = notifier.subscribe("other");
        assert_eq!(
            told.take(),
            ["listen other"],
            "an observer follows from the start"
        );
        a.acquired(1);
        assert_eq!(told.take(), Vec::<String>::new(), "b still waits");
        drop(b);
        drop(observer);
        assert_eq!(told.take(), ["forget k", "forget other"]);
        assert!(notifier.listened_keys().is_empty());
    }

    #[test]
    fn a_release_with_nobody_waiting_is_nothing() {
        let notifier = ReleaseNotifier::new();
        notifier.released("k");
        notifier.missed_releases();
        assert!(notifier.queues().is_empty());
    }
}
