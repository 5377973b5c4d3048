//! Holding a lock: the guard, its heartbeat, and loss detection.
//!
//! - `lease`: what the guard may believe about its lease (the local deadline), from what the
//!   backend can have done;
//! - `state`: what the guard, its views and its keeper share, and the one extend in flight;
//! - `keeper`: the heartbeat;
//! - `handle`: the cheap read-only handle on a guard;
//! - `run`: running work under the guard, and the release at its end;
//! - `release`: the release of a dropped guard;
//! - `shutdown`: the locks this process holds, released together on shutdown.

mod handle;
mod keeper;
mod lease;
mod let_go;
mod release;
mod run;
pub(crate) mod shutdown;
mod state;

pub use handle::LockHandle;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::backend::LockBackend;
use crate::error::{LockError, LostReason};
use crate::fence::Fence;
use crate::lock_id::LockId;
use crate::lock_name::LockName;
use crate::time::ttl_millis;
use shutdown::Registration;
pub(crate) use state::Start;
use state::{Extension, Shared};

/// A held lock. It keeps the lock alive with a heartbeat (unless turned off), tells the holder
/// when the lock is lost, and releases it.
///
/// Get one from [`acquire`](crate::acquire), or let [`with_lock`](crate::with_lock) manage it.
///
/// - **Held** means: the lease the backend granted (or last extended) cannot have run out yet.
///   The guard keeps a local deadline that is never later than any expiry the backend can
///   have set: counted from when each request was *sent*, capped by the authoritative expiry
///   the backend reports, with one extend in flight at a time (a manual
///   [`extend`](Self::extend) waits for the heartbeat's), and cut short by any extend whose
///   outcome is unknown.
/// - **Heartbeat.** A background task extends the lock when a third of its ttl has passed. It
///   rides out backend errors while the lease lasts.
///   [`LockOptionsBuilder::max_hold`](crate::LockOptionsBuilder::max_hold) caps the total hold
///   time.
/// - **Loss.** The lock is lost when an extend answers that it is no longer held, or when the
///   deadline passes without a successful extend. Every way of asking checks the deadline at
///   the moment it is asked, so a thread or runtime that was blocked past the lease learns of
///   the loss as soon as it looks: [`lost`](Self::lost) (await), [`is_lost`](Self::is_lost)
///   and [`lost_reason`](Self::lost_reason) (poll), [`lost_token`](Self::lost_token) (a
///   [`CancellationToken`] that fires). A loss is final.
/// - **Release.** [`release`](Self::release) releases now and reports the result. Dropping
///   the guard stops the heartbeat and releases **in the background**: the lock stays held
///   until that spawned release reaches the backend (or, without a tokio runtime, until its
///   ttl runs out). Call `release().await` when the next owner should not wait, and
///   [`shutdown`](crate::shutdown) before the runtime ends. (A release the backend answers
///   without waiting, as `MemoryBackend` does, is done during the drop itself.)
/// - **Integrations** that own the guard inside a future of their own (a Tower service, a
///   job runner) can take it from [`acquire_driven`](crate::acquire_driven) and run its
///   keeper themselves with [`poll_keeper`](Self::poll_keeper), then hand it to a task with
///   [`spawn_keeper`](Self::spawn_keeper); [`handle`](Self::handle) gives the work a cheap
///   read-only [`LockHandle`].
/// - **Tracing.** Each guard has a `syncguard.hold` span (fields `key_hash`, `key` with
///   [`show_key`](crate::LockOptionsBuilder::show_key), `fence`, `outcome`): the heartbeat's
///   events are in it, [`run`](Self::run) runs the work in it, and `outcome` says how the hold
///   ended (`released`, `not_held`, `release_failed`, `lost`, `dropped`).
///
/// Work done while the thread is blocked cannot be stopped by any of this: the lock may
/// expire and pass to the next holder mid-write. Pass [`fence`](Self::fence) to the resource
/// you write to, so that it refuses a stale holder.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use std::time::Duration;
/// use syncguard::{LockOptions, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let options = LockOptions::builder().ttl(Duration::from_secs(10)).build()?;
/// let guard = syncguard::acquire(&backend, "invoice:7", &options).await?;
/// let fence = guard.fence(); // hand this to the resource you write to
/// guard.run(tokio::time::sleep(Duration::from_millis(10))).await?; // the work, cancelled on loss
/// assert!(guard.release().await?);
/// # let _ = fence; Ok(()) }
/// ```
#[must_use = "dropping a LockGuard releases the lock (in the background) at once"]
pub struct LockGuard {
    shared: Arc<Shared>,
    backend: Arc<dyn LockBackend>,
    keeper: Keeper,
    /// `Some` until a release reached the backend: then dropping the guard releases nothing.
    unreleased: Option<Registration>,
}

