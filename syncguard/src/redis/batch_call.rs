//! One call of the batch script: the operations it takes, how they are encoded, and how its
//! reply is split among them. `batch_send` sends batches as such calls.

#[cfg(feature = "redis-cluster")]
use std::sync::Arc;
use std::time::Duration;

use ::redis::{Cmd, Value};

use super::WaitForReplicas;
use super::batch_function::BatchFunction;
use super::connection::{Conn, ConnError};
use super::error::{error_from_reply, unexpected_reply};
use super::keys::Located;
#[cfg(feature = "redis-cluster")]
use super::node_map::NodeMap;
use super::timed_out;
use crate::backend::time::TIME_TOLERANCE_MS;
use crate::error::LockError;
use crate::lock_id::LockId;

/// One call, with the keys and arguments the batch script takes for it.
#[derive(Clone)]
pub(crate) enum Op {
    /// With a `holder` (`acquire_as`): re-entrant by that holder, and the holder stored.
    Acquire {
        lock_key: String,
        /// `None` in the cluster layout.
        index_key: Option<String>,
        fence_key: String,
        lock_id: LockId,
        ttl_ms: u64,
        key: String,
        holder: Option<String>,
    },
    Release {
        at: Located,
        lock_id: LockId,
        /// Whether this process has waiters that a release without a publish should wake:
        /// the script then replies with the lock's key (read out of its record), else 1.
        wake_here: bool,
    },
    /// The release of the lock an acquire as a holder took for a caller that never learnt it:
    /// only while it is unclaimed (no re-entry or extend used its lock id since).
    ReleaseUnclaimed { at: Located, lock_id: LockId },
    /// `extend`, `extend_by` and `expire_at`, as `expiry` says.
    Extend {
        at: Located,
        lock_id: LockId,
        expiry: NewExpiry,
    },
}

/// How an extend sets the lock's new expiry (milliseconds).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum NewExpiry {
    /// The server's now + this ttl (`extend`).
    FromNow(u64),
    /// The current expiry + this (`extend_by`).
    Added(u64),
    /// This Unix time (`expire_at`).
    At(u64),
}

impl Op {
    /// The lock key the operation is sent for, when it names one: every key of an operation
    /// in the cluster layout is in this key's hash slot.
    #[cfg(feature = "redis-cluster")]
    pub(super) fn lock_key(&self) -> Option<&str> {
        match self {
            Op::Acquire { lock_key, .. } => Some(lock_key),
            Op::Release { at, .. } | Op::ReleaseUnclaimed { at, .. } | Op::Extend { at, .. } => {
                at.lock_key.as_deref()
            }
        }
    }

    fn keys(&self) -> usize {
        match self {
            Op::Acquire { index_key, .. } => 2 + usize::from(index_key.is_some()),
            Op::Release { at, .. } | Op::ReleaseUnclaimed { at, .. } | Op::Extend { at, .. } => {
                usize::from(at.lock_key.is_some()) + usize::from(at.index_key.is_some())
            }
        }
    }

    fn args(&self) -> usize {
        match self {
            Op::Acquire { holder, .. } => 5 + usize::from(holder.is_some()),
            Op::Release { .. } | Op::ReleaseUnclaimed { .. } => 2,
            Op::Extend { expiry, .. } => match expiry {
                NewExpiry::FromNow(_) => 4,
                NewExpiry::Added(_) | NewExpiry::At(_) => 3,
            },
        }
    }

    fn bytes(&self) -> usize {
        let located = |at: &Located| {
            at.lock_key.as_ref().map_or(0, String::len)
                + at.index_key.as_ref().map_or(0, String::len)
        };
        match self {
            Op::Acquire {
                lock_key,
                index_key,
                fence_key,
                key,
                holder,
                ..
            } => {
                lock_key.len()
                    + index_key.as_ref().map_or(0, String::len)
                    + fence_key.len()
                    + key.len()
                    + holder.as_ref().map_or(0, String::len)
                    + 64
            }
            Op::Release { at, .. } | Op::ReleaseUnclaimed { at, .. } => located(at) + 24,
            Op::Extend { at, .. } => located(at) + 64,
        }
    }

    /// Its keys, in the order the script reads them.
    fn push_keys(&self, cmd: &mut Cmd) {
        match self {
            Op::Acquire {
                lock_key,
                index_key,
                fence_key,
                ..
            } => {
                cmd.arg(lock_key.as_str());
                if let Some(index_key) = index_key {
                    cmd.arg(index_key.as_str());
                }
                cmd.arg(fence_key.as_str());
            }
            Op::Release { at, .. } | Op::ReleaseUnclaimed { at, .. } | Op::Extend { at, .. } => {
                if let Some(lock_key) = &at.lock_key {
                    cmd.arg(lock_key.as_str());
                }
                if let Some(index_key) = &at.index_key {
                    cmd.arg(index_key.as_str());
                }
            }
        }
    }

