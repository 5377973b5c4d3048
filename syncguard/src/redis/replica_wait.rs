//! Waiting for replicas ([`RedisConfig::with_wait_for_replicas`](super::RedisConfig::with_wait_for_replicas)):
//! a call that acquires or extends goes with `WAIT` right behind it, and a grant or extension
//! the replicas did not acknowledge in time does not count.
//!
//! `WAIT` waits for the writes of the connection it is sent on. The two go as one pipeline, so
//! that they share one connection and one round trip: sent apart, a reconnection between them
//! (a `ConnectionManager` reconnects by itself) would send `WAIT` on a fresh connection with no
//! writes, which every replica has acknowledged at once.

use ::redis::Value;

use super::WaitForReplicas;
use super::batch_call::{
    Failure, Header, Op, Outcome, Unanswered, keyed_command, outcome, replies,
};
use super::connection::Conn;
use crate::error::LockError;

/// Whether a call carrying `ops` waits for replicas under `header`'s setting.
pub(super) fn waits(header: &Header, ops: &[Op]) -> Option<WaitForReplicas> {
    header.wait_for_replicas.filter(|_| {
        ops.iter()
            .any(|op| matches!(op, Op::Acquire { .. } | Op::Extend { .. }))
    })
}

/// Runs `ops` in one call on one server followed by `WAIT`; their outcomes, where an acquire or
/// extend that succeeded on the primary but reached fewer replicas than `wait` asks is an
/// error (an acquire's in doubt, so that its lock is released in the background).
pub(super) async fn send(
    conn: &Conn,
    header: &Header,
    ops: &[Op],
    wait: WaitForReplicas,
) -> Result<Vec<Outcome>, Failure> {
    let cmd = keyed_command(header, ops);
    let mut then = ::redis::cmd("WAIT");
    then.arg(wait.replicas()).arg(timeout_ms(wait));
    let (reply, acked) = conn
        .batch_then(&header.function, &cmd, &then)
        .await
        .map_err(Failure::Conn)?;
    let replies = replies(reply, ops.len())?;
    let acked = match acked {
        Value::Int(acked) => acked,
        other => return Err(Failure::Reply(other)),
    };
    let short = acked < i64::from(wait.replicas());
    Ok(ops
        .iter()
        .zip(replies)
        .map(|(op, reply)| match reply {
            Ok(reply) if short && took_effect(op, &reply.value) => Err(Unanswered {
                error: not_acknowledged(op, acked, wait),
                // An acquire's lock is on the primary with nobody holding it: let it go.
                may_have_run: matches!(op, Op::Acquire { .. }),
            }),
            reply => outcome(reply),
        })
        .collect())
}

/// `WAIT`'s timeout: whole milliseconds, rounded up (0 would wait for ever).
fn timeout_ms(wait: WaitForReplicas) -> u64 {
    u64::try_from(wait.timeout().as_micros().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Whether `reply` says that `op` wrote a lease: an acquire granted (a fence, or a holder's
/// re-entry), an extend applied (1, or 1 with the new expiry).
fn took_effect(op: &Op, reply: &Value) -> bool {
    match op {
        Op::Acquire { .. } => matches!(reply, Value::BulkString(_) | Value::Array(_)),
        Op::Extend { .. } => match reply {
            Value::Int(1) => true,
            Value::Array(parts) => matches!(parts.first(), Some(Value::Int(1))),
            _ => false,
        },
        Op::Release { .. } | Op::ReleaseUnclaimed { .. } => false,
    }
}

fn not_acknowledged(op: &Op, acked: i64, wait: WaitForReplicas) -> LockError {
    let (what, outcome) = match op {
        Op::Acquire { key, .. } => (
            format!("granted the lock on key {key:?}"),
            "it is not held (its lock is being released); try again",
        ),
        Op::Extend { lock_id, .. } => (
            format!("extended lock {lock_id}"),
            "it counts as not extended (the lease ends when it did); the heartbeat tries again",
        ),
        Op::Release { .. } | Op::ReleaseUnclaimed { .. } => ("released a lock".into(), ""),
    };
    LockError::service_unavailable(format!(
        "the Redis primary {what}, but only {acked} of the {} replicas asked for acknowledged it \
         within {:?} (RedisConfig::with_wait_for_replicas): {outcome}; if this persists, check \
         the replicas and their link, or ask for fewer",
        wait.replicas(),
        wait.timeout()
    ))
}
