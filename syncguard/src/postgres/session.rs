//! One statement on a pooled connection: within deadlines, never on a connection in doubt,
//! and retried once when its connection turns out to be dead.
//!
//! - A connection whose statement ended normally is kept for the next statement (`kept.rs`),
//!   instead of going back to the pool, where sqlx 0.9 would ping it: one exchange on the
//!   server per operation, not two. Otherwise connections come from the pool, which hands
//!   them out in the order callers asked and, built with
//!   [`PostgresBackend::pool_options`](super::PostgresBackend::pool_options), without a ping
//!   before use: the caller waits for one round trip per operation.
//! - An operation, from its wait for a connection to its answer (its retry included), is
//!   bounded by the operation timeout: one deadline, taken when it starts. A server that refuses
//!   connections (none on that port) is reported at once: sqlx would retry a refused
//!   connection until the timeout, so a wait that lasts while the pool opens a connection
//!   probes the server's port itself.
//! - A connection whose statement did not end normally (timeout, I/O error, server shutdown) is closed, never reused.
//! - A statement whose connection was dead (closed by a server restart, terminated by an
//!   administrator) is retried once, on a freshly opened connection. Every statement of the
//!   backend may run twice: extends and reads are idempotent, a second release finds nothing
//!   to release, a retried acquire recognizes a lock held by its own lock id, and a retried
//!   acquire with a holder re-enters what its first run took (`acquire.rs`). The one
//!   exception, an extend *by an amount*, may add it twice when the first run's answer was
//!   lost; its answer then says the true expiry (`operations.rs`).

use std::future::Future;
use std::io::ErrorKind;
use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};
use tokio::time::{Instant, sleep, timeout, timeout_at};

use super::error::map_error;
use super::kept::{Kept, Taken};
use crate::backend::BoxFuture;
use crate::error::{ErrorCode, LockError};

/// How long a wait for a pooled connection lasts before the server's port is probed.
const PROBE_AFTER: Duration = Duration::from_millis(100);

/// Which run of a statement this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Attempt {
    First,
    /// After the first run's connection was found dead: the first run may have been applied.
    Retry,
}

pub(super) struct Session {
    pool: PgPool,
    kept: Kept,
    connect_timeout: Duration,
    operation_timeout: Duration,
}

/// How long a run may take, and what to call that bound in its timeout error.
#[derive(Clone, Copy)]
pub(super) struct Budget {
    deadline: Instant,
    within: Duration,
    /// `"operation timeout"`, or `"connect timeout"` for the first connection.
    name: &'static str,
    /// The setting that sets it, for the error.
    setter: &'static str,
}

impl Budget {
    fn operation(within: Duration) -> Self {
        Self::new(
            within,
            "operation timeout",
            "PostgresConfig::with_operation_timeout",
        )
    }

    fn connect(within: Duration) -> Self {
        Self::new(
            within,
            "connect timeout",
            "PostgresConfig::with_connect_timeout",
        )
    }

    fn new(within: Duration, name: &'static str, setter: &'static str) -> Self {
        Self {
            deadline: Instant::now() + within,
            within,
            name,
            setter,
        }
    }

    fn timed_out(&self, what: &str) -> LockError {
        LockError::network_timeout(format!(
            "{what} within the {} ({:?}, `{}`)",
            self.name, self.within, self.setter
        ))
    }
}

/// Why a statement failed.
enum Failure {
    /// The connection was dead before the statement could run (or while it ran, if the
    /// server aborted it): worth one retry on a fresh connection.
    DeadConnection(sqlx::Error),
    Other(LockError),
}

impl Session {
    pub(super) fn new(pool: PgPool, config: &super::PostgresConfig) -> Self {
        Self {
            kept: Kept::new(pool.clone()),
            pool,
            connect_timeout: config.connect_timeout(),
            operation_timeout: config.operation_timeout(),
        }
    }

