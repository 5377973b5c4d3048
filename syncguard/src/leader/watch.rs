//! Watching who leads, without campaigning: a task per [`LeaderWatch`] (and its clones) that
//! reads the lock when a release is announced and every `observe_every`, and publishes each
//! change.

use std::fmt;
use std::time::Duration;

use tokio::sync::watch;

use super::{Election, holder};
use crate::error::LockError;
use crate::fence::Fence;

/// Who leads an election, as an observer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's term: the fence of its lock, greater than every earlier leader's.
    pub term: Fence,
    /// The identity the leader campaigned with ([`ElectionBuilder::identity`]). For a lock
    /// on the election's key taken otherwise than by a campaign: its raw holder, or empty
    /// without one.
    ///
    /// [`ElectionBuilder::identity`]: super::ElectionBuilder::identity
    pub identity: String,
}

impl Leader {
    pub(super) fn new(term: Fence, identity: String) -> Self {
        Self { term, identity }
    }
}

impl fmt::Display for Leader {
    /// `identity (term 000000000000042)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (term {})", self.identity, self.term)
    }
}

/// Who leads an election, kept up to date: from [`Election::observe`]. `None` while nobody
/// leads.
///
/// A task reads the election's lock when the backend announces a release of it, otherwise
/// every [`observe_every`](super::ElectionBuilder::observe_every), and publishes every change
/// of leader (term or identity), vacancies included. A change that comes and goes between two
/// reads is not seen: a resignation is seen at once (on backends that announce releases), a
/// leader that crashed and its successor within `observe_every`. Leaders are seen in the
/// order they led, so their terms grow.
///
/// Clones share the task; it ends when the last of them is dropped. Like a
/// [`tokio::sync::watch::Receiver`] (which [`into_receiver`](Self::into_receiver) gives),
/// it keeps only the latest value: [`changed`](Self::changed) skips what was replaced before
/// it was looked at.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use syncguard::MemoryBackend;
/// use syncguard::leader::Election;
///
/// let backend = MemoryBackend::new();
/// let election = Election::builder(&backend, "scheduler").identity("node-a").build()?;
/// let mut watch = election.observe().await?;
/// assert_eq!(watch.current(), None);
///
/// let leadership = election.campaign().await?;
/// let leader = watch.wait_for(|leader| leader.is_some()).await?.unwrap();
/// assert_eq!((leader.term, leader.identity.as_str()), (leadership.term(), "node-a"));
///
/// leadership.resign().await?; // announced: seen at once
/// assert_eq!(watch.changed().await?, None);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LeaderWatch {
    receiver: watch::Receiver<Option<Leader>>,
}

impl LeaderWatch {
    /// The latest leader seen (`None`: nobody leads).
    pub fn current(&self) -> Option<Leader> {
        self.receiver.borrow().clone()
    }

    /// Waits for the next change of leader, and returns the new one (`None`: nobody leads).
    /// A change that came since the last call (or since [`observe`](Election::observe)) is
    /// returned at once.
    ///
    /// # Errors
    /// [`ErrorCode::Aborted`](crate::ErrorCode::Aborted) when the observing task is gone: its
    /// runtime is shutting down.
    pub async fn changed(&mut self) -> Result<Option<Leader>, LockError> {
        self.receiver
            .changed()
            .await
            .map_err(|_| LockError::aborted())?;
        Ok(self.receiver.borrow_and_update().clone())
    }

    /// Waits until the leader satisfies `predicate` (checked at once on the current one),
    /// and returns it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::MemoryBackend;
    /// use syncguard::leader::Election;
    ///
    /// let backend = MemoryBackend::new();
    /// let election = Election::builder(&backend, "jobs").identity("me").build()?;
    /// let mut watch = election.observe().await?;
    /// let leadership = election.campaign().await?;
    /// let me = watch.wait_for(|leader| leader.is_some_and(|l| l.identity == "me")).await?;
    /// assert_eq!(me.map(|leader| leader.term), Some(leadership.term()));
    /// # leadership.resign().await?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`changed`](Self::changed).
    pub async fn wait_for(
        &mut self,
        mut predicate: impl FnMut(Option<&Leader>) -> bool,
    ) -> Result<Option<Leader>, LockError> {
        let leader = self
            .receiver
            .wait_for(|leader| predicate(leader.as_ref()))
            .await
            .map_err(|_| LockError::aborted())?;
        Ok(leader.clone())
    }