/// What keeps the lock alive (heartbeat and loss detection).
enum Keeper {
    /// A spawned task, aborted when this is dropped: it runs with nobody polling the guard.
    Task {
        _abort_on_drop: AbortOnDropHandle<()>,
    },
    /// Run by the guard's owner through [`LockGuard::poll_keeper`], inside the owner's task,
    /// so that holding a lock for a short request costs no task and no cross-thread wake-up.
    /// The future is only created once the owner has to wait.
    Driven {
        heartbeat: bool,
        // Only ever reached through `&mut` (`get_mut`, no locking): the mutex is there to
        // keep `LockGuard: Sync`, which the future (holding backend futures) is not.
        running: Option<Mutex<KeepFuture>>,
    },
    /// Released, or lost (the keeper ends once it records the loss).
    Stopped,
}

type KeepFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// When an acquire request was sent, on the monotonic and the wall clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SentAt {
    pub(crate) instant: Instant,
    pub(crate) wall_ms: u64,
}

impl SentAt {
    pub(crate) fn now() -> Self {
        Self {
            instant: Instant::now(),
            wall_ms: crate::time::now_ms(),
        }
    }
}

impl LockGuard {
    /// Wraps a fresh lease. With `driven`, the owner runs the keeper (heartbeat and loss
    /// detection) with [`poll_keeper`](Self::poll_keeper); otherwise a task is spawned for it.
    ///
    /// Must be called within a tokio runtime.
    pub(crate) fn start(backend: Arc<dyn LockBackend>, start: Start, driven: bool) -> Self {
        let heartbeat = start.heartbeat;
        let shared = Arc::new(Shared::new(start));
        let registration = Registration::new(&backend, &shared);
        let keeper = if driven {
            Keeper::Driven {
                heartbeat,
                running: None,
            }
        } else {
            let task = tokio::spawn(keeper::keeping(&shared, &backend, heartbeat));
            Keeper::Task {
                _abort_on_drop: AbortOnDropHandle::new(task),
            }
        };
        Self {
            shared,
            backend,
            keeper,
            unreleased: Some(registration),
        }
    }

    /// Runs the keeper of a guard from [`acquire_driven`](crate::acquire_driven): extends the
    /// lock when due and notices its loss. `Ready` with the reason once the lock is lost,
    /// `Pending` while it is held, with the waker of `cx` woken when the next extend is due
    /// (or an extend in flight completes).
    ///
    /// Call it from the owner's `poll` each time the owner is about to return `Pending` while
    /// holding the lock: the heartbeat only runs while somebody polls. A guard whose keeper
    /// is a task (from [`acquire`](crate::acquire), or after
    /// [`spawn_keeper`](Self::spawn_keeper)) is kept by that task: this only reports whether
    /// it is lost, and registers no waker.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use std::task::Poll;
    /// use syncguard::{LockOptions, MemoryBackend};
    ///
    /// let backend = MemoryBackend::new();
    /// let mut guard = syncguard::acquire_driven(&backend, "job:1", &LockOptions::default()).await?;
    /// // An owner's `poll` would do this before returning `Pending`:
    /// let lost = std::future::poll_fn(|cx| Poll::Ready(guard.poll_keeper(cx))).await;
    /// assert!(lost.is_pending());
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn poll_keeper(&mut self, cx: &mut Context<'_>) -> Poll<LostReason> {
        let Self {
            shared,
            backend,
            keeper,
            ..
        } = self;
        if let Keeper::Driven { heartbeat, running } = keeper {
            let keeping = running
                .get_or_insert_with(|| Mutex::new(keeper::keeping(shared, backend, *heartbeat)));
            let keeping = keeping
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if keeping.as_mut().poll(cx).is_ready() {
                *keeper = Keeper::Stopped;
            }
        }
        match self.shared.loss() {
            Some(reason) => Poll::Ready(reason),
            None => Poll::Pending,
        }
    }

