//! How a batch of operations (of batched callers, a lone caller, or the orphan releases) is sent:
//! in one call of the batch script on one server; on a Redis Cluster, one node call per primary
//! (see `node_call`).

use std::time::Duration;

use super::batch_call::{Failure, Header, KeysIn, Op, Outcome, call, outcome};
use super::connection::Conn;

/// `items` (each carrying an operation) split into the calls that carry them: all in one call
/// on one server; on a cluster, one call per primary that the node map knows for their lock
/// keys (one per lock key where it knows none). The operations of one key keep their order.
pub(super) fn split_into_calls<T>(
    header: &Header,
    items: Vec<T>,
    op: impl Fn(&T) -> &Op,
) -> Vec<Vec<T>> {
    #[cfg(feature = "redis-cluster")]
    if let Some(nodes) = &header.nodes
        && items.len() > 1
    {
        #[derive(PartialEq, Eq, Hash)]
        enum Call {
            Node(u16),
            Key(String),
        }
        let nodes = nodes.current();
        return super::node_call::grouped(items, |item| {
            let lock_key = op(item).lock_key()?;
            Some(match nodes.of(lock_key) {
                Some(node) => Call::Node(node),
                None => Call::Key(lock_key.to_owned()),
            })
        });
    }
    let _ = (header, &op);
    vec![items]
}

/// [`send`], given up after `timeout` (the operation timeout): the backend's own bound, so
/// that a connection of the user's without a response timeout (a `ConnectionManager`, or a
/// pool's connections, gone half-open) cannot hold a batch slot or the orphan releases for as
/// long as the network holds the call.
pub(super) async fn send_within(
    conn: &Conn,
    header: &Header,
    ops: &[Op],
    timeout: Duration,
) -> Result<Vec<Outcome>, Failure> {
    tokio::time::timeout(timeout, send(conn, header, ops))
        .await
        .unwrap_or(Err(Failure::TimedOut(timeout)))
}

/// Runs `ops` in one call of the batch script (on a cluster, a node call: see `node_call`);
/// their outcomes, in order.
pub(super) async fn send(
    conn: &Conn,
    header: &Header,
    ops: &[Op],
) -> Result<Vec<Outcome>, Failure> {
    #[cfg(feature = "redis-cluster")]
    if let Some(nodes) = &header.nodes {
        return super::node_call::send(conn, header, nodes, ops).await;
    }
    if let Some(wait) = super::replica_wait::waits(header, ops) {
        return super::replica_wait::send(conn, header, ops, wait).await;
    }
    let replies = call(conn, header, ops, KeysIn::Keys).await?;
    Ok(replies.into_iter().map(outcome).collect())
}