    pub(super) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Runs `statement` on a pooled connection, and once more on a fresh connection if that
    /// one was dead, all within the operation timeout.
    pub(super) async fn run<T, F>(&self, statement: F) -> Result<T, LockError>
    where
        F: for<'c> Fn(&'c mut PgConnection, Attempt) -> BoxFuture<'c, Result<T, sqlx::Error>>,
    {
        let budget = Budget::operation(self.operation_timeout);
        self.run_within(budget, statement).await
    }

    /// [`run`](Self::run) within the connect timeout: the first connection of a backend that
    /// opens its own pool.
    pub(super) async fn run_first<T, F>(&self, statement: F) -> Result<T, LockError>
    where
        F: for<'c> Fn(&'c mut PgConnection, Attempt) -> BoxFuture<'c, Result<T, sqlx::Error>>,
    {
        let budget = Budget::connect(self.connect_timeout);
        self.run_within(budget, statement).await
    }

    async fn run_within<T, F>(&self, budget: Budget, statement: F) -> Result<T, LockError>
    where
        F: for<'c> Fn(&'c mut PgConnection, Attempt) -> BoxFuture<'c, Result<T, sqlx::Error>>,
    {
        let mut pooled = Pooled {
            taken: Some(self.checkout(budget).await?),
            clean: true,
            kept: &self.kept,
        };
        let dead = match self
            .execute(&mut pooled, &statement, Attempt::First, budget)
            .await
        {
            Ok(value) => return Ok(value),
            Err(Failure::Other(error)) => return Err(error),
            Err(Failure::DeadConnection(error)) => error,
        };
        drop(pooled); // closed: its statement did not end normally
        tracing::debug!(error = %dead, "syncguard: PostgreSQL connection was dead; retrying once on a fresh one");
        let mut fresh = self.connect(budget).await?;
        let result = self
            .execute(&mut fresh, &statement, Attempt::Retry, budget)
            .await;
        match result {
            Ok(value) => {
                // Closed politely in the background; its answer is not waited for.
                tokio::spawn(async move { fresh.close().await });
                Ok(value)
            }
            Err(Failure::DeadConnection(error)) => Err(map_error(error, None)),
            Err(Failure::Other(error)) => Err(error),
        }
    }

    /// One run of `statement` on `conn`, within `budget`.
    async fn execute<T, F, C>(
        &self,
        conn: &mut C,
        statement: &F,
        attempt: Attempt,
        budget: Budget,
    ) -> Result<T, Failure>
    where
        F: for<'c> Fn(&'c mut PgConnection, Attempt) -> BoxFuture<'c, Result<T, sqlx::Error>>,
        C: Checkout,
    {
        let outcome = timeout_at(budget.deadline, statement(conn.start(), attempt)).await;
        match outcome {
            Ok(Ok(value)) => {
                conn.finish();
                Ok(value)
            }
            // A statement-level error (constraint, raised exception): the connection is fine.
            Ok(Err(error @ sqlx::Error::Database(_))) if !is_dead_connection(&error) => {
                conn.finish();
                Err(Failure::Other(map_error(error, Some(&self.pool))))
            }
            // Anything else leaves the connection in doubt: it is closed when dropped.
            Ok(Err(error)) => {
                if is_dead_connection(&error) {
                    Err(Failure::DeadConnection(error))
                } else {
                    Err(Failure::Other(map_error(error, Some(&self.pool))))
                }
            }
            Err(_elapsed) => Err(Failure::Other(
                budget.timed_out("PostgreSQL did not answer"),
            )),
        }
    }

    /// A kept connection, or one from the pool within `budget`; a refused connection is
    /// reported at once.
    async fn checkout(&self, budget: Budget) -> Result<Taken, LockError> {
        let _waiting = match self.kept.take() {
            Ok(kept) => return Ok(kept),
            Err(waiting) => waiting,
        };
        let acquire = timeout_at(budget.deadline, self.pool.acquire());
        let refused = async {
            sleep(PROBE_AFTER).await;
            // Only while the pool is opening a connection: a pool whose connections are all
            // busy is waited for, not probed.
            if self.pool.size() < self.pool.options().get_max_connections()
                && let Some(error) = self.refusal().await
            {
                return error;
            }
            std::future::pending().await
        };
        tokio::select! {
            acquired = acquire => match acquired {
                Ok(Ok(conn)) => Ok(Taken::from_pool(conn)),
                // The pool's own wait, a backstop as long as the budget, may end first.
                Ok(Err(sqlx::Error::PoolTimedOut)) | Err(_) => {
                    Err(match map_error(sqlx::Error::PoolTimedOut, Some(&self.pool)) {
                        busy if busy.code() == ErrorCode::RateLimited => busy,
                        _ => budget
                            .timed_out("no PostgreSQL connection (server slow or unreachable)"),
                    })
                }
                Ok(Err(error)) => Err(map_error(error, Some(&self.pool))),
            },
            error = refused => Err(error),
        }
    }

    /// A connection opened now, outside the pool, within the connect timeout and `budget`.
    async fn connect(&self, budget: Budget) -> Result<PgConnection, LockError> {
        let options = self.pool.connect_options();
        let connect_by = (Instant::now() + self.connect_timeout).min(budget.deadline);
        match timeout_at(connect_by, PgConnection::connect_with(&options)).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(error)) => Err(map_error(error, None)),
            Err(_elapsed) if connect_by == budget.deadline => {
                Err(budget.timed_out("could not connect to PostgreSQL"))
            }
            Err(_elapsed) => Err(LockError::network_timeout(format!(
                "could not connect to PostgreSQL within the connect timeout ({:?})",
                self.connect_timeout
            ))),
        }
    }

    /// `Some` error if the server's address refuses connections (nothing listens there).
    async fn refusal(&self) -> Option<LockError> {
        let options = self.pool.connect_options();
        let probe = async {
            match options.get_socket() {
                #[cfg(unix)]
                Some(dir) => {
                    let path = dir.join(format!(".s.PGSQL.{}", options.get_port()));
                    tokio::net::UnixStream::connect(&path).await.map(drop)
                }
                #[cfg(not(unix))]
                Some(_) => Ok(()),
                None => tokio::net::TcpStream::connect((options.get_host(), options.get_port()))
                    .await
                    .map(drop),
            }
        };
        match timeout(self.connect_timeout, probe).await {
            Ok(Err(error)) if refused(&error) => Some(
                LockError::service_unavailable(format!(
                    "PostgreSQL at {}:{} refused the connection: is the server running, and is this its port?",
                    options.get_host(),
                    options.get_port()
                ))
                .with_source(error),
            ),
            _ => None,
        }
    }
}

