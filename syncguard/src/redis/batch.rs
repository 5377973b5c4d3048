//! Batching: the acquire, release and extend calls that are waiting at the same moment run in
//! one EVALSHA of the batch script, in the order they were made.
//!
//! A task per backend (spawned on first use, again if its runtime went away) takes the queued
//! calls, builds one command and answers each caller from its slot in the reply. Up to
//! [`MAX_IN_FLIGHT`] batches are on the wire at once; calls made meanwhile queue up and form the
//! next batch, so a lone caller pays one round trip as before, and many callers share them.
//! Callers are answered a [`REPLY_GROUP`] at a time, so that the server works on the next batch
//! while the client answers the rest of the last one.
//! Redis runs a script atomically, so each call sees exactly what it would see alone, and the
//! server spends its time on the locks instead of on a script call, a `TIME` and a network read
//! per operation.

use std::sync::{Arc, Mutex};

use ::redis::Value;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::error::{error_from_reply, unexpected_reply};
use super::orphans::{Orphan, Orphans};
use super::scripts::{self, LuaScript};
use super::{Conn, ConnError, evalsha};
use crate::time::TIME_TOLERANCE_MS;
use crate::{LockError, LockId};

/// The most calls in one script call: bounds how long one batch holds the server (well under a
/// millisecond) while amortizing the call itself over many operations.
const MAX_BATCH: usize = 64;
/// The most batches awaiting their reply at once; further calls queue for the next batch
/// (more would split the callers of a multi-threaded runtime into small, costlier batches).
const MAX_IN_FLIGHT: usize = 4;
/// Callers are answered in groups of this many, with a yield between groups. On a
/// current-thread runtime, a batch's callers would otherwise all run before the batch task
/// does, so that each batch gathered every caller and the server idled while the client
/// answered them (and the client while the server worked): the batches went in lockstep.
/// Answered in groups, the first callers' next calls are sent while the others are answered.
const REPLY_GROUP: usize = 16;

/// One call, with the keys and arguments the batch script takes for it.
#[derive(Clone)]
pub(crate) enum Op {
    Acquire {
        lock_key: String,
        index_key: String,
        fence_key: String,
        lock_id: LockId,
        ttl_ms: u64,
        key: String,
    },
    /// `lock_key` when the caller knows it (it took the lock): the index is not read.
    Release {
        lock_key: Option<String>,
        index_key: String,
        lock_id: LockId,
    },
    Extend {
        lock_key: Option<String>,
        index_key: String,
        lock_id: LockId,
        ttl_ms: u64,
    },
}

impl Op {
    fn keys(&self) -> usize {
        match self {
            Op::Acquire { .. } => 3,
            Op::Release { lock_key, .. } | Op::Extend { lock_key, .. } => {
                1 + usize::from(lock_key.is_some())
            }
        }
    }

    fn args(&self) -> usize {
        match self {
            Op::Acquire { .. } => 5,
            Op::Release { .. } => 2,
            Op::Extend { .. } => 4,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Op::Acquire {
                lock_key,
                index_key,
                fence_key,
                key,
                ..
            } => lock_key.len() + index_key.len() + fence_key.len() + key.len() + 64,
            Op::Release {
                lock_key,
                index_key,
                ..
            } => lock_key.as_ref().map_or(0, String::len) + index_key.len() + 24,
            Op::Extend {
                lock_key,
                index_key,
                ..
            } => lock_key.as_ref().map_or(0, String::len) + index_key.len() + 64,
        }
    }
}

/// What an operation got back: its slot of the batch reply, and the server time of the batch
/// (an acquire or extend that succeeded expires at `now_ms + ttl`).
pub(crate) struct Reply {
    pub(crate) value: Value,
    pub(crate) now_ms: u64,
}

pub(super) struct Call {
    pub(super) op: Op,
    pub(super) reply: oneshot::Sender<Result<Reply, LockError>>,
}

/// The queue in front of the batch task of one backend.
pub(crate) struct Batcher {
    conn: Conn,
    index_prefix: Arc<str>,
    queue: Mutex<Option<mpsc::UnboundedSender<Call>>>,
    orphans: Arc<Orphans>,
}

impl Batcher {
    pub(crate) fn new(conn: Conn, index_prefix: &str) -> Self {
        Self {
            conn,
            index_prefix: index_prefix.into(),
            queue: Mutex::new(None),
            orphans: Arc::default(),
        }
    }

    /// Runs `op` in the next batch and returns its reply.
    pub(crate) async fn run(&self, op: Op) -> Result<Reply, LockError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Call { op, reply });
        answer.await.unwrap_or_else(|_| {
            Err(LockError::service_unavailable(
                "the syncguard Redis batch task stopped before answering (its tokio runtime \
                 shut down); use the backend from a running runtime",
            ))
        })
    }

    fn submit(&self, call: Call) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let call = match queue.as_ref() {
            Some(sender) => match sender.send(call) {
                Ok(()) => return,
                // The task ended with the runtime it ran on: start another on the current one.
                Err(mpsc::error::SendError(call)) => call,
            },
            None => call,
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(drive(
            self.conn.clone(),
            Arc::clone(&self.index_prefix),
            Arc::clone(&self.orphans),
            receiver,
        ));
        // The receiver is alive: it was just handed to the task.
        let _ = sender.send(call);
        *queue = Some(sender);
    }
}