    /// Its letter and arguments. The letter of an operation on an existing lock is lower
    /// case when it names the lock key, upper case when the script finds it through the index.
    fn push_args(&self, cmd: &mut Cmd) {
        let letter = |at: &Located, known: &'static str, through_index: &'static str| {
            if at.lock_key.is_some() {
                known
            } else {
                through_index
            }
        };
        match self {
            Op::Acquire {
                lock_id,
                ttl_ms,
                key,
                holder,
                ..
            } => {
                cmd.arg(if holder.is_some() { "H" } else { "A" })
                    .arg(lock_id.as_str())
                    .arg(*ttl_ms)
                    .arg(ttl_ms + TIME_TOLERANCE_MS)
                    .arg(key.as_str());
                if let Some(holder) = holder {
                    cmd.arg(holder.as_str());
                }
            }
            Op::Release {
                at,
                lock_id,
                wake_here,
            } => {
                let release = match wake_here {
                    true => letter(at, "r", "R"),
                    false => letter(at, "q", "Q"),
                };
                cmd.arg(release).arg(lock_id.as_str());
            }
            Op::ReleaseUnclaimed { at, lock_id } => {
                cmd.arg(letter(at, "o", "O")).arg(lock_id.as_str());
            }
            Op::Extend {
                at,
                lock_id,
                expiry,
            } => {
                match *expiry {
                    NewExpiry::FromNow(ttl_ms) => cmd
                        .arg(letter(at, "e", "E"))
                        .arg(lock_id.as_str())
                        .arg(ttl_ms)
                        .arg(ttl_ms + TIME_TOLERANCE_MS),
                    NewExpiry::Added(by_ms) => cmd
                        .arg(letter(at, "b", "B"))
                        .arg(lock_id.as_str())
                        .arg(by_ms),
                    NewExpiry::At(at_ms) => cmd
                        .arg(letter(at, "t", "T"))
                        .arg(lock_id.as_str())
                        .arg(at_ms),
                };
            }
        }
    }
}

/// What every batch call of one backend passes before its operations, and how the call reaches
/// the server (as a function or a script).
pub(crate) struct Header {
    /// On a Redis Cluster, which primary serves which lock key: a batch goes out as one call
    /// per node (see `node_call`). `None` on one server: one call carries any operations.
    #[cfg(feature = "redis-cluster")]
    pub(crate) nodes: Option<Arc<NodeMap>>,
    /// `<prefix>:id:`, the start of every index key; empty in the cluster layout.
    pub(crate) index_prefix: Box<str>,
    /// Where releases are published (`<prefix>:released`); empty when they are not.
    pub(crate) release_channel: Box<str>,
    /// Whether the batch is called as a function on this backend's server, or as a script.
    pub(crate) function: BatchFunction,
    /// The replicas a call that acquires or extends waits for (`WAIT` after it), if any.
    pub(crate) wait_for_replicas: Option<WaitForReplicas>,
}

/// What an operation got back: its slot of the batch reply, and the server time of the batch
/// (an acquire or extend that succeeded expires at `now_ms + ttl`; an extend by an amount
/// replies its new expiry).
pub(crate) struct Reply {
    pub(crate) value: Value,
    pub(crate) now_ms: u64,
}

/// What one operation of a call came to: its reply, or why it has none.
pub(crate) type Outcome = Result<Reply, Unanswered>;

/// An operation without a reply: the error its caller gets, and whether it may have run all
/// the same (on a cluster, sent again on its own and that call failed in doubt), as a whole
/// call that failed may have.
pub(crate) struct Unanswered {
    pub(crate) error: LockError,
    pub(crate) may_have_run: bool,
}

impl From<LockError> for Unanswered {
    /// The error an operation met when it ran (it changed nothing).
    fn from(error: LockError) -> Self {
        Self {
            error,
            may_have_run: false,
        }
    }
}

/// The outcome of each of `count` operations sent in a call that came to `sent`: a call that
/// failed as a whole leaves every one unanswered, with the call's error, in doubt as it is.
pub(super) fn outcomes(sent: Result<Vec<Outcome>, Failure>, count: usize) -> Vec<Outcome> {
    match sent {
        Ok(outcomes) => outcomes,
        Err(failure) => {
            let may_have_run = failure.may_have_been_applied();
            (0..count)
                .map(|_| {
                    Err(Unanswered {
                        error: failure.to_lock_error(),
                        may_have_run,
                    })
                })
                .collect()
        }
    }
}

/// What the caller of an operation is told of its outcome, and whether the operation may have
/// run all the same (an acquire's lock is then let go of in the background).
pub(super) fn answer(outcome: Outcome) -> (Result<Reply, LockError>, bool) {
    match outcome {
        Ok(reply) => (Ok(reply), false),
        Err(unanswered) => (Err(unanswered.error), unanswered.may_have_run),
    }
}

/// The reply of an operation that a cluster node did not serve (`lua/batch.lua`): it ran
/// nothing.
pub(super) const NOT_SERVED_HERE: i64 = -101;