fn refused(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::NotFound
    )
}

/// Whether `error` says the connection was dead: closed under the statement, or the server
/// shutting down or terminating it (class 57P: the statement was not applied; class 08: the
/// connection failed).
fn is_dead_connection(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(io) => io.kind() != ErrorKind::TimedOut,
        sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("57P") || code.starts_with("08")),
        _ => false,
    }
}

/// A connection a statement runs on: pooled, or opened for a retry.
trait Checkout {
    /// The connection, for a statement about to run on it.
    fn start(&mut self) -> &mut PgConnection;
    /// The statement ended normally: the connection is fit for the next one.
    fn finish(&mut self);
}

/// A pooled connection that is kept for the next statement only when its last statement
/// ended normally. Dropped at any other point (the statement timed out, failed on the
/// connection, or its future was dropped from outside, by a caller's timeout or a cancelled
/// request), it is closed: what it would say next is unknown, and the pool's check of a
/// returned connection would wait for that without a deadline.
struct Pooled<'k> {
    /// `Some` until dropped.
    taken: Option<Taken>,
    clean: bool,
    kept: &'k Kept,
}

impl Checkout for Pooled<'_> {
    fn start(&mut self) -> &mut PgConnection {
        self.clean = false;
        &mut self
            .taken
            .as_mut()
            .expect("a connection until dropped")
            .conn
    }

    fn finish(&mut self) {
        self.clean = true;
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        let Some(mut taken) = self.taken.take() else {
            return;
        };
        if self.clean {
            self.kept.put(taken);
        } else {
            taken.conn.close_on_drop();
        }
    }
}

/// A connection opened for the retry is never returned anywhere: dropped, it closes.
impl Checkout for PgConnection {
    fn start(&mut self) -> &mut PgConnection {
        self
    }

    fn finish(&mut self) {}
}

/// `future`, boxed as a statement returns it.
pub(super) fn boxed<'c, T>(
    future: impl Future<Output = Result<T, sqlx::Error>> + Send + 'c,
) -> BoxFuture<'c, Result<T, sqlx::Error>> {
    Box::pin(future)
}
