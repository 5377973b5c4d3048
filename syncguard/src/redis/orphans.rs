//! Locks that may be stored with nobody holding them, released by one task per backend.
//!
//! Two kinds reach here from the batches: a lock taken for a caller that is gone (its
//! future was dropped while waiting: Redis applied the acquire, one release settles it), and
//! a lock whose acquire failed in doubt (a timeout, a broken connection: the request may
//! still arrive and run). A lone caller's acquire whose future is dropped while on the wire
//! is in doubt too. A release of the second kind can itself arrive first, on another
//! connection of a pool or after a reconnect, and find nothing: it is sent again a few times
//! before the backend gives up on it.
//!
//! Each release names the attempt's own lock id, which nobody else ever holds, so releasing
//! is safe whatever happened. The set is bounded, and nothing is kept past the lock's ttl
//! (plus the tolerance), when it would be gone anyway.
//!
//! An acquire as a holder (`acquire_as`) is released here only while its lock is unclaimed:
//! a re-entry hands the lock id to another call of the same holder, and an extend uses it,
//! after which the lock is theirs. (A lost re-entry leaves no lock under the attempt's own id:
//! the lock it re-entered keeps its id, and was its holder's before the call.)

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ::redis::Value;
use tokio::time::{Instant, sleep};

use super::batch_call::{Header, Op};
use super::batch_send::{send_within, split_into_calls};
use super::connection::Conn;
use super::keys::Located;
use crate::backend::time::TIME_TOLERANCE_MS;

/// The most locks kept for release; past it the oldest are given up (each stays until its
/// ttl), so that an outage with callers retrying cannot grow memory without bound.
const MAX_KEPT: usize = 10_000;
/// The most releases in one script call.
const MAX_BATCH: usize = 64;
/// How many more times a release of an acquire in doubt is sent after it found nothing, and
/// how long apart.
const RESENDS: u32 = 3;
const RESEND_AFTER: Duration = Duration::from_secs(1);
/// The first and the longest pause between tries while the connection fails.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// A lock that may be stored with nobody holding it.
pub(super) struct Orphan {
    release: Op,
    /// When it is gone anyway (its ttl and the tolerance have passed).
    until: Instant,
    /// Further sends after one that found nothing.
    resends: u32,
    /// Not sent before this.
    not_before: Instant,
}

impl Orphan {
    /// The release of `op`, an acquire sent at `sent` that Redis applied for a caller that
    /// is gone; `None` for any other operation.
    pub(super) fn taken(op: &Op, sent: Instant) -> Option<Self> {
        Self::of(op, sent, 0)
    }

    /// The release of `op`, an acquire sent at `sent` that failed in doubt.
    pub(super) fn in_doubt(op: &Op, sent: Instant) -> Option<Self> {
        Self::of(op, sent, RESENDS)
    }

    fn of(op: &Op, sent: Instant, resends: u32) -> Option<Self> {
        let Op::Acquire {
            lock_key,
            index_key,
            lock_id,
            ttl_ms,
            holder,
            ..
        } = op
        else {
            return None;
        };
        // The lock key as the acquire named it: the lock it took is there (or nowhere).
        let at = Located {
            lock_key: Some(lock_key.clone()),
            index_key: index_key.clone(),
        };
        let lock_id = lock_id.clone();
        let release = match holder {
            // Nobody waits on a lock nobody holds here; the reply's key would go unused.
            None => Op::Release {
                at,
                lock_id,
                wake_here: false,
            },
            Some(_) => Op::ReleaseUnclaimed { at, lock_id },
        };
        Some(Self {
            release,
            until: sent + Duration::from_millis(ttl_ms.saturating_add(TIME_TOLERANCE_MS)),
            resends,
            not_before: sent,
        })
    }
}

/// The locks of one backend waiting for their release, and whether a task drains them.
pub(crate) struct Orphans {
    state: Mutex<State>,
    /// Each release call is given up after it (and sent again later), so that a connection
    /// that never answers cannot hold up the releases for good.
    operation_timeout: Duration,
}

