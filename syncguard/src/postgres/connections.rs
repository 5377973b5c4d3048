//! Connections kept between operations.
//!
//! sqlx pings every connection it takes back into a pool (one more round trip per
//! operation). The backend instead keeps connections it has used checked out, in a small
//! cache, and hands them straight to the next operation; a connection idle for
//! [`IDLE_RETURN`] goes back to the pool. Only connections whose last query succeeded are
//! cached; any other goes back through the pool, whose ping weeds out broken ones.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::time::Instant;

/// How long a cached connection may sit unused before it is returned to the pool.
pub(super) const IDLE_RETURN: Duration = Duration::from_secs(5);

pub(super) struct Connections {
    pool: PgPool,
    idle: Mutex<Vec<(PoolConnection<Postgres>, Instant)>>,
    /// Whether the task returning idle connections runs.
    janitor: std::sync::Once,
}

impl Connections {
    pub(super) fn new(pool: PgPool) -> Arc<Self> {
        Arc::new(Self {
            pool,
            idle: Mutex::new(Vec::new()),
            janitor: std::sync::Once::new(),
        })
    }

    pub(super) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A connection: the most recently used cached one, or one from the pool.
    pub(super) async fn get(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        if let Some((conn, _)) = self.lock().pop() {
            return Ok(conn);
        }
        self.pool.acquire().await
    }

    /// Caches a connection whose last query succeeded, for the next operation.
    pub(super) fn put(self: &Arc<Self>, conn: PoolConnection<Postgres>) {
        let cap = self.pool.options().get_max_connections() as usize;
        let mut idle = self.lock();
        if idle.len() < cap {
            idle.push((conn, Instant::now()));
        }
        drop(idle);
        self.janitor.call_once(|| {
            let weak = Arc::downgrade(self);
            tokio::spawn(return_idle(weak));
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(PoolConnection<Postgres>, Instant)>> {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Returns connections idle for [`IDLE_RETURN`] to the pool; ends with the backend.
async fn return_idle(connections: Weak<Connections>) {
    loop {
        tokio::time::sleep(IDLE_RETURN / 2).await;
        let Some(connections) = connections.upgrade() else {
            return;
        };
        let stale: Vec<_> = {
            let mut idle = connections.lock();
            let Some(cutoff) = Instant::now().checked_sub(IDLE_RETURN) else {
                continue;
            };
            let (stale, fresh) = idle.drain(..).partition(|(_, used)| *used < cutoff);
            *idle = fresh;
            stale
        };
        // Dropping a PoolConnection returns it to the pool.
        drop(stale);
    }
}
