//! Waiting on a cluster: the release of a contended lock is published with `SPUBLISH` on the
//! lock's own shard channel (`<lock key>:released`, in its slot) and never with a classic
//! `PUBLISH`, which a cluster sends to every node; a waiter's backend subscribes to that channel
//! (`SSUBSCRIBE`, on the node serving the slot) while it waits and leaves it after; a waiter of
//! another backend is woken long before its poll, on every primary, and still after the slot's
//! primary failed over; without a publish, a waiter wakes at the holder's lease end.
//!
//! The waiters poll every 30 s, so that only a message (or the lease end) explains a prompt
//! wake-up. The hand-over times are printed (run with `--nocapture` to see them).

#[path = "../support/waiters.rs"]
mod waiters;

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use syncguard::backend::{AcquireOutcome, LockBackend};
use syncguard::redis::{RedisBackend, RedisConfig, RedisConnection};
use syncguard::{LockError, LockGuard, LockOptions};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use crate::cluster::{Node, RedisCluster};
use crate::{cluster_url, unique, urls};
use waiters::{spawn_waiter, taken, waiting_every};

/// A poll so slow that only a message (or the lease end) explains a prompt wake-up.
const SLOW_POLL: Duration = Duration::from_secs(30);

/// A wake-up by a message takes milliseconds; this is a loaded 2-core machine's worst case,
/// still far from the poll and the lease end.
const PROMPT: Duration = Duration::from_secs(2);

/// How long a subscription may take to show on a node (a failover's resubscription included).
const SETTLE: Duration = Duration::from_secs(20);

/// Releases `guard` and returns the lock `waiter` then gets within [`PROMPT`], printing how
/// long after the release that was (`after`: in what situation).
async fn hand_over(
    guard: LockGuard,
    waiter: JoinHandle<Result<LockGuard, LockError>>,
    after: &str,
) -> LockGuard {
    let released = Instant::now();
    guard.release().await.unwrap();
    let taken = taken(waiter, PROMPT).await;
    println!("woken {:?} after the release, {after}", released.elapsed());
    taken
}

