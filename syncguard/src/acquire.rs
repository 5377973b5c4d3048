//! Taking a lock: one attempt, or waiting as the retry policy says.

use std::any::Any;
use std::sync::Arc;

use crate::backend::{AcquireOutcome, Lease, LockBackend, LockObserver};
use crate::guard::{LockGuard, SentAt, Start};
use crate::key::normalize_key;
use crate::{LockError, LockName, LockOptions};

/// Acquires the lock on `key`, waiting and retrying as the options' [retry
/// policy](crate::LockOptionsBuilder::retry) says, and returns its guard, with the heartbeat
/// running (in a task of its own) unless the options turn it off.
///
/// Must be called within a tokio runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
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
/// [`LockError::InvalidArgument`] for a bad key (before any I/O); [`LockError::Contended`] when
/// the key is held and the policy allows no wait; [`LockError::AcquisitionTimeout`] when it
/// stayed held past the policy's wait; backend errors as they come (they are not retried).
pub async fn acquire<B>(
    backend: &B,
    key: &str,
    options: &LockOptions,
) -> Result<LockGuard, LockError>
where
    B: LockBackend + Clone + 'static,
{
    Acquisition::new(share(backend), key, options)?
        .wait(Keeping::Task)
        .await
}

/// Makes one attempt at the lock on `key`: the guard if it was free, `Ok(None)` if someone
/// else holds it. The options' retry policy is not used.
///
/// Must be called within a tokio runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
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
/// [`LockError::InvalidArgument`] for a bad key (before any I/O); backend errors as they
/// come. Contention is not an error.
pub async fn try_acquire<B>(
    backend: &B,
    key: &str,
    options: &LockOptions,
) -> Result<Option<LockGuard>, LockError>
where
    B: LockBackend + Clone + 'static,
{
    Acquisition::new(share(backend), key, options)?
        .once(Keeping::Task)
        .await
}

/// [`acquire`] for an integration that owns the guard inside a future of its own (a Tower
/// service's response future, a job runner): nothing keeps the lock until the owner runs
/// [`LockGuard::poll_keeper`] from its `poll`, or hands the keeper to a task with
/// [`LockGuard::spawn_keeper`]. Holding a lock then costs no task of its own.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use syncguard::{LockOptions, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let mut guard = syncguard::acquire_driven(&backend, "job:9", &LockOptions::default()).await?;
/// // ... poll `guard.poll_keeper(cx)` while the work is pending, or:
/// guard.spawn_keeper();
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`acquire`].
pub async fn acquire_driven<B>(
    backend: &B,
    key: &str,
    options: &LockOptions,
) -> Result<LockGuard, LockError>
where
    B: LockBackend + Clone + 'static,
{
    Acquisition::new(share(backend), key, options)?
        .wait(Keeping::Driven)
        .await
}

/// `backend` behind an `Arc`. A backend that already is an `Arc<dyn LockBackend>` is shared
/// as it is, not wrapped again.
pub(crate) fn share<B: LockBackend + Clone + 'static>(backend: &B) -> Arc<dyn LockBackend> {
    match (backend as &dyn Any).downcast_ref::<Arc<dyn LockBackend>>() {
        Some(shared) => Arc::clone(shared),
        None => Arc::new(backend.clone()),
    }
}

/// Who keeps the lock once it is taken.
#[derive(Debug, Clone, Copy)]
enum Keeping {
    /// A spawned task.
    Task,
    /// The guard's owner, through [`LockGuard::poll_keeper`].
    Driven,
}

/// The attempts of one acquisition: when the first was sent (the start of the wait), how
/// many were made, and who hears of the result.
struct Acquisition<'o> {
    backend: Arc<dyn LockBackend>,
    /// The normalized key.
    key: String,
    options: &'o LockOptions,
    observer: Option<Arc<dyn LockObserver>>,
    first: SentAt,
    made: u32,
}

impl<'o> Acquisition<'o> {
    fn new(
        backend: Arc<dyn LockBackend>,
        key: &str,
        options: &'o LockOptions,
    ) -> Result<Self, LockError> {
        let key = normalize_key(key)?.into_owned();
        Ok(Self {
            observer: backend.observer(),
            backend,
            key,
            options,
            first: SentAt::now(),
            made: 0,
        })
    }

    /// One attempt: the lease and when it was asked for, or `None` if the key is held.
    async fn attempt(&mut self) -> Result<Option<(Lease, SentAt)>, LockError> {
        self.made += 1;
        let sent = if self.made == 1 {
            self.first
        } else {
            SentAt::now()
        };
        match self.backend.acquire(&self.key, self.options.ttl()).await {
            Ok(AcquireOutcome::Acquired(lease)) => {
                if let Some(observer) = &self.observer {
                    let waited = self.first.instant.elapsed();
                    observer.acquired(&self.key, &lease, waited, self.made);
                }
                Ok(Some((lease, sent)))
            }
            Ok(AcquireOutcome::Contended) => Ok(None),
            Err(error) => Err(self.gave_up(error)),
        }
    }

    /// Attempts as the retry policy says.
    async fn wait(mut self, keeping: Keeping) -> Result<LockGuard, LockError> {
        let retry = self.options.retry();
        let mut delays = retry.delays();
        loop {
            if let Some((lease, sent)) = self.attempt().await? {
                return Ok(self.guard(lease, sent, keeping));
            }
            let remaining = retry.timeout().saturating_sub(self.first.instant.elapsed());
            match delays.next() {
                // Cut short at the timeout, where the last attempt is made.
                Some(delay) if !remaining.is_zero() => {
                    tokio::time::sleep(delay.min(remaining)).await;
                }
                _ => return Err(self.contended()),
            }
        }
    }

    /// One attempt; contention is `None`.
    async fn once(mut self, keeping: Keeping) -> Result<Option<LockGuard>, LockError> {
        match self.attempt().await? {
            Some((lease, sent)) => Ok(Some(self.guard(lease, sent, keeping))),
            None => {
                // Reported as a wait that gave up; the caller gets no error.
                let _ = self.contended();
                Ok(None)
            }
        }
    }

    /// The error for a key that stayed held, reported: [`LockError::Contended`] after a
    /// single attempt, [`LockError::AcquisitionTimeout`] after a wait.
    fn contended(&self) -> LockError {
        let lock = LockName::new(&self.key, self.options.show_key());
        let error = if self.made <= 1 {
            LockError::Contended { lock }
        } else {
            LockError::AcquisitionTimeout {
                lock,
                attempts: self.made,
                elapsed: self.first.instant.elapsed(),
            }
        };
        self.gave_up(error)
    }

    fn gave_up(&self, error: LockError) -> LockError {
        if let Some(observer) = &self.observer {
            let waited = self.first.instant.elapsed();
            observer.gave_up(&self.key, &error, waited, self.made);
        }
        error
    }

    fn guard(self, lease: Lease, sent: SentAt, keeping: Keeping) -> LockGuard {
        let options = self.options;
        let start = Start {
            key: self.key,
            show_key: options.show_key(),
            on_lost: options.on_lost(),
            lock_id: lease.lock_id,
            fence: lease.fence,
            ttl: options.ttl(),
            max_hold: options.max_hold(),
            expires_at_ms: lease.expires_at_ms,
            sent_at: sent.instant,
            sent_wall_ms: sent.wall_ms,
            observer: self.observer,
        };
        let driven = matches!(keeping, Keeping::Driven);
        LockGuard::start(self.backend, start, options.heartbeat(), driven)
    }
}
