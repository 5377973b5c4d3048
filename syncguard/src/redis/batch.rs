//! Batching: the acquire, release and extend calls that are waiting at the same moment run in
//! one call of the batch script, in the order they were made (on a cluster, one call per node
//! that serves their locks, see `node_call`).
//!
//! A task per backend (spawned on first use, again if its runtime went away) takes the queued
//! calls, builds one command and answers each caller from its slot in the reply. Up to
//! [`MAX_IN_FLIGHT`] script calls are on the wire at once; calls made meanwhile queue up and
//! form the next batch, so that many callers share round trips. A lone caller (no other call
//! under way) skips the queue and sends its call itself: it pays one round trip and no
//! hand-offs between tasks.
//! Callers are answered a [`REPLY_GROUP`] at a time, so that the server works on the next batch
//! while the client answers the rest of the last one.
//! Redis runs a script atomically, so each call sees exactly what it would see alone, and the
//! server spends its time on the locks instead of on a script call, a `TIME` and a network read
//! per operation.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

pub(crate) use super::batch_call::{Header, NewExpiry, Op, Reply};
use super::batch_call::{answer, outcomes};
use super::batch_send::{send, send_within, split_into_calls};
use super::connection::Conn;
use super::orphans::{Orphan, Orphans};
use super::within;
use crate::error::LockError;

/// The most calls in one script call: bounds how long one batch holds the server (well under a
/// millisecond) while amortizing the call itself over many operations.
const MAX_BATCH: usize = 64;
/// The most script calls awaiting their reply at once; further calls queue for the next batch.
/// Two keep the server busy while the client answers the last batch; more split the callers
/// of a multi-threaded runtime into small, costlier batches (with four, 16 workers made
/// batches of 2.8 operations and about 8 % fewer cycles than with two; see BENCHMARKS.md).
const MAX_IN_FLIGHT: usize = 2;
/// Callers are answered in groups of this many, with a yield between groups. On a
/// current-thread runtime, a batch's callers would otherwise all run before the batch task
/// does, so that each batch gathered every caller and the server idled while the client
/// answered them (and the client while the server worked): the batches went in lockstep.
/// Answered in groups, the first callers' next calls are sent while the others are answered.
/// Groups of 4 (rather than 16) let that happen with 16 callers too: 16 workers made about
/// 50,000 cycles/s instead of 37,000 on a 2-thread runtime, and 65,000 instead of 44,000 on
/// a current-thread one (see BENCHMARKS.md).
const REPLY_GROUP: usize = 4;

/// A queued call: the operation, and where its caller waits for the reply.
struct Call {
    op: Op,
    reply: oneshot::Sender<Result<Reply, LockError>>,
}

/// The queue in front of the batch task of one backend.
pub(crate) struct Batcher {
    conn: Conn,
    header: Arc<Header>,
    queue: Mutex<Option<mpsc::UnboundedSender<Call>>>,
    orphans: Arc<Orphans>,
    /// A permit per script call on the wire: batches, and lone callers' own calls.
    on_the_wire: Arc<Semaphore>,
    /// Callers between the start and the end of [`run`](Self::run).
    callers: AtomicUsize,
    /// Every call ends within it.
    operation_timeout: Duration,
}

impl Batcher {
    pub(crate) fn new(conn: Conn, header: Header, operation_timeout: Duration) -> Self {
        Self {
            conn,
            header: Arc::new(header),
            queue: Mutex::new(None),
            orphans: Arc::new(Orphans::new(operation_timeout)),
            on_the_wire: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            callers: AtomicUsize::new(0),
            operation_timeout,
        }
    }

    /// What every batch call of this backend passes, and how it reaches the server.
    pub(crate) fn header(&self) -> &Header {
        &self.header
    }

    /// Runs `op`, in a script call of its own when its caller is the only one, else in the
    /// next batch, and returns its reply, within the operation timeout. A call cut short by
    /// it is dropped, which lets go of an acquire it may have made (see [`Sending`] and
    /// [`Waiting`]).
    pub(crate) async fn run(&self, op: Op) -> Result<Reply, LockError> {
        within(self.operation_timeout, "answer", self.run_unbounded(op)).await
    }

    async fn run_unbounded(&self, op: Op) -> Result<Reply, LockError> {
        let caller = Caller::enter(&self.callers);
        // Alone only when no other call is under way: callers that come while others wait
        // for their answers batch, however briefly the wire is empty between two batches.
        if caller.alone
            && self.on_the_wire.available_permits() == MAX_IN_FLIGHT
            && let Ok(permit) = Arc::clone(&self.on_the_wire).try_acquire_owned()
        {
            // Boxed: the send is large (the connection's and the script's futures), and
            // inline it would be moved with every caller's future, queued or not.
            return Box::pin(self.run_alone(op, permit)).await;
        }
        let (reply, answer) = oneshot::channel();
        let mut waiting = Waiting {
            orphan: Orphan::taken(&op, Instant::now()),
            answer,
            batcher: self,
        };
        self.submit(Call { op, reply });
        let answered = (&mut waiting.answer).await;
        waiting.orphan = None;
        answered.unwrap_or_else(|_| {
            Err(LockError::service_unavailable(
                "the syncguard Redis batch task stopped before answering (its tokio runtime \
                 shut down); use the backend from a running runtime",
            ))
        })
    }