/// A plain connection to one node (`127.0.0.1:<port>`).
async fn node(addr: &str) -> MultiplexedConnection {
    redis::Client::open(format!("redis://{addr}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

/// The shard channel a release of `key` is published on.
fn shard_channel(backend: &RedisBackend, key: &str) -> String {
    format!("{}:released", backend.lock_key(key).unwrap())
}

/// The shard channels `conn`'s node has subscribers on, among `channel`.
async fn has_shard_channel(conn: &mut MultiplexedConnection, channel: &str) -> bool {
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .arg(channel)
        .query_async(conn)
        .await
        .unwrap();
    channels.iter().any(|c| c == channel)
}

/// Waits until `channel` is (or is no longer) subscribed on `conn`'s node.
async fn until_shard_channel(conn: &mut MultiplexedConnection, channel: &str, subscribed: bool) {
    let deadline = Instant::now() + SETTLE;
    while has_shard_channel(conn, channel).await != subscribed {
        assert!(
            Instant::now() < deadline,
            "{channel} is {}subscribed after {SETTLE:?}",
            if subscribed { "not " } else { "still " }
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// The calls of `command` a node has run (`INFO commandstats`, scripts' calls included).
async fn calls(conn: &mut MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let line = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// How many connections subscribe to the classic `channel`, on all nodes of the shared cluster.
async fn classic_listeners(channel: &str) -> i64 {
    let mut total = 0;
    for addr in urls::redis_cluster_nodes() {
        let (_, listeners): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut node(&addr).await)
            .await
            .unwrap();
        total += listeners;
    }
    total
}

/// The primary serving each slot range of the shared cluster (`CLUSTER NODES` of any node).
async fn slot_owners() -> Vec<(u16, u16, String)> {
    let any = &urls::redis_cluster_nodes()[0];
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut node(any).await)
        .await
        .unwrap();
    let mut owners = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 9 || !fields[2].contains("master") {
            continue;
        }
        let addr = fields[1].split('@').next().unwrap().to_owned();
        for range in &fields[8..] {
            if range.starts_with('[') {
                continue; // a slot migrating
            }
            let (from, to) = range.split_once('-').unwrap_or((range, range));
            owners.push((from.parse().unwrap(), to.parse().unwrap(), addr.clone()));
        }
    }
    owners
}

/// The address of the primary serving the lock key of `key`.
async fn owner(backend: &RedisBackend, key: &str, owners: &[(u16, u16, String)]) -> String {
    let any = &urls::redis_cluster_nodes()[0];
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(backend.lock_key(key).unwrap())
        .query_async(&mut node(any).await)
        .await
        .unwrap();
    owners
        .iter()
        .find(|(from, to, _)| (*from..=*to).contains(&slot))
        .map(|(_, _, addr)| addr.clone())
        .unwrap_or_else(|| panic!("no primary serves slot {slot}"))
}

/// A key of this run for each primary: its lock key in a slot that primary serves.
async fn key_per_primary(backend: &RedisBackend, run: &str) -> HashMap<String, String> {
    let owners = slot_owners().await;
    let primaries: std::collections::HashSet<&String> = owners.iter().map(|(_, _, a)| a).collect();
    let mut keys = HashMap::new();
    for n in 0.. {
        let key = format!("{run}:{n}");
        keys.entry(owner(backend, &key, &owners).await)
            .or_insert(key);
        if keys.len() == primaries.len() {
            return keys;
        }
        assert!(n < 1000, "no key found for every primary: {keys:?}");
    }
    unreachable!()
}

/// On every primary: a waiter of one backend is woken by another backend's release long before
/// its poll; while it waits its backend is subscribed to the lock's shard channel on that
/// primary, and not after; the release went by `SPUBLISH`, and nothing was sent by `PUBLISH`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_another_backends_waiter_through_the_shard_channel_on_every_primary() {
    let holder = RedisBackend::connect(&cluster_url()).await.unwrap();
    let waiting = RedisBackend::connect(&cluster_url()).await.unwrap();
    let keys = key_per_primary(&holder, &unique("wake")).await;
    assert_eq!(keys.len(), 3, "three primaries: {keys:?}");
    let mut all_nodes = Vec::new();
    for addr in urls::redis_cluster_nodes() {
        all_nodes.push(node(&addr).await);
    }
    let mut handoffs = Vec::new();
    for (primary, key) in &keys {
        let mut owner = node(primary).await;
        let channel = shard_channel(&holder, key);
        let guard = syncguard::acquire(&holder, key, &LockOptions::default())
            .await
            .unwrap();
        let waiter = spawn_waiter(&waiting, key, waiting_every(SLOW_POLL));
        until_shard_channel(&mut owner, &channel, true).await;
        let spublished = calls(&mut owner, "spublish").await;
        let mut published = Vec::new();
        for conn in &mut all_nodes {
            published.push(calls(conn, "publish").await);
        }

        let released = Instant::now();
        guard.release().await.unwrap();
        let guard = taken(waiter, PROMPT).await;
        let handoff = released.elapsed();
        handoffs.push(handoff);
        println!("{primary}: woken {handoff:?} after the release");

        assert!(
            calls(&mut owner, "spublish").await > spublished,
            "the release of {key} on {primary} went by SPUBLISH"
        );
        for (conn, before) in all_nodes.iter_mut().zip(published) {
            assert_eq!(calls(conn, "publish").await, before, "no classic PUBLISH");
        }
        // Nobody waits any more: the backend left the channel.
        until_shard_channel(&mut owner, &channel, false).await;
        guard.release().await.unwrap();
    }
    println!("hand-overs through the shard channels: {handoffs:?}");
}

/// A release nobody publishes (the holder's backend has release notifications off) leaves the
/// waiter to its poll and the holder's lease end: it takes the lock then, having been
/// subscribed to the lock's shard channel meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_publish_a_waiter_wakes_at_the_holders_lease_end() {
    let quiet = RedisConfig::new().with_release_notifications(false);
    let holder = RedisBackend::connect_with(&cluster_url(), quiet)
        .await
        .unwrap();
    let waiting = RedisBackend::connect(&cluster_url()).await.unwrap();
    let key = unique("lease-end");
    let ttl = Duration::from_secs(3);
    let taken_at = Instant::now();
    let AcquireOutcome::Acquired(_lease) = holder.acquire(&key, ttl).await.unwrap() else {
        panic!("{key} is free");
    };
    let waiter = spawn_waiter(&waiting, &key, waiting_every(SLOW_POLL));
    let owners = slot_owners().await;
    let mut owner = node(&owner(&holder, &key, &owners).await).await;
    let channel = shard_channel(&holder, &key);
    until_shard_channel(&mut owner, &channel, true).await;
    // Never released: it expires (the liveness predicate's 1 s tolerance after the ttl).
    let guard = taken(waiter, ttl + Duration::from_secs(1) + PROMPT + PROMPT).await;
    let waited = taken_at.elapsed();
    println!("taken {waited:?} after the holder's acquire (ttl {ttl:?})");
    assert!(waited >= ttl, "not before the lease end: {waited:?}");
    until_shard_channel(&mut owner, &channel, false).await;
    guard.release().await.unwrap();
}

/// A private cluster, two backends on it (one holds, one waits) and a key, with the slot of
/// its lock key, that slot's primary and a replica of it.
struct OwnCluster {
    cluster: RedisCluster,
    holder: RedisBackend,
    waiting: RedisBackend,
    key: String,
    channel: String,
    slot: u16,
    primary: Node,
    replica: Node,
}

impl OwnCluster {
    async fn start(label: &str) -> Self {
        let cluster = RedisCluster::start(3, 1).await;
        let holder = RedisBackend::connect(&cluster.url()).await.unwrap();
        let waiting = RedisBackend::connect(&cluster.url()).await.unwrap();
        let key = unique(label);
        let channel = shard_channel(&holder, &key);
        let slot = cluster.slot_of(&holder.lock_key(&key).unwrap()).await;
        let primary = cluster.owner_of_slot(slot).await;
        let replica = cluster.replicas_of(primary).await[0];
        Self {
            cluster,
            holder,
            waiting,
            key,
            channel,
            slot,
            primary,
            replica,
        }
    }

    /// A key whose lock another primary serves.
    async fn key_elsewhere(&self) -> String {
        loop {
            let key = unique("elsewhere");
            let slot = self
                .cluster
                .slot_of(&self.holder.lock_key(&key).unwrap())
                .await;
            if self.cluster.owner_of_slot(slot).await != self.primary {
                return key;
            }
        }
    }

    /// A waiter of the waiting backend, once it listens on `node`.
    async fn waiter_listening_on(&self, node: Node) -> JoinHandle<Result<LockGuard, LockError>> {
        let waiter = spawn_waiter(&self.waiting, &self.key, waiting_every(SLOW_POLL));
        let mut conn = self.cluster.connect(node).await;
        until_shard_channel(&mut conn, &self.channel, true).await;
        waiter
    }
}

/// After a manual failover of the primary serving a waited-on lock, a release on the new
/// primary wakes the waiter long before its poll. (Redis 7.0 keeps the subscribers of a primary
/// that became a replica this way, and sends shard messages to every node of the shard.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_after_its_locks_primary_failed_over() {
    let own = OwnCluster::start("failover").await;
    let guard = syncguard::acquire(&own.holder, &own.key, &LockOptions::default())
        .await
        .unwrap();
    let waiter = own.waiter_listening_on(own.primary).await;

    own.cluster.failover(own.replica).await;
    assert_eq!(own.cluster.owner_of_slot(own.slot).await, own.replica);
    let guard = hand_over(guard, waiter, "after a failover").await;
    guard.release().await.unwrap();
}

/// When the primary serving a waited-on lock dies and its replica takes over, the waiter's
/// backend subscribes again on the new primary, and a release there wakes the waiter long
/// before its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_resubscribed_after_its_locks_primary_died() {
    let own = OwnCluster::start("died").await;
    let ttl = Duration::from_secs(30);
    let AcquireOutcome::Acquired(lease) = own.holder.acquire(&own.key, ttl).await.unwrap() else {
        panic!("{} is free", own.key);
    };
    let waiter = own.waiter_listening_on(own.primary).await;
    // The backend also waits on a lock of another primary: redis-rs's own resubscription
    // (one SSUBSCRIBE for every channel) is then refused (CROSSSLOT).
    let other = own.key_elsewhere().await;
    let other_guard = syncguard::acquire(&own.holder, &other, &LockOptions::default())
        .await
        .unwrap();
    let other_waiter = spawn_waiter(&own.waiting, &other, waiting_every(SLOW_POLL));
    // The grant reaches the replica before the primary dies.
    let mut on_replica = own.cluster.connect(own.replica).await;
    let _: () = redis::cmd("READONLY")
        .query_async(&mut on_replica)
        .await
        .unwrap();
    let lock_key = own.holder.lock_key(&own.key).unwrap();
    let deadline = Instant::now() + SETTLE;
    while !redis::cmd("EXISTS")
        .arg(&lock_key)
        .query_async::<bool>(&mut on_replica)
        .await
        .unwrap()
    {
        assert!(
            Instant::now() < deadline,
            "the grant never reached the replica"
        );
        sleep(Duration::from_millis(20)).await;
    }

    own.cluster.kill(own.primary);
    own.cluster.takeover(own.replica).await;
    until_shard_channel(&mut on_replica, &own.channel, true).await;
    let released = Instant::now();
    let outcome = own.holder.release(&lease.lock_id).await.unwrap();
    assert!(outcome.is_released(), "the grant survived the failover");
    let guard = taken(waiter, PROMPT).await;
    println!(
        "woken {:?} after the release, after the primary died",
        released.elapsed()
    );
    guard.release().await.unwrap();
    other_guard.release().await.unwrap();
    taken(other_waiter, PROMPT).await.release().await.unwrap();
}