    /// The underlying [`tokio::sync::watch::Receiver`], for its combinators (and
    /// `tokio_stream::wrappers::WatchStream`). The observing task lives as long as it or a
    /// clone does.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::MemoryBackend;
    /// use syncguard::leader::Election;
    ///
    /// let backend = MemoryBackend::new();
    /// let election = Election::new(&backend, "cron")?;
    /// let mut receiver = election.observe().await?.into_receiver();
    /// let leadership = election.campaign().await?;
    /// receiver.changed().await.expect("the observer runs");
    /// assert_eq!(receiver.borrow().as_ref().map(|leader| leader.term), Some(leadership.term()));
    /// # leadership.resign().await?; Ok(()) }
    /// ```
    pub fn into_receiver(self) -> watch::Receiver<Option<Leader>> {
        self.receiver
    }
}

/// After a release or a leader's end, a vacancy is read again this soon, then twice as late
/// each time (up to `observe_every`): the next leader is usually in within a round trip.
const FIRST_RECHECK: Duration = Duration::from_millis(10);

impl Election {
    /// Who leads now, read once from the backend; `None` when nobody does.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::MemoryBackend;
    /// use syncguard::leader::Election;
    ///
    /// let backend = MemoryBackend::new();
    /// let election = Election::builder(&backend, "cron").identity("web-1").build()?;
    /// assert_eq!(election.leader().await?, None);
    /// let leadership = election.campaign().await?;
    /// let leader = election.leader().await?.expect("a leader");
    /// assert_eq!((leader.term, leader.identity.as_str()), (leadership.term(), "web-1"));
    /// # leadership.resign().await?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Backend errors as they come.
    pub async fn leader(&self) -> Result<Option<Leader>, LockError> {
        let lock = crate::get_by_key(self.backend().as_ref(), self.key())
            .await?
            .map(crate::backend::LockInfo::reveal);
        Ok(lock.map(|lock| {
            let identity = match lock.holder {
                Some(holder) => holder::decode_identity(&holder).unwrap_or(holder),
                None => String::new(),
            };
            Leader::new(lock.info.fence, identity)
        }))
    }

    /// Watches who leads, without campaigning: reads the lock now, then follows it in a task
    /// (see [`LeaderWatch`]). Must be called within a tokio runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::MemoryBackend;
    /// use syncguard::leader::Election;
    ///
    /// let backend = MemoryBackend::new();
    /// let election = Election::new(&backend, "cron")?;
    /// let mut watch = election.observe().await?;
    /// let leadership = election.campaign().await?;
    /// let leader = watch.changed().await?.expect("a leader");
    /// assert_eq!(leader.term, leadership.term());
    /// # leadership.resign().await?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Backend errors of the first read. Later read errors are logged and the read retried
    /// at the next interval, keeping the last leader seen.
    pub async fn observe(&self) -> Result<LeaderWatch, LockError> {
        // Subscribed before the first read, so that no release after it goes unseen.
        let releases = self
            .backend()
            .release_notifier()
            .map(|notifier| notifier.subscribe(self.key()));
        let (sender, receiver) = watch::channel(self.leader().await?);
        tokio::spawn(observing(self.clone(), sender, releases));
        Ok(LeaderWatch { receiver })
    }
}

/// The observing task: until every receiver is gone, reads the lock when a release is
/// announced or the interval passed, and publishes changes.
async fn observing(
    election: Election,
    sender: watch::Sender<Option<Leader>>,
    mut releases: Option<crate::backend::ReleaseSubscription>,
) {
    let every = election.observe_every();
    // `Some` while a fresh vacancy is read again soon.
    let mut recheck: Option<Duration> = None;
    let mut failing = false;
    loop {
        let released = async {
            match releases.as_mut() {
                Some(releases) => releases.released().await,
                None => std::future::pending().await,
            }
        };
        let woken_by_release = tokio::select! {
            () = sender.closed() => return,
            () = released => true,
            () = tokio::time::sleep(recheck.unwrap_or(every).min(every)) => false,
        };
        match election.leader().await {
            Ok(leader) => {
                if failing {
                    failing = false;
                    tracing::info!(
                        election = election.name(),
                        "syncguard leader observer reads the lock again"
                    );
                }
                let was_led = sender.borrow().is_some();
                recheck = match (&leader, recheck) {
                    (Some(_), _) => None,
                    (None, Some(delay)) => Some(delay.saturating_mul(2)).filter(|d| *d < every),
                    (None, None) => (woken_by_release || was_led).then_some(FIRST_RECHECK),
                };
                sender.send_if_modified(|current| {
                    if *current == leader {
                        return false;
                    }
                    *current = leader;
                    true
                });
            }
            Err(error) => {
                // Logged once per run of failures; the last leader seen stays published.
                if !failing {
                    failing = true;
                    tracing::warn!(%error, election = election.name(), "syncguard leader observer could not read the lock; retrying every {every:?}");
                }
                recheck = None;
            }
        }
    }
}