    /// Sends `op` in a script call of its own, from the caller's task.
    async fn run_alone(&self, op: Op, _permit: OwnedSemaphorePermit) -> Result<Reply, LockError> {
        let mut sending = Sending {
            orphan: Orphan::in_doubt(&op, Instant::now()),
            batcher: self,
        };
        let sent = send(&self.conn, &self.header, std::slice::from_ref(&op)).await;
        let orphan = sending.orphan.take();
        let outcome = outcomes(sent, 1)
            .pop()
            .expect("send checks that there is a reply per operation");
        let (answer, in_doubt) = answer(outcome);
        if in_doubt && let Some(orphan) = orphan {
            self.let_go(orphan);
        }
        answer
    }

    /// Releases, in the background, a lock that may be stored with nobody holding it.
    fn let_go(&self, orphan: Orphan) {
        self.orphans.add(vec![orphan], &self.conn, &self.header);
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
            Arc::clone(&self.on_the_wire),
            self.operation_timeout,
            receiver,
        ));
        // The receiver is alive: it was just handed to the task.
        let _ = sender.send(call);
        *queue = Some(sender);
    }
}

/// A caller of [`Batcher::run`], counted until it has its answer (or stops waiting).
struct Caller<'b> {
    callers: &'b AtomicUsize,
    /// Whether no other caller was under way when this one came.
    alone: bool,
}

impl<'b> Caller<'b> {
    fn enter(callers: &'b AtomicUsize) -> Self {
        let before = callers.fetch_add(1, Ordering::AcqRel);
        Self {
            callers,
            alone: before == 0,
        }
    }
}

impl Drop for Caller<'_> {
    fn drop(&mut self) {
        self.callers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A queued caller's wait for its answer. A caller that stops waiting (its future dropped)
/// may leave a lock taken with nobody to release it: if the batch task had answered already,
/// the lock is released here; if not, the batch task finds nobody to answer and releases it.
struct Waiting<'b> {
    /// The release of the lock, for an acquire not yet answered.
    orphan: Option<Orphan>,
    answer: oneshot::Receiver<Result<Reply, LockError>>,
    batcher: &'b Batcher,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(orphan) = self.orphan.take() else {
            return;
        };
        // Closed first: from now on either the answer is here, or the batch task sees nobody.
        self.answer.close();
        if let Ok(Ok(reply)) = self.answer.try_recv()
            && matches!(reply.value, Value::BulkString(_))
        {
            self.batcher.let_go(orphan);
        }
    }
}

/// A lone caller's call on the wire. A caller that stops waiting (its future dropped) may
/// leave an acquire that Redis applies with nobody to release it: dropped before the reply,
/// the acquire is released as one in doubt.
struct Sending<'b> {
    /// The release of the lock, for an acquire not yet answered.
    orphan: Option<Orphan>,
    batcher: &'b Batcher,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if let Some(orphan) = self.orphan.take() {
            self.batcher.let_go(orphan);
        }
    }
}

/// The batch task: ends when the backend (the only sender) is dropped.
async fn drive(
    conn: Conn,
    header: Arc<Header>,
    orphans: Arc<Orphans>,
    on_the_wire: Arc<Semaphore>,
    operation_timeout: Duration,
    mut queue: mpsc::UnboundedReceiver<Call>,
) {
    while let Some(first) = queue.recv().await {
        // Wait for a free slot first: calls made meanwhile join this batch.
        let Ok(slot) = Arc::clone(&on_the_wire).acquire_owned().await else {
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
        // One script call on one server; on a cluster, one per node, all on the wire at once
        // under the batch's slot.
        let slot = Arc::new(slot);
        for calls in split_into_calls(&header, calls, |call| &call.op) {
            let conn = conn.clone();
            let header = Arc::clone(&header);
            let orphans = Arc::clone(&orphans);
            let slot = Arc::clone(&slot);
            tokio::spawn(async move {
                execute(&conn, &header, &orphans, operation_timeout, calls).await;
                drop(slot);
            });
        }
    }
}

/// Sends one batch and answers its callers. A lock nobody holds is handed to `orphans`
/// instead of staying held for its ttl: one taken for a caller that is gone (its future was
/// dropped while waiting), and one whose acquire failed in a way that leaves open whether
/// Redis applied it (a timeout, a broken connection: a request held up in the network runs
/// when it arrives, after its caller gave up).
/// The send is given up after `operation_timeout`, whatever the connection's own timeouts,
/// so that its slot is free again by then.
async fn execute(
    conn: &Conn,
    header: &Arc<Header>,
    orphans: &Arc<Orphans>,
    operation_timeout: Duration,
    calls: Vec<Call>,
) {
    let sent = Instant::now();
    let mut found = Vec::new();
    let (ops, callers): (Vec<Op>, Vec<_>) = calls.into_iter().map(|c| (c.op, c.reply)).unzip();
    let outcomes = outcomes(
        send_within(conn, header, &ops, operation_timeout).await,
        ops.len(),
    );
    for (i, ((op, caller), outcome)) in ops.into_iter().zip(callers).zip(outcomes).enumerate() {
        if i > 0 && i % REPLY_GROUP == 0 {
            // Let the callers answered so far run: the calls they make next go out as a batch
            // while the rest are still being answered.
            tokio::task::yield_now().await;
        }
        let (answer, in_doubt) = answer(outcome);
        if in_doubt {
            found.extend(Orphan::in_doubt(&op, sent));
        }
        if let Err(Ok(reply)) = caller.send(answer)
            && matches!(reply.value, Value::BulkString(_))
        {
            found.extend(Orphan::taken(&op, sent));
        }
    }
    if !found.is_empty() {
        orphans.add(found, conn, header);
    }
}