/// Why a whole batch failed; each of its callers gets the mapped error.
pub(super) enum Failure {
    Conn(ConnError),
    Reply(Value),
    /// No reply within the operation timeout: the call may still be on the wire, and run.
    TimedOut(Duration),
}

impl Failure {
    /// Whether the batch may have run: a pooled connection that could not be had sent
    /// nothing.
    pub(super) fn may_have_been_applied(&self) -> bool {
        !matches!(self, Failure::Conn(ConnError::Pool(_)))
    }

    pub(super) fn to_lock_error(&self) -> LockError {
        match self {
            Failure::Conn(error) => error.to_lock_error(),
            Failure::Reply(reply) => unexpected_reply("batch", reply),
            Failure::TimedOut(timeout) => timed_out("answer", *timeout),
        }
    }
}

/// Where a call passes the keys of its operations.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum KeysIn {
    /// Declared (`KEYS`): on a cluster, all in one slot.
    Keys,
    /// In `ARGV`, none declared: a node call of a cluster, sent to the primary of its first
    /// lock key's slot, whose keys are in many slots of that node.
    #[cfg(feature = "redis-cluster")]
    Args,
}

/// Runs `ops` in one call of the batch script; their replies, in order, with an operation its
/// node did not serve as [`NOT_SERVED_HERE`].
pub(super) async fn call(
    conn: &Conn,
    header: &Header,
    ops: &[Op],
    keys_in: KeysIn,
) -> Result<Vec<Result<Reply, LockError>>, Failure> {
    #[cfg(feature = "redis-cluster")]
    if keys_in == KeysIn::Args
        && let Some(first) = ops.first().and_then(Op::lock_key)
    {
        let keys = ops.iter().map(Op::keys).sum::<usize>();
        let op_args = ops.iter().map(Op::args).sum::<usize>();
        let bytes = ops.iter().map(Op::bytes).sum::<usize>()
            + header.index_prefix.len()
            + header.release_channel.len();
        // No key declared: the keys come after their count, ahead of the operations.
        let mut cmd = header.function.command(0, 4 + keys + op_args, bytes);
        cmd.arg(TIME_TOLERANCE_MS)
            .arg("{}")
            .arg(&*header.release_channel)
            .arg(keys);
        for op in ops {
            op.push_keys(&mut cmd);
        }
        for op in ops {
            op.push_args(&mut cmd);
        }
        let slot = super::node_map::slot_of(first.as_bytes());
        let reply = conn
            .batch_on_primary_of(slot, &header.function, &cmd)
            .await
            .map_err(Failure::Conn)?;
        return replies(reply, ops.len());
    }
    #[cfg(not(feature = "redis-cluster"))]
    let KeysIn::Keys = keys_in;
    let reply = conn
        .batch(&header.function, &keyed_command(header, ops))
        .await
        .map_err(Failure::Conn)?;
    replies(reply, ops.len())
}

/// The call of `ops` with their keys declared (`KEYS`): on a cluster, all in one slot.
pub(super) fn keyed_command(header: &Header, ops: &[Op]) -> Cmd {
    let keys = ops.iter().map(Op::keys).sum::<usize>();
    let op_args = ops.iter().map(Op::args).sum::<usize>();
    let bytes = ops.iter().map(Op::bytes).sum::<usize>()
        + header.index_prefix.len()
        + header.release_channel.len();
    let mut cmd = header.function.command(keys, 3 + op_args, bytes);
    for op in ops {
        op.push_keys(&mut cmd);
    }
    cmd.arg(TIME_TOLERANCE_MS)
        .arg(&*header.index_prefix)
        .arg(&*header.release_channel);
    for op in ops {
        op.push_args(&mut cmd);
    }
    cmd
}

/// The replies of a call's `ops` operations, from its reply: the server time, then one each.
pub(super) fn replies(reply: Value, ops: usize) -> Result<Vec<Result<Reply, LockError>>, Failure> {
    let Value::Array(mut replies) = reply else {
        return Err(Failure::Reply(reply));
    };
    let now_ms = match replies.first() {
        Some(Value::Int(now)) if replies.len() == ops + 1 => u64::try_from(*now).ok(),
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

/// Whether an operation's reply says its node did not serve its key ([`NOT_SERVED_HERE`]).
pub(super) fn not_served(reply: &Result<Reply, LockError>) -> bool {
    matches!(
        reply,
        Ok(Reply {
            value: Value::Int(NOT_SERVED_HERE),
            ..
        })
    )
}

/// The error of an operation that no node served, not even in a call of its own: it ran
/// nothing, and may be tried again.
pub(super) fn not_served_error() -> LockError {
    LockError::service_unavailable(
        "the Redis Cluster node did not serve the lock's hash slot (the slot is moving, or the \
         cluster is down); nothing was changed, try again",
    )
}

/// An operation's outcome from its reply: one its node did not serve, even in a call of its
/// own, is refused for now.
pub(super) fn outcome(reply: Result<Reply, LockError>) -> Outcome {
    if not_served(&reply) {
        return Err(not_served_error().into());
    }
    reply.map_err(Unanswered::from)
}