#[derive(Default)]
struct State {
    pending: Vec<Orphan>,
    draining: bool,
}

impl Orphans {
    pub(super) fn new(operation_timeout: Duration) -> Self {
        Self {
            state: Mutex::default(),
            operation_timeout,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `found` for release, starting the task that releases them if it is not running.
    pub(super) fn add(self: &Arc<Self>, found: Vec<Orphan>, conn: &Conn, header: &Arc<Header>) {
        let mut state = self.state();
        state.pending.extend(found);
        let excess = state.pending.len().saturating_sub(MAX_KEPT);
        if excess > 0 {
            state.pending.drain(..excess);
            tracing::warn!(
                given_up = excess,
                "syncguard: too many Redis locks waiting for release while the server fails; the oldest stay held until their ttl"
            );
        }
        if state.draining {
            return;
        }
        // Outside a runtime (a lone caller's future dropped after its runtime ended) nothing
        // can be sent: the locks stay until their ttl.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                state.draining = true;
                runtime.spawn(drain(Arc::clone(self), conn.clone(), Arc::clone(header)));
            }
            Err(_) => tracing::debug!(
                "syncguard: Redis locks nobody holds cannot be released outside a tokio runtime; they stay until their ttl"
            ),
        }
    }
}

/// Releases the pending locks, a batch at a time, until none is left.
async fn drain(orphans: Arc<Orphans>, conn: Conn, header: Arc<Header>) {
    let mut pause = RETRY_FIRST;
    loop {
        let now = Instant::now();
        let (due, next_due) = {
            let mut state = orphans.state();
            state.pending.retain(|orphan| orphan.until > now);
            if state.pending.is_empty() {
                state.draining = false;
                return;
            }
            let mut due = Vec::new();
            let mut waiting = Vec::new();
            for orphan in state.pending.drain(..) {
                if orphan.not_before <= now && due.len() < MAX_BATCH {
                    due.push(orphan);
                } else {
                    waiting.push(orphan);
                }
            }
            let next_due = waiting.iter().map(|orphan| orphan.not_before).min();
            state.pending = waiting;
            (due, next_due)
        };
        if due.is_empty() {
            sleep(next_due.map_or(RETRY_FIRST, |at| at - now)).await;
            continue;
        }
        // One call on one server; on a cluster, one per node.
        for due in split_into_calls(&header, due, |orphan| &orphan.release) {
            pause = release_due(&orphans, &conn, &header, due, pause).await;
        }
    }
}

/// Sends the releases of `due` in one call; those to send again go back to the pending set.
/// Returns the pause before the next try after a failure (doubled by a failure, reset by a
/// reply).
async fn release_due(
    orphans: &Orphans,
    conn: &Conn,
    header: &Header,
    due: Vec<Orphan>,
    pause: Duration,
) -> Duration {
    let releases: Vec<Op> = due.iter().map(|orphan| orphan.release.clone()).collect();
    // A release that timed out may still land: sent again, it finds nothing (the lock id
    // is the attempt's own), and a holder's stays a release of an unclaimed lock only.
    match send_within(conn, header, &releases, orphans.operation_timeout).await {
        Ok(replies) => {
            let again = due
                .into_iter()
                .zip(replies)
                .filter_map(|(mut orphan, reply)| {
                    // 1, or the key when released without a publish (nobody waited).
                    let released = matches!(
                        reply,
                        Ok(ref reply) if matches!(reply.value, Value::Int(1) | Value::BulkString(_))
                    );
                    if released || orphan.resends == 0 {
                        return None;
                    }
                    orphan.resends -= 1;
                    orphan.not_before = Instant::now() + RESEND_AFTER;
                    Some(orphan)
                });
            orphans.state().pending.extend(again);
            RETRY_FIRST
        }
        Err(failure) => {
            tracing::debug!(error = %failure.to_lock_error(), "syncguard: releasing Redis locks nobody holds failed; trying again");
            orphans.state().pending.extend(due);
            sleep(pause).await;
            (pause * 2).min(RETRY_MAX)
        }
    }
}
