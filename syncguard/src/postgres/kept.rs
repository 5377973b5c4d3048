//! Connections a backend keeps out of its pool between statements.
//!
//! sqlx 0.9 pings every connection returned to its pool, unconditionally: one more exchange on
//! the server per statement, after the caller has its answer, which at many callers costs as
//! much server time as the statements themselves. The ping is there for connections whose
//! statement was cut short; `session.rs` already closes those and knows which connections
//! ended their statement normally, so such a connection is kept here for the next statement
//! instead of going back through the ping.
//!
//! Only while no caller of this backend waits for a connection: when callers outnumber the
//! connections, every connection goes back to the pool, whose queue serves callers in the
//! order they came. Kept connections also go back to the pool when they have idled for
//! [`IDLE_RETURN`] (so that a pool shared with the application is not held by a past burst of
//! locking), when they have been out of it for [`OUT_AT_MOST`] (so that a query of the
//! application waits for one at most that long, and the pool's lifetime and idle rules apply
//! to every connection), and once the pool is closed (its `close` waits for them).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::time::{Instant, sleep};

/// How long a kept connection may idle before it goes back to the pool.
const IDLE_RETURN: Duration = Duration::from_secs(1);

/// How long a connection may stay out of the pool, however busy: it then goes back to the
/// pool (a ping there), which a waiting application query gets first.
const OUT_AT_MOST: Duration = Duration::from_millis(250);

/// How often idle connections are looked at while any is kept.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// A connection taken for a statement: from the kept ones, or out of the pool.
pub(super) struct Taken {
    pub(super) conn: PoolConnection<Postgres>,
    /// When it left the pool.
    out_since: Instant,
}

impl Taken {
    pub(super) fn from_pool(conn: PoolConnection<Postgres>) -> Self {
        Self {
            conn,
            out_since: Instant::now(),
        }
    }
}

/// The connections of one backend kept between statements (shared by its clones).
#[derive(Clone)]
pub(super) struct Kept {
    shared: Arc<Shared>,
}

struct Shared {
    pool: PgPool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The most recently used last.
    idle: Vec<Idle>,
    /// Whether a task is giving back idle connections.
    sweeping: bool,
    /// Callers of this backend waiting for a connection from the pool.
    waiting: usize,
}

struct Idle {
    taken: Taken,
    since: Instant,
}

impl Kept {
    pub(super) fn new(pool: PgPool) -> Self {
        Self {
            shared: Arc::new(Shared {
                pool,
                state: Mutex::default(),
            }),
        }
    }

    /// The connection used last, if one is kept (the busiest few stay in use, and the rest
    /// idle out); else the caller is counted as waiting for one from the pool until the
    /// returned guard is dropped, and meanwhile connections go back to the pool.
    pub(super) fn take(&self) -> Result<Taken, Waiting> {
        let mut state = self.shared.state();
        // Given back once the pool is closed, for its close to finish.
        let stale = if self.shared.pool.is_closed() {
            std::mem::take(&mut state.idle)
        } else {
            Vec::new()
        };
        let taken = match state.idle.pop() {
            Some(idle) => Ok(idle.taken),
            None => {
                state.waiting += 1;
                Err(Waiting {
                    shared: Arc::clone(&self.shared),
                })
            }
        };
        drop(state);
        // Dropped outside the lock: back to the pool.
        drop(stale);
        taken
    }

    /// Keeps `taken`, whose statement ended normally, for the next statement; or gives it back
    /// to the pool when a caller waits for one there, it has been out long enough, the pool
    /// is closed, or nothing could give it back later (no runtime to run the sweep on).
    pub(super) fn put(&self, taken: Taken) {
        if taken.out_since.elapsed() >= OUT_AT_MOST || self.shared.pool.is_closed() {
            return;
        }
        let mut state = self.shared.state();
        // Checked under the lock that counts waiters: none is missed.
        if state.waiting > 0 {
            drop(state);
            drop(taken);
            return;
        }
        if !state.sweeping {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            state.sweeping = true;
            runtime.spawn(sweep(Arc::clone(&self.shared)));
        }
        state.idle.push(Idle {
            taken,
            since: Instant::now(),
        });
    }
}

/// A caller waiting for a connection from the pool (see [`Kept::take`]).
pub(super) struct Waiting {
    shared: Arc<Shared>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.shared.state().waiting -= 1;
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section is a push, a pop or a retain: nothing can poison it midway.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Gives back the connections that idled too long (all of them once the pool is closed),
/// until none is kept.
async fn sweep(shared: Arc<Shared>) {
    loop {
        sleep(SWEEP_EVERY).await;
        let closed = shared.pool.is_closed();
        let (given_back, done) = {
            let mut state = shared.state();
            let (stale, kept): (Vec<Idle>, Vec<Idle>) = std::mem::take(&mut state.idle)
                .into_iter()
                .partition(|idle| closed || idle.since.elapsed() >= IDLE_RETURN);
            state.idle = kept;
            let done = state.idle.is_empty();
            if done {
                state.sweeping = false;
            }
            (stale, done)
        };
        // Dropped outside the lock: each goes back to the pool (which pings it there).
        drop(given_back);
        if done {
            return;
        }
    }
}
