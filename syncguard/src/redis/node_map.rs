//! Which primary of a Redis Cluster serves which lock key, so that a batch goes out as one call
//! per node (see `node_call`) instead of one per lock key: a key's hash slot, reckoned as the
//! cluster does (CRC16 of its hash tag), and each slot's primary as `CLUSTER SLOTS` last said.
//!
//! The map only groups operations; the cluster connection sends each node call to the primary
//! of its first lock's slot as it knows it, and a node runs only the operations whose keys it
//! serves. A stale map (after a
//! migration or a failover, until the next refresh) costs speed, never correctness: an
//! operation its node does not serve comes back unrun, is sent again on its own, and asks for a
//! refresh.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ::redis::Value;
use ::redis::cluster_async::ClusterConnection;

/// Hash slots of a Redis Cluster.
const SLOTS: usize = 16384;
/// A slot no primary serves (or not yet known).
const NO_NODE: u16 = u16::MAX;
/// The shortest time between two refreshes: operations sent to the wrong node during a
/// migration would otherwise ask for one each.
const MIN_REFRESH_INTERVAL: Duration = Duration::from_millis(100);

/// A backend's map of slots to primaries, refreshed in the background.
pub(crate) struct NodeMap {
    conn: ClusterConnection,
    /// The node of each slot (an index that means something within one map only); empty
    /// until first learnt.
    slots: RwLock<Arc<[u16]>>,
    /// Whether a refresh was asked for since the last one started.
    wanted: AtomicBool,
    /// Whether a task is refreshing the map (or waiting to).
    refreshing: AtomicBool,
    last_refresh: Mutex<Option<Instant>>,
}

/// The map as of one moment, for grouping one batch.
pub(crate) struct Nodes(Arc<[u16]>);

impl Nodes {
    /// The primary that serves `lock_key`, when the map knows it.
    pub(crate) fn of(&self, lock_key: &str) -> Option<u16> {
        let node = *self.0.get(usize::from(slot_of(lock_key.as_bytes())))?;
        (node != NO_NODE).then_some(node)
    }
}

impl NodeMap {
    pub(crate) fn new(conn: ClusterConnection) -> Self {
        Self {
            conn,
            slots: RwLock::new(Arc::from([])),
            wanted: AtomicBool::new(false),
            refreshing: AtomicBool::new(false),
            last_refresh: Mutex::new(None),
        }
    }

    /// The current map; an empty one (nothing known yet) asks for a refresh.
    pub(crate) fn current(self: &Arc<Self>) -> Nodes {
        let slots = Arc::clone(&self.slots.read().unwrap_or_else(|e| e.into_inner()));
        if slots.is_empty() {
            self.refresh_soon();
        }
        Nodes(slots)
    }

    /// Reads `CLUSTER SLOTS` again in the background, at most once per
    /// [`MIN_REFRESH_INTERVAL`]: requests made meanwhile, or while a refresh is under way, are
    /// served by one more refresh after it (whose answer is newer than what they saw).
    pub(crate) fn refresh_soon(self: &Arc<Self>) {
        self.wanted.store(true, Ordering::Release);
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let map = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let last = *map.last_refresh.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(last) = last {
                    tokio::time::sleep(MIN_REFRESH_INTERVAL.saturating_sub(last.elapsed())).await;
                }
                map.wanted.store(false, Ordering::Release);
                map.refresh().await;
                map.refreshing.store(false, Ordering::Release);
                // A request made during the refresh found it under way and left it to this
                // task; unless another task took it up since.
                if !map.wanted.load(Ordering::Acquire)
                    || map.refreshing.swap(true, Ordering::AcqRel)
                {
                    return;
                }
            }
        });
    }

    async fn refresh(&self) {
        let slots = ::redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async::<Value>(&mut self.conn.clone())
            .await;
        match slots {
            Ok(reply) => match slot_owners(&reply) {
                Some(slots) => *self.slots.write().unwrap_or_else(|e| e.into_inner()) = slots,
                None => tracing::debug!(
                    ?reply,
                    "syncguard: unexpected CLUSTER SLOTS reply; calls go one per lock key"
                ),
            },
            Err(error) => tracing::debug!(
                %error,
                "syncguard: CLUSTER SLOTS failed; calls go by the last map known"
            ),
        }
        *self.last_refresh.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }
}

