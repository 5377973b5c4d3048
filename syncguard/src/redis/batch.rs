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

use super::batch_call::{Call, send};
pub(crate) use super::batch_call::{Header, Op, Reply};
use super::connection::Conn;
use super::orphans::{Orphan, Orphans};
use crate::LockError;

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

/// The queue in front of the batch task of one backend.
pub(crate) struct Batcher {
    conn: Conn,
    header: Arc<Header>,
    queue: Mutex<Option<mpsc::UnboundedSender<Call>>>,
    orphans: Arc<Orphans>,
}

impl Batcher {
    pub(crate) fn new(conn: Conn, header: Header) -> Self {
        Self {
            conn,
            header: Arc::new(header),
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
            Arc::clone(&self.header),
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
    header: Arc<Header>,
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
        let header = Arc::clone(&header);
        let orphans = Arc::clone(&orphans);
        tokio::spawn(async move {
            execute(&conn, &header, &orphans, calls).await;
            drop(slot);
        });
    }
}

/// Sends one batch and answers its callers. A lock nobody holds is handed to `orphans`
/// instead of staying held for its ttl: one taken for a caller that is gone (its future was
/// dropped while waiting), and one whose acquire failed in a way that leaves open whether
/// Redis applied it (a timeout, a broken connection: a request held up in the network runs
/// when it arrives, after its caller gave up).
async fn execute(conn: &Conn, header: &Arc<Header>, orphans: &Arc<Orphans>, calls: Vec<Call>) {
    let sent = Instant::now();
    let mut found = Vec::new();
    match send(conn, header, &calls).await {
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
        orphans.add(found, conn, header);
    }
}