    /// Hands the keeper of a guard from [`acquire_driven`](crate::acquire_driven) over to a
    /// spawned task, for when the lock must be kept while nobody polls the owner (a response
    /// body waiting for a slow client). The guard then behaves as one from
    /// [`acquire`](crate::acquire). No effect on a guard whose keeper is already a task, or
    /// whose lock is lost.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_keeper(&mut self) {
        let Keeper::Driven { heartbeat, running } = &mut self.keeper else {
            return;
        };
        let running = running.take().map(|running| {
            running
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        });
        let keeping =
            running.unwrap_or_else(|| keeper::keeping(&self.shared, &self.backend, *heartbeat));
        self.keeper = Keeper::Task {
            _abort_on_drop: AbortOnDropHandle::new(tokio::spawn(keeping)),
        };
    }

    /// The (NFC-normalized) key this guard holds.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// How errors and logs name this lock: its key hash, and its key with
    /// [`show_key`](crate::LockOptionsBuilder::show_key).
    pub fn name(&self) -> &LockName {
        &self.shared.name
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
        self.shared.belief().expires_at_ms
    }

    /// How long the lock has been held.
    pub fn held_for(&self) -> Duration {
        self.shared.acquired_at.elapsed()
    }

    /// Whether the lock can still be relied on, as of now: not lost, and not released.
    pub fn is_held(&self) -> bool {
        self.shared.is_held()
    }

    /// Whether the lock is lost, as of now: also when the lease ran out while nobody (not even
    /// the heartbeat) looked.
    pub fn is_lost(&self) -> bool {
        self.shared.loss().is_some()
    }

    /// Why the lock is lost, as of now; `None` while it is held.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.loss()
    }

    /// Completes when the lock is lost, with the reason (at once if it already is, or if the
    /// lease has run out); never completes while it is held.
    pub async fn lost(&self) -> LostReason {
        self.shared.lost().await
    }

    /// A token that is cancelled when the lock is lost, for work that already listens to a
    /// [`CancellationToken`]. It is not cancelled by a release. A token asked for after the
    /// lease ran out is already cancelled; one asked for earlier is cancelled by the keeper
    /// at the deadline (late if the keeper's thread is blocked: check
    /// [`is_lost`](Self::is_lost) after a blocking section).
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.lost_token().clone()
    }

    /// A cheap read-only handle on this lock (key, lock id, fence, expiry, loss) for code that
    /// must not own the guard: the work's tasks, a request's extensions.
    pub fn handle(&self) -> LockHandle {
        LockHandle::new(Arc::clone(&self.shared))
    }

    /// The hold's `syncguard.hold` span, to run code of the hold in it.
    pub fn span(&self) -> &tracing::Span {
        &self.shared.span
    }

    /// Extends the lock now to *now + `ttl`*, on top of (or instead of) the heartbeat. An
    /// extend of the heartbeat still in flight is waited for first, so the backend applies
    /// them in the order the guard accounts for them; the call never waits past the lease.
    /// Returns `false`, with the lock lost, if it was no longer held (or the lease ran out
    /// before the answer came).
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a bad ttl, before any
    /// I/O; backend errors as they
    /// come. The lock is not marked lost for those (the lease may still be valid), but an
    /// extend whose answer was lost may still be applied at any later time, cutting the lease
    /// to `ttl` from then: so from this call on, the guard counts every lease as at most
    /// `ttl` long, and the heartbeat extends every third of `ttl`, for the rest of the hold.
    pub async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        ttl_millis(ttl)?;
        match self.shared.extend(self.backend.as_ref(), ttl, false).await {
            Extension::Extended => Ok(true),
            Extension::Lost => Ok(false),
            Extension::Failed(error) => Err(error),
        }
    }

    /// Stops the heartbeat and releases the lock. Returns `true` if this call released it,
    /// `false` if it was no longer held (expired or taken over).
    ///
    /// # Errors
    /// Backend errors as they come; the lock then expires at the end of its ttl.
    pub async fn release(mut self) -> Result<bool, LockError> {
        self.keeper = Keeper::Stopped; // stops the heartbeat
        self.shared.end();
        let outcome = let_go::let_go(self.backend.as_ref(), &self.shared).await;
        // If this future is dropped before here, the drop releases in the background instead.
        self.unreleased = None;
        let released = self.shared.report_release(outcome)?;
        Ok(released)
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.shared.name)
            .field("lock_id", &self.shared.lock_id)
            .field("fence", &self.shared.fence)
            .field("expires_at_ms", &self.expires_at_ms())
            .field("lost", &self.lost_reason())
            .finish_non_exhaustive()
    }
}