/// The slot of a key as a Redis Cluster reckons it: CRC16 (XMODEM) of the key's hash tag (the
/// text between its first `{` and the first `}` after it, when not empty), else of the whole
/// key, modulo 16384.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS as u16
}

/// The node of each slot from a `CLUSTER SLOTS` reply (ranges of `[start, end, [host, port,
/// ..], replicas..]`), nodes numbered by their address; `None` for a reply of another shape.
fn slot_owners(reply: &Value) -> Option<Arc<[u16]>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut slots = vec![NO_NODE; SLOTS];
    let mut nodes: HashMap<(&[u8], i64), u16> = HashMap::new();
    for range in ranges {
        let Value::Array(range) = range else {
            return None;
        };
        let [
            Value::Int(start),
            Value::Int(end),
            Value::Array(primary),
            ..,
        ] = range.as_slice()
        else {
            return None;
        };
        let [Value::BulkString(host), Value::Int(port), ..] = primary.as_slice() else {
            return None;
        };
        let start = usize::try_from(*start).ok()?;
        let end = usize::try_from(*end).ok()?;
        if start > end || end >= SLOTS {
            return None;
        }
        let count = u16::try_from(nodes.len()).ok()?;
        let node = *nodes.entry((host.as_slice(), *port)).or_insert(count);
        slots[start..=end].fill(node);
    }
    Some(slots.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_clusters() {
        // Values from `CLUSTER KEYSLOT` of a Redis 7.0 cluster.
        assert_eq!(slot_of(b"a"), 15495);
        assert_eq!(slot_of(b"b"), 3300);
        assert_eq!(slot_of(b"{b}x"), 3300);
        assert_eq!(slot_of(b"syncguard:{b}:fence"), 3300);
        // An empty tag is no tag: the whole key counts.
        assert_eq!(slot_of(b"{}b"), slot_of(b"{}b"));
        assert_ne!(slot_of(b"{}b"), slot_of(b"b"));
        // Only the first `}` after the first `{` closes the tag.
        assert_eq!(slot_of(b"x{b}}"), 3300);
    }

    fn range(start: i64, end: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
        ])
    }

    #[test]
    fn reads_the_primaries_of_cluster_slots() {
        let reply = Value::Array(vec![
            range(0, 5460, 7001),
            range(5461, 10922, 7002),
            range(10923, 16383, 7003),
            range(100, 100, 7002),
        ]);
        let nodes = Nodes(slot_owners(&reply).unwrap());
        // "b" is in slot 3300, "a" in 15495.
        assert_ne!(nodes.of("b"), nodes.of("a"));
        assert_eq!(nodes.of("b"), nodes.of("{b}:fence"));
        assert_eq!(nodes.of("a"), nodes.of("{a}"));
        // Slot 100 was listed again, for the second node.
        assert_eq!(nodes.0[100], nodes.0[6000]);
    }

    #[test]
    fn an_unknown_or_partial_map_places_nothing_it_does_not_know() {
        assert!(Nodes(Arc::from([])).of("a").is_none());
        let partial = Nodes(slot_owners(&Value::Array(vec![range(0, 5460, 7001)])).unwrap());
        assert!(partial.of("b").is_some());
        assert!(partial.of("a").is_none());
        for odd in [
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![range(5, 4, 7001)]),
            Value::Array(vec![range(0, 16384, 7001)]),
        ] {
            assert!(slot_owners(&odd).is_none(), "{odd:?}");
        }
    }
}
