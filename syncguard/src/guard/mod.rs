//! Holding a lock: the guard, its heartbeat, and loss detection.
//!
//! - `lease`: what the guard may believe about its lease (the local deadline), from what the
//!   backend can have done;
//! - `state`: what the guard, its handles and its heartbeat share, and the one extend in
//!   flight;
//! - `heartbeat`: the extends on schedule, and the loss when the lease runs out;
//! - `handle`: the read-only view of a held lock (the accessors of a guard, through `Deref`);
//! - `run`: running work under the guard;
//! - `release`: the end of a hold, every way it ends (a release awaited, one left to the
//!   background after a second, a dropped guard's);
//! - `shutdown`: the locks this process holds, released together on shutdown.

mod handle;
mod heartbeat;
mod lease;
mod release;
mod run;
pub(crate) mod shutdown;
mod state;

pub use handle::LockHandle;

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use crate::backend::LockBackend;
use crate::backend::time::ttl_millis;
use crate::error::{LockError, LostReason};
use heartbeat::Beating;
use shutdown::Registration;
pub(crate) use state::Start;
use state::{Extension, Shared};

/// A held lock. It keeps the lock alive with a heartbeat (unless turned off), tells the holder
/// when the lock is lost, and releases it.
///
/// Get one from [`acquire`](crate::acquire), or let [`with_lock`](crate::with_lock) manage it.
/// What it holds (key, [fence](LockHandle::fence), expiry) and whether it still holds it are
/// read through [`LockHandle`]'s methods, which a guard has too (it derefs to its handle).
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
///   the loss as soon as it looks: [`lost`](LockHandle::lost) (await),
///   [`is_lost`](LockHandle::is_lost) and [`lost_reason`](LockHandle::lost_reason) (poll),
///   [`lost_token`](LockHandle::lost_token) (a
///   [`CancellationToken`](tokio_util::sync::CancellationToken) that fires). A loss is final.
/// - **Release.** [`release`](Self::release) releases now and reports the result;
///   [`release_in_background`](Self::release_in_background) never fails and waits for the
///   release at most a second. Dropping the guard stops the heartbeat and releases **in the
///   background**: the lock stays held until that spawned release reaches the backend (or,
///   without a tokio runtime, until its ttl runs out). Call `release().await` when the next
///   owner should not wait, and [`shutdown`](crate::shutdown) before the runtime ends. (A
///   release the backend answers without waiting, as `MemoryBackend` does, is done during the
///   drop itself.)
/// - **Integrations** that own the guard inside a future of their own (a Tower service, a
///   job runner) can take it from
///   [`acquire_with_polled_heartbeat`](crate::acquire_with_polled_heartbeat), run its
///   heartbeat from their own `poll` with [`poll_heartbeat`](Self::poll_heartbeat), then hand
///   it to a task with [`spawn_heartbeat`](Self::spawn_heartbeat); [`handle`](LockHandle::handle)
///   gives the work a cheap read-only [`LockHandle`].
/// - **Tracing.** Each guard has a `syncguard.hold` span (fields `key_hash`, `key` with
///   [`show_key`](crate::LockOptionsBuilder::show_key), `fence`, `outcome`): the heartbeat's
///   events are in it, [`run`](Self::run) runs the work in it, and `outcome` says how the hold
///   ended (`released`, `not_held`, `release_failed`, `lost`, `dropped`).
///
/// Work done while the thread is blocked cannot be stopped by any of this: the lock may
/// expire and pass to the next holder mid-write. Pass [`fence`](LockHandle::fence) to the
/// resource you write to, so that it refuses a stale holder.
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
    /// The state shared with the handles and the heartbeat; the accessors, through `Deref`.
    handle: LockHandle,
    backend: Arc<dyn LockBackend>,
    heartbeat: Heartbeat,
    /// `Some` until a release reached the backend: then dropping the guard releases nothing.
    unreleased: Option<Registration>,
}

/// Where a guard's heartbeat runs (extends, when on, and loss detection).
enum Heartbeat {
    /// A spawned task, aborted when this is dropped: it runs with nobody polling the guard.
    Task {
        _abort_on_drop: AbortOnDropHandle<()>,
    },
    /// Run by the guard's owner through [`LockGuard::poll_heartbeat`], inside the owner's
    /// task, so that holding a lock for a short request costs no task and no cross-thread
    /// wake-up. The future is only created once the owner has to wait.
    Polled {
        extends: bool,
        // Only ever reached through `&mut` (`get_mut`, no locking): the mutex is there to
        // keep `LockGuard: Sync`, which the future (holding backend futures) is not.
        running: Option<Mutex<Beating>>,
    },
    /// Released, or lost (the heartbeat ends once it records the loss).
    Stopped,
}