/// The batch task: ends when the backend (the only sender) is dropped.
async fn drive(
    conn: Conn,
    index_prefix: Arc<str>,
    orphans: Arc<Orphans>,
    mut queue: mpsc::UnboundedReceiver<Call>,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    while let Some(first) = queue.recv().await {
        // Wait for a free slot first: calls made meanwhile join this batch.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut calls = Vec::with_capacity(queue.len().min(MAX_BATCH - 1) + 1);
        calls.push(first);
        while calls.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(call) => calls.push(call),
                Err(_) => break,
            }
        }
        let conn = conn.clone();
        let index_prefix = Arc::clone(&index_prefix);
        let orphans = Arc::clone(&orphans);
        tokio::spawn(async move {
            execute(&conn, &index_prefix, &orphans, calls).await;
            drop(slot);
        });
    }
}

/// Sends one batch and answers its callers. A lock nobody holds is handed to `orphans`
/// instead of staying held for its ttl: one taken for a caller that is gone (its future was
/// dropped while waiting), and one whose acquire failed in a way that leaves open whether
/// Redis applied it (a timeout, a broken connection: a request held up in the network runs
/// when it arrives, after its caller gave up).
async fn execute(conn: &Conn, index_prefix: &Arc<str>, orphans: &Arc<Orphans>, calls: Vec<Call>) {
    let sent = Instant::now();
    let mut found = Vec::new();
    match send(conn, index_prefix, &calls).await {
        Ok(replies) => {
            for (i, (call, reply)) in calls.into_iter().zip(replies).enumerate() {
                if i > 0 && i % REPLY_GROUP == 0 {
                    // Let the callers answered so far run: the calls they make next go out as
                    // a batch while the rest are still being answered.
                    tokio::task::yield_now().await;
                }
                if let Err(Ok(reply)) = call.reply.send(reply)
                    && matches!(reply.value, Value::BulkString(_))
                {
                    found.extend(Orphan::taken(call.op, sent));
                }
            }
        }
        Err(failure) => {
            let in_doubt = failure.may_have_been_applied();
            for call in calls {
                let _ = call.reply.send(Err(failure.to_lock_error()));
                if in_doubt {
                    found.extend(Orphan::in_doubt(call.op, sent));
                }
            }
        }
    }
    if !found.is_empty() {
        orphans.add(found, conn, index_prefix);
    }
}

/// Why a whole batch failed; each of its callers gets the mapped error.
pub(super) enum Failure {
    Conn(ConnError),
    Reply(Value),
}

impl Failure {
    /// Whether the batch may have run: a pooled connection that could not be had sent
    /// nothing.
    fn may_have_been_applied(&self) -> bool {
        !matches!(self, Failure::Conn(ConnError::Pool(_)))
    }

    pub(super) fn to_lock_error(&self) -> LockError {
        match self {
            Failure::Conn(error) => error.to_lock_error(),
            Failure::Reply(reply) => unexpected_reply("batch", reply),
        }
    }
}

pub(super) async fn send(
    conn: &Conn,
    index_prefix: &str,
    calls: &[Call],
) -> Result<Vec<Result<Reply, LockError>>, Failure> {
    let lua: &LuaScript = &scripts::BATCH;
    let keys = calls.iter().map(|c| c.op.keys()).sum();
    let args = calls.iter().map(|c| c.op.args()).sum::<usize>() + 2;
    let bytes = calls.iter().map(|c| c.op.bytes()).sum::<usize>() + index_prefix.len();
    let mut cmd = evalsha(lua, keys, args, bytes);
    for call in calls {
        match &call.op {
            Op::Acquire {
                lock_key,
                index_key,
                fence_key,
                ..
            } => {
                cmd.arg(lock_key.as_str())
                    .arg(index_key.as_str())
                    .arg(fence_key.as_str());
            }
            Op::Release {
                lock_key,
                index_key,
                ..
            }
            | Op::Extend {
                lock_key,
                index_key,
                ..
            } => {
                if let Some(lock_key) = lock_key {
                    cmd.arg(lock_key.as_str());
                }
                cmd.arg(index_key.as_str());
            }
        }
    }
    cmd.arg(TIME_TOLERANCE_MS).arg(index_prefix);
    for call in calls {
        match &call.op {
            Op::Acquire {
                lock_id,
                ttl_ms,
                key,
                ..
            } => {
                cmd.arg("A")
                    .arg(lock_id.as_str())
                    .arg(*ttl_ms)
                    .arg(ttl_ms + TIME_TOLERANCE_MS)
                    .arg(key.as_str());
            }
            Op::Release {
                lock_key, lock_id, ..
            } => {
                cmd.arg(if lock_key.is_some() { "r" } else { "R" })
                    .arg(lock_id.as_str());
            }
            Op::Extend {
                lock_key,
                lock_id,
                ttl_ms,
                ..
            } => {
                cmd.arg(if lock_key.is_some() { "e" } else { "E" })
                    .arg(lock_id.as_str())
                    .arg(*ttl_ms)
                    .arg(ttl_ms + TIME_TOLERANCE_MS);
            }
        }
    }
    let reply = conn.eval(lua, &cmd).await.map_err(Failure::Conn)?;
    let Value::Array(mut replies) = reply else {
        return Err(Failure::Reply(reply));
    };
    let now_ms = match replies.first() {
        Some(Value::Int(now)) if replies.len() == calls.len() + 1 => u64::try_from(*now).ok(),
        _ => None,
    };
    let Some(now_ms) = now_ms else {
        return Err(Failure::Reply(Value::Array(replies)));
    };
    replies.remove(0);
    Ok(replies
        .into_iter()
        .map(|value| error_from_reply(value).map(|value| Reply { value, now_ms }))
        .collect())
}
