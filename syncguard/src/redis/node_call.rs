//! A node call on a Redis Cluster: the operations of a batch whose locks one primary serves (as
//! the node map has it) in one call to that node, so that a batch of locks in many slots costs
//! one call per node, as it costs one call on one server.
//!
//! The call declares no key and passes the keys as arguments; it goes to the primary of its
//! first lock key's slot (as the cluster connection knows it). The function, registered with
//! `allow-cross-slot-keys`, runs each operation whose keys the node serves, and answers the
//! others "not served here" (`batch_call::NOT_SERVED_HERE`) having run nothing of them (a
//! stale map, a slot being migrated, a cluster down; see `lua/batch.lua`). Those are sent
//! again at once, each lock key's in a call of its own that declares its keys, so that the
//! cluster connection follows the slot for them (MOVED, ASK, TRYAGAIN) as for any call; and
//! the map is read again.
//!
//! A declared key would let the cluster redirect the whole call by `ASK` to a node importing
//! that key's slot, where it would run with `ASKING` and could write keys of that slot which
//! still live on the other node: two holders. Without one, the call runs where it was sent.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use futures_util::future::join_all;

use super::batch_call::{
    Failure, Header, KeysIn, Op, Outcome, Unanswered, call, not_served, not_served_error, outcome,
};
use super::connection::{Conn, ConnError};
use super::node_map::NodeMap;

/// Runs `ops` in a node call, and those it did not serve in calls of their own; their
/// outcomes, in order.
pub(super) async fn send(
    conn: &Conn,
    header: &Header,
    nodes: &Arc<NodeMap>,
    ops: &[Op],
) -> Result<Vec<Outcome>, Failure> {
    let (mut outcomes, unserved): (Vec<Outcome>, Vec<usize>) =
        match call(conn, header, ops, KeysIn::Args).await {
            Ok(replies) => {
                let unserved = (replies.iter().enumerate())
                    .filter(|(_, reply)| not_served(reply))
                    .map(|(index, _)| index)
                    .collect();
                (replies.into_iter().map(outcome).collect(), unserved)
            }
            // Refused before it ran: a node that is no primary any more (a failover the cluster
            // connection has not learnt of yet: it learns from the redirections of the calls
            // sent again), or one not serving now. Every operation goes again on its own.
            Err(failure) if refused_unrun(&failure) => (
                (0..ops.len())
                    .map(|_| Err(not_served_error().into()))
                    .collect(),
                (0..ops.len()).collect(),
            ),
            Err(failure) => return Err(failure),
        };
    if unserved.is_empty() {
        return Ok(outcomes);
    }
    nodes.refresh_soon();
    let resends = grouped(unserved, |&index| ops[index].lock_key());
    let resent = join_all(resends.into_iter().map(|indexes| async move {
        let ops: Vec<Op> = indexes.iter().map(|&index| ops[index].clone()).collect();
        let result = call(conn, header, &ops, KeysIn::Keys).await;
        (indexes, result)
    }))
    .await;
    for (indexes, result) in resent {
        match result {
            Ok(replies) => {
                for (index, reply) in indexes.into_iter().zip(replies) {
                    outcomes[index] = outcome(reply);
                }
            }
            Err(failure) => {
                for index in indexes {
                    outcomes[index] = Err(Unanswered {
                        error: failure.to_lock_error(),
                        may_have_run: failure.may_have_been_applied(),
                    });
                }
            }
        }
    }
    Ok(outcomes)
}

/// `items` in groups of the same `group` (one without a group alone), the groups in the order
/// of their first item, and the items of each in their order.
pub(super) fn grouped<T, G: Hash + Eq>(
    items: Vec<T>,
    group: impl Fn(&T) -> Option<G>,
) -> Vec<Vec<T>> {
    let mut index_of: HashMap<G, usize> = HashMap::new();
    let mut groups: Vec<Vec<T>> = Vec::new();
    for item in items {
        let index = match group(&item) {
            Some(group) => *index_of.entry(group).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            }),
            None => {
                groups.push(Vec::new());
                groups.len() - 1
            }
        };
        groups[index].push(item);
    }
    groups
}

/// Whether a node call failed on a refusal of the whole call before it ran, by a node that is
/// not (or not now) a primary serving keys: a replica (`READONLY`), a replica cut off from its
/// primary (`MASTERDOWN`), a node loading its data (`LOADING`) or a cluster down
/// (`CLUSTERDOWN`).
fn refused_unrun(failure: &Failure) -> bool {
    matches!(
        failure,
        Failure::Conn(ConnError::Redis(error))
            if matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "LOADING" | "CLUSTERDOWN"))
    )
}