/// When the slot of a waited-on lock moves to another primary (with the lock), the server
/// unsubscribes the waiter's backend there, the backend subscribes on the new owner, and a
/// release there wakes the waiter long before its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_follows_its_locks_slot_to_another_primary() {
    let own = OwnCluster::start("moved").await;
    let guard = syncguard::acquire(&own.holder, &own.key, &LockOptions::default())
        .await
        .unwrap();
    let waiter = own.waiter_listening_on(own.primary).await;
    let primaries = own.cluster.primaries().await;
    let target = *primaries.iter().find(|p| **p != own.primary).unwrap();

    own.cluster.migrate_slot(own.slot, target).await;
    until_shard_channel(&mut own.cluster.connect(target).await, &own.channel, true).await;
    let guard = hand_over(guard, waiter, "after the slot moved").await;
    guard.release().await.unwrap();
}

/// An observer of a key subscribes its backend to the key's shard channel from the start; when
/// the last clone of the backend is dropped, its subscriber connection closes (the channel is
/// gone from the node), although the observer lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_backend_closes_its_shard_subscriptions() {
    let backend = RedisBackend::connect(&cluster_url()).await.unwrap();
    let key = unique("dropped");
    let channel = shard_channel(&backend, &key);
    let owners = slot_owners().await;
    let mut owner = node(&owner(&backend, &key, &owners).await).await;
    let notifier = backend
        .release_notifier()
        .expect("release notifications are on");
    let observer = notifier.subscribe(&key);
    until_shard_channel(&mut owner, &channel, true).await;

    let clone = backend.clone();
    drop(backend);
    sleep(Duration::from_millis(200)).await;
    assert!(
        has_shard_channel(&mut owner, &channel).await,
        "a clone still holds the backend"
    );
    drop(clone);
    until_shard_channel(&mut owner, &channel, false).await;
    drop(observer);
}

