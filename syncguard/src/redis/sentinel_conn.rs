//! The connection of a backend made from a `redis+sentinel://` URL: to the primary the
//! Sentinels name, followed to the new one after a failover.
//!
//! It holds a plain multiplexed connection, never one that reconnects by itself: a connection
//! that reconnected to the old primary's address could write to a server the Sentinels have
//! already replaced (restarted, and still a primary until they turn it into a replica), and a
//! second holder would get a lock there. Instead, a call that finds the connection broken, or
//! the server a replica (`READONLY`), or the primary unable to write (`MASTERDOWN`), fails as it
//! would on any connection, and the next primary is asked of the Sentinels in the background;
//! calls made meanwhile fail fast until it is found. A Sentinel's announcement of a failover
//! (`sentinel_switches`) does the same at once. Only a server that says it is a primary
//! (`ROLE`, checked by redis-rs) is used.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use ::redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError};
use tokio::time::{Instant, timeout};

use crate::error::LockError;

/// The pause after a search that found no primary, doubled after each one up to
/// [`LONGEST_PAUSE`]: a failover takes the Sentinels a second or more, and a long outage should
/// not become a stream of questions to them.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// Where the primary is: asks the Sentinels, then checks that the server they name is one.
/// Shared by the backend's connection and its release subscriber.
pub(crate) struct PrimaryFinder {
    sentinels: tokio::sync::Mutex<Sentinel>,
    master_name: String,
    node: SentinelNodeConnectionInfo,
    /// Bounds one search: the Sentinels' answer and the check of the server they name.
    search_timeout: Duration,
}

impl PrimaryFinder {
    pub(crate) fn new(
        sentinels: Sentinel,
        master_name: String,
        node: SentinelNodeConnectionInfo,
        search_timeout: Duration,
    ) -> Self {
        Self {
            sentinels: tokio::sync::Mutex::new(sentinels),
            master_name,
            node,
            search_timeout,
        }
    }

    /// A client for the current primary.
    pub(crate) async fn primary(&self) -> Result<Client, LockError> {
        let search = async {
            let mut sentinels = self.sentinels.lock().await;
            sentinels
                .async_master_for(&self.master_name, Some(&self.node))
                .await
        };
        match timeout(self.search_timeout, search).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(error)) => Err(no_primary(&self.master_name, error)),
            Err(_) => Err(LockError::network_timeout(format!(
                "the Redis Sentinels did not name a reachable primary for {:?} within {:?}",
                self.master_name, self.search_timeout
            ))),
        }
    }
}

fn no_primary(master_name: &str, error: RedisError) -> LockError {
    let what = match error.kind() {
        ErrorKind::MasterNameNotFoundBySentinel => format!(
            "no Sentinel knows a reachable primary named {master_name:?} (check the name in \
             the URL against `sentinel monitor`, or the primary is down and not yet replaced)"
        ),
        ErrorKind::NoValidReplicasFoundBySentinel | ErrorKind::EmptySentinelList => {
            format!("the Redis Sentinels gave no primary for {master_name:?}")
        }
        _ => format!("could not ask the Redis Sentinels where the primary {master_name:?} is"),
    };
    LockError::service_unavailable(what).with_source(super::error::driver_error(error))
}

/// The connection to the current primary, and its replacement after a failover.
pub(crate) struct SentinelConn {
    finder: Arc<PrimaryFinder>,
    settings: AsyncConnectionConfig,
    /// A call given up after this long without an answer (the batch's own timeout drops it)
    /// counts as a failure of the connection: a primary that stopped answering (paused, cut
    /// off) keeps the connection open, and only the Sentinels know where to go instead.
    stall: Duration,
    state: Mutex<State>,
}

struct State {
    /// `None` while the primary is being looked for.
    current: Option<MultiplexedConnection>,
    /// Counts connections made: a failure on an older one asks nothing new.
    generation: u64,
    searching: bool,
}

impl SentinelConn {
    /// Connects to the primary the Sentinels name now.
    pub(crate) async fn connect(
        finder: Arc<PrimaryFinder>,
        settings: AsyncConnectionConfig,
        stall: Duration,
    ) -> Result<Arc<Self>, LockError> {
        let first = connect_to(&finder, &settings).await?;
        Ok(Arc::new(Self {
            finder,
            settings,
            stall,
            state: Mutex::new(State {
                current: Some(first),
                generation: 1,
                searching: false,
            }),
        }))
    }

    /// A Sentinel announced a new primary: leave the current one now, whatever it answers.
    pub(crate) fn primary_switched(self: &Arc<Self>) {
        let generation = self.state().generation;
        self.look_for_primary(generation);
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section is a few assignments: nothing can poison it midway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `call` on the connection to the primary. An error that says the primary may have
    /// moved, or the call given up (dropped) after [`stall`](Self::stall) without an answer,
    /// drops that connection and looks for the primary.
    pub(crate) async fn call<T, F, Fut>(self: &Arc<Self>, call: F) -> Result<T, RedisError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let (conn, generation) = self.current()?;
        let mut watch = Unanswered {
            conn: self,
            generation,
            sent: Instant::now(),
            answered: false,
        };
        let result = call(conn).await;
        watch.answered = true;
        if let Err(error) = &result
            && primary_may_have_moved(error)
        {
            self.look_for_primary(generation);
        }
        result
    }

    /// The connection to use now and its generation, or the error of a call made while the
    /// primary is being looked for.
    fn current(&self) -> Result<(MultiplexedConnection, u64), RedisError> {
        let state = self.state();
        match &state.current {
            Some(conn) => Ok((conn.clone(), state.generation)),
            None => Err(RedisError::from((
                ErrorKind::Io,
                "the Redis primary is being looked for through the Sentinels after a failure",
            ))),
        }
    }

    /// Drops the connection of `generation` (unless a newer one replaced it) and looks for the
    /// primary in the background, one search at a time.
    fn look_for_primary(self: &Arc<Self>, generation: u64) {
        {
            let mut state = self.state();
            if state.generation != generation || state.searching {
                return;
            }
            state.current = None;
            state.searching = true;
        }
        let conn = Arc::clone(self);
        tokio::spawn(async move {
            let mut pause = FIRST_PAUSE;
            loop {
                match connect_to(&conn.finder, &conn.settings).await {
                    Ok(found) => {
                        let mut state = conn.state();
                        state.current = Some(found);
                        state.generation += 1;
                        state.searching = false;
                        tracing::info!(
                            "syncguard: connected to the Redis primary the Sentinels name"
                        );
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "syncguard: no Redis primary found yet; asking the Sentinels again");
                    }
                }
                // A backend dropped meanwhile stops looking.
                if Arc::strong_count(&conn) == 1 {
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
        });
    }
}

/// A call under way: dropped unanswered after the connection's `stall`, it counts as a
/// failure of the connection (a caller that gave up sooner says nothing of it).
struct Unanswered<'a> {
    conn: &'a Arc<SentinelConn>,
    generation: u64,
    sent: Instant,
    answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered && self.sent.elapsed() >= self.conn.stall {
            self.conn.look_for_primary(self.generation);
        }
    }
}

/// A connection to the primary the Sentinels name, checked to be one.
async fn connect_to(
    finder: &PrimaryFinder,
    settings: &AsyncConnectionConfig,
) -> Result<MultiplexedConnection, LockError> {
    let client = finder.primary().await?;
    client
        .get_multiplexed_async_connection_with_config(settings)
        .await
        .map_err(super::error::map_redis_error)
}

/// Whether a call's error says that the primary may be elsewhere now: the connection broke or
/// timed out, the server is a replica now, or it cannot write.
fn primary_may_have_moved(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}