/// Who runs a new guard's heartbeat.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HeartbeatBy {
    /// A task of its own.
    Task,
    /// The guard's owner, through [`LockGuard::poll_heartbeat`].
    Owner,
}

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
            wall_ms: crate::backend::time::now_ms(),
        }
    }
}

impl LockGuard {
    /// Wraps a fresh lease, its heartbeat run by `by` (`extends`: whether it extends the
    /// lock, or only notices when the lease runs out).
    ///
    /// Must be called within a tokio runtime.
    pub(crate) fn start(backend: Arc<dyn LockBackend>, start: Start, by: HeartbeatBy) -> Self {
        let extends = start.heartbeat;
        let shared = Arc::new(Shared::new(start));
        let registration = Registration::new(&backend, &shared);
        let heartbeat = match by {
            HeartbeatBy::Owner => Heartbeat::Polled {
                extends,
                running: None,
            },
            HeartbeatBy::Task => {
                let task = tokio::spawn(heartbeat::beating(&shared, &backend, extends));
                Heartbeat::Task {
                    _abort_on_drop: AbortOnDropHandle::new(task),
                }
            }
        };
        Self {
            handle: LockHandle::new(shared),
            backend,
            heartbeat,
            unreleased: Some(registration),
        }
    }

    /// What the guard shares with its handles and its heartbeat.
    fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// Runs the heartbeat of a guard from
    /// [`acquire_with_polled_heartbeat`](crate::acquire_with_polled_heartbeat) in the
    /// caller's task: extends the lock when due and notices its loss. `Ready` with the reason
    /// once the lock is lost, `Pending` while it is held, with the waker of `cx` woken when
    /// the next extend is due (or an extend in flight completes).
    ///
    /// Call it from the owner's `poll` each time the owner is about to return `Pending` while
    /// holding the lock: such a heartbeat only runs while somebody polls. A guard whose
    /// heartbeat is a task (from [`acquire`](crate::acquire), or after
    /// [`spawn_heartbeat`](Self::spawn_heartbeat)) is kept by that task: this only reports
    /// whether it is lost, and registers no waker.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use std::task::Poll;
    /// use syncguard::{LockOptions, MemoryBackend};
    ///
    /// let backend = MemoryBackend::new();
    /// let options = LockOptions::default();
    /// let mut guard = syncguard::acquire_with_polled_heartbeat(&backend, "job:1", &options).await?;
    /// // An owner's `poll` would do this before returning `Pending`:
    /// let lost = std::future::poll_fn(|cx| Poll::Ready(guard.poll_heartbeat(cx))).await;
    /// assert!(lost.is_pending());
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn poll_heartbeat(&mut self, cx: &mut Context<'_>) -> Poll<LostReason> {
        let Self {
            handle,
            backend,
            heartbeat,
            ..
        } = self;
        if let Heartbeat::Polled { extends, running } = heartbeat {
            let beating = running.get_or_insert_with(|| {
                Mutex::new(heartbeat::beating(&handle.shared, backend, *extends))
            });
            let beating = beating
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if beating.as_mut().poll(cx).is_ready() {
                *heartbeat = Heartbeat::Stopped;
            }
        }
        match self.shared().loss() {
            Some(reason) => Poll::Ready(reason),
            None => Poll::Pending,
        }
    }

    /// Hands the heartbeat of a guard from
    /// [`acquire_with_polled_heartbeat`](crate::acquire_with_polled_heartbeat) over to a
    /// spawned task, for when the lock must be kept while nobody polls the owner (a response
    /// body waiting for a slow client). The guard then behaves as one from
    /// [`acquire`](crate::acquire). No effect on a guard whose heartbeat is already a task, or
    /// whose lock is lost.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_heartbeat(&mut self) {
        let Heartbeat::Polled { extends, running } = &mut self.heartbeat else {
            return;
        };
        let running = running.take().map(|running| {
            running
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        });
        let beating = running
            .unwrap_or_else(|| heartbeat::beating(&self.handle.shared, &self.backend, *extends));
        self.heartbeat = Heartbeat::Task {
            _abort_on_drop: AbortOnDropHandle::new(tokio::spawn(beating)),
        };
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
        match self
            .shared()
            .extend(self.backend.as_ref(), ttl, false)
            .await
        {
            Extension::Extended => Ok(true),
            Extension::Lost => Ok(false),
            Extension::Failed(error) => Err(error),
        }
    }
}

/// A guard has the accessors of its [`LockHandle`]: key, name, lock id, fence, ttl, expiry,
/// and the loss.
impl Deref for LockGuard {
    type Target = LockHandle;

    fn deref(&self) -> &LockHandle {
        &self.handle
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", self.name())
            .field("lock_id", self.lock_id())
            .field("fence", &self.fence())
            .field("expires_at_ms", &self.expires_at_ms())
            .field("lost", &self.lost_reason())
            .finish_non_exhaustive()
    }
}