/// Where the server refuses sharded Pub/Sub (before Redis 7, or here an ACL without `SPUBLISH`
/// and `SSUBSCRIBE`), releases go by the classic channel and the backend listens there: a
/// waiter is still woken long before its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sharded_pub_sub_the_classic_channel_wakes_waiters() {
    let user = format!("sg-classic-{}", syncguard::LockId::generate());
    for addr in urls::redis_cluster_nodes() {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&user)
            .arg("on")
            .arg(">pw")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg("-spublish")
            .arg("-ssubscribe")
            .query_async(&mut node(&addr).await)
            .await
            .unwrap();
    }
    let url = cluster_url().replace("redis-cluster://", &format!("redis-cluster://{user}:pw@"));
    let holder = RedisBackend::connect(&url).await.unwrap();
    let waiting = RedisBackend::connect(&url).await.unwrap();
    let key = unique("classic");
    let guard = syncguard::acquire(&holder, &key, &LockOptions::default())
        .await
        .unwrap();
    let waiter = spawn_waiter(&waiting, &key, waiting_every(SLOW_POLL));
    // The waiter waits, and its backend has fallen back to the classic channel (on some node:
    // classic subscriptions are counted where they are made).
    let deadline = Instant::now() + SETTLE;
    while classic_listeners(holder.release_channel()).await == 0 {
        assert!(
            Instant::now() < deadline,
            "nobody listens on the classic channel"
        );
        sleep(Duration::from_millis(20)).await;
    }
    let guard = hand_over(guard, waiter, "by the classic channel").await;
    guard.release().await.unwrap();
    for addr in urls::redis_cluster_nodes() {
        let _: () = redis::cmd("ACL")
            .arg("DELUSER")
            .arg(&user)
            .query_async(&mut node(&addr).await)
            .await
            .unwrap();
    }
}

/// A backend on a cluster connection of the user's, given a client of one node to subscribe
/// with, subscribes to the shard channels through it: its waiter is woken by another backend's
/// release long before its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_on_a_cluster_connection_of_yours_subscribes_through_its_release_client() {
    let nodes = crate::seed_nodes();
    let yours = redis::cluster::ClusterClient::new(nodes.clone())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let node_client = redis::Client::open(nodes[nodes.len() - 1].as_str()).unwrap();
    let connection = RedisConnection::from(yours).with_release_client(node_client);
    let waiting = RedisBackend::new(connection, RedisConfig::new()).unwrap();
    let holder = RedisBackend::connect(&cluster_url()).await.unwrap();
    let key = unique("yours");
    let guard = syncguard::acquire(&holder, &key, &LockOptions::default())
        .await
        .unwrap();
    let waiter = spawn_waiter(&waiting, &key, waiting_every(SLOW_POLL));
    let owners = slot_owners().await;
    let mut owner = node(&owner(&holder, &key, &owners).await).await;
    until_shard_channel(&mut owner, &shard_channel(&holder, &key), true).await;
    let guard = hand_over(guard, waiter, "on a cluster connection of yours").await;
    guard.release().await.unwrap();
}
