//! The clusters the other modules run on, checked against real redis-server processes with
//! raw commands only: a private cluster of `support/cluster.rs` through every change it
//! offers (one cluster, the changes in turn: each costs seconds), and the shared cluster of
//! `scripts/services.sh`.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{ErrorKind, RedisError, ServerErrorKind};
use tokio::time::{Instant, sleep, timeout};

use crate::cluster::{Node, PATIENCE, RedisCluster};
use crate::urls::{redis_cluster_nodes, redis_cluster_url};

/// Prints how long each change took: run with `--nocapture` to see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_cluster_fails_over_restarts_reshards_and_pauses() {
    let cluster = timed("start (3 primaries, 3 replicas)", RedisCluster::start(3, 1)).await;
    timed(
        "roles",
        comes_up_with_three_primaries_each_with_a_replica(&cluster),
    )
    .await;
    timed("failover", a_failover_keeps_what_was_written(&cluster)).await;
    timed(
        "kill, takeover, restart",
        a_takeover_after_a_kill_serves_again_and_the_killed_node_rejoins(&cluster),
    )
    .await;
    timed(
        "migrate_slot",
        migrate_slot_moves_the_slot_and_its_keys(&cluster),
    )
    .await;
    timed(
        "half-migrated slot",
        a_half_migrated_slot_answers_ask_for_moved_keys(&cluster),
    )
    .await;
    timed(
        "pause past the node timeout, resume",
        a_paused_primary_is_replaced_and_rejoins_as_a_replica(&cluster),
    )
    .await;
}

#[tokio::test]
#[should_panic(expected = "at least 3 primaries")]
async fn a_cluster_of_fewer_than_three_primaries_is_refused_before_anything_starts() {
    RedisCluster::start(2, 1).await;
}

#[tokio::test]
async fn the_shared_cluster_is_ok_and_seeded_with_its_primaries() {
    let nodes = redis_cluster_nodes();
    assert_eq!(
        nodes.len(),
        6,
        "SYNCGUARD_TEST_REDIS_CLUSTER_NODES: {nodes:?}"
    );
    for node in &nodes {
        let info = cluster_info(&mut raw(node).await).await;
        for line in [
            "cluster_state:ok",
            "cluster_known_nodes:6",
            "cluster_size:3",
        ] {
            assert!(info.contains(line), "{node} lacks {line}: {info}");
        }
    }
    let url = redis_cluster_url();
    let seeds: Vec<&str> = url
        .strip_prefix("redis-cluster://")
        .unwrap_or_else(|| {
            panic!("SYNCGUARD_TEST_REDIS_CLUSTER_URL is no redis-cluster:// URL: {url}")
        })
        .split(',')
        .collect();
    assert_eq!(seeds.len(), 3, "{url}");
    for seed in seeds {
        assert!(
            nodes.iter().any(|node| node == seed),
            "{seed} is not among {nodes:?}"
        );
        let replication = info_replication(&mut raw(seed).await).await;
        assert!(
            replication.contains("role:master"),
            "the seed {seed} is no primary: {replication}"
        );
    }
}

async fn comes_up_with_three_primaries_each_with_a_replica(cluster: &RedisCluster) {
    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), 6);
    let primaries = cluster.primaries().await;
    assert_eq!(primaries.len(), 3, "{primaries:?}");
    let mut seen = primaries.clone();
    for &primary in &primaries {
        let replicas = cluster.replicas_of(primary).await;
        assert_eq!(replicas.len(), 1, "the replicas of {primary}: {replicas:?}");
        seen.extend(replicas);
    }
    seen.sort_unstable();
    let mut all = nodes.clone();
    all.sort_unstable();
    assert_eq!(seen, all, "every node is a primary or follows one");
    let addrs: Vec<String> = primaries.iter().map(|node| node.addr()).collect();
    assert_eq!(
        cluster.url(),
        format!("redis-cluster://{}", addrs.join(","))
    );
    for node in nodes {
        let info = cluster_info(&mut cluster.connect(node).await).await;
        assert!(info.contains("cluster_state:ok"), "{node}: {info}");
        assert!(info.contains("cluster_known_nodes:6"), "{node}: {info}");
    }
}

async fn a_failover_keeps_what_was_written(cluster: &RedisCluster) {
    let key = "check:{failover}";
    let (primary, slot) = write(cluster, key, "before").await;
    let replica = cluster.replicas_of(primary).await[0];
    cluster.failover(replica).await;
    every_node_agrees(cluster, slot, replica).await;
    assert_eq!(cluster.owner_of_slot(slot).await, replica);
    assert_eq!(
        read(cluster, replica, key).await.unwrap(),
        Some("before".to_owned())
    );
    assert_eq!(
        cluster.replicas_of(replica).await,
        [primary],
        "the old primary follows"
    );
    let moved = read(cluster, primary, key).await.unwrap_err();
    assert_redirected(&moved, ServerErrorKind::Moved, slot, replica);
}

async fn a_takeover_after_a_kill_serves_again_and_the_killed_node_rejoins(cluster: &RedisCluster) {
    let key = "check:{takeover}";
    let (primary, slot) = write(cluster, key, "before").await;
    let replica = cluster.replicas_of(primary).await[0];
    cluster.kill(primary);
    cluster.takeover(replica).await;
    every_node_agrees(cluster, slot, replica).await;
    assert_eq!(cluster.owner_of_slot(slot).await, replica);
    assert!(!cluster.primaries().await.contains(&primary));
    assert_eq!(
        read(cluster, replica, key).await.unwrap(),
        Some("before".to_owned())
    );
    // No replica is left to acknowledge it: a plain SET.
    let () = redis::cmd("SET")
        .arg(key)
        .arg("after")
        .query_async(&mut cluster.connect(replica).await)
        .await
        .unwrap();
    for node in cluster.reachable() {
        let info = cluster_info(&mut cluster.connect(node).await).await;
        assert!(
            info.contains("cluster_state:ok"),
            "{node} after the takeover: {info}"
        );
    }

    // Down long enough for every other node to count it as failed, as after a real crash.
    let deadline = Instant::now() + PATIENCE;
    for node in cluster.reachable() {
        while !flags_of(cluster, node, primary)
            .await
            .split(',')
            .any(|flag| flag == "fail")
        {
            assert!(
                Instant::now() < deadline,
                "{node} never counted the killed {primary} as failed"
            );
            sleep(Duration::from_millis(100)).await;
        }
    }
    cluster.restart(primary).await;
    every_node_agrees(cluster, slot, replica).await;
    for node in cluster.reachable() {
        let flags = flags_of(cluster, node, primary).await;
        assert!(
            !flags.contains("fail"),
            "{node} still sees {primary} as {flags}"
        );
    }
    assert_eq!(
        cluster.replicas_of(replica).await,
        [primary],
        "the killed node follows"
    );
    assert_eq!(
        read_after(cluster, primary, "READONLY", key)
            .await
            .as_deref(),
        Some("after"),
        "the rejoined replica has the new value"
    );
}

async fn migrate_slot_moves_the_slot_and_its_keys(cluster: &RedisCluster) {
    let key = "check:{migrate}";
    let (source, slot) = write(cluster, key, "moving").await;
    let target = another_primary(cluster, source).await;
    cluster.migrate_slot(slot, target).await;
    every_node_agrees(cluster, slot, target).await;
    assert_eq!(cluster.owner_of_slot(slot).await, target);
    assert_eq!(
        read(cluster, target, key).await.unwrap(),
        Some("moving".to_owned())
    );
    let moved = read(cluster, source, key).await.unwrap_err();
    assert_redirected(&moved, ServerErrorKind::Moved, slot, target);
}

async fn a_half_migrated_slot_answers_ask_for_moved_keys(cluster: &RedisCluster) {
    let (moved, left) = ("check:{half}:moved", "check:{half}:left");
    let (source, slot) = write(cluster, moved, "moved").await;
    write(cluster, left, "left").await;
    let target = another_primary(cluster, source).await;
    let migration = cluster.begin_migration(slot, target).await;
    assert_eq!((migration.source(), migration.target()), (source, target));
    migration.move_key(moved).await;

    let asked = read(cluster, source, moved).await.unwrap_err();
    assert_redirected(&asked, ServerErrorKind::Ask, slot, target);
    assert_eq!(
        read(cluster, source, left).await.unwrap(),
        Some("left".to_owned())
    );
    let unasked = read(cluster, target, moved).await.unwrap_err();
    assert_redirected(&unasked, ServerErrorKind::Moved, slot, source);
    assert_eq!(
        read_after(cluster, target, "ASKING", moved)
            .await
            .as_deref(),
        Some("moved"),
        "the target answers after ASKING"
    );

    migration.finish().await;
    every_node_agrees(cluster, slot, target).await;
    assert_eq!(cluster.owner_of_slot(slot).await, target);
    for (key, value) in [(moved, "moved"), (left, "left")] {
        assert_eq!(
            read(cluster, target, key).await.unwrap().as_deref(),
            Some(value)
        );
        let error = read(cluster, source, key).await.unwrap_err();
        assert_redirected(&error, ServerErrorKind::Moved, slot, target);
    }
}

async fn a_paused_primary_is_replaced_and_rejoins_as_a_replica(cluster: &RedisCluster) {
    let (primary, slot) = write(cluster, "check:{pause}", "before").await;
    let replica = cluster.replicas_of(primary).await[0];
    let mut connection = cluster.connect(primary).await;
    cluster.pause(primary);
    let unanswered = timeout(
        Duration::from_secs(1),
        redis::cmd("PING").query_async::<String>(&mut connection),
    )
    .await;
    assert!(
        unanswered.is_err(),
        "a paused node answered: {unanswered:?}"
    );

    // The others count it as failed after the node timeout, and its replica takes over.
    let deadline = Instant::now() + PATIENCE;
    while cluster.owner_of_slot(slot).await != replica {
        assert!(
            Instant::now() < deadline,
            "{replica} did not replace the paused {primary}"
        );
        sleep(Duration::from_millis(100)).await;
    }
    // Promoted already: a takeover only waits for the others to agree.
    cluster.takeover(replica).await;
    every_node_agrees(cluster, slot, replica).await;
    cluster.resume(primary);
    cluster.wait_until_stable().await;
    every_node_agrees(cluster, slot, replica).await;
    assert_eq!(cluster.replicas_of(replica).await, [primary]);
    let pong: String = redis::cmd("PING")
        .query_async(&mut cluster.connect(primary).await)
        .await
        .unwrap();
    assert_eq!(pong, "PONG");
}

async fn timed<T>(what: &str, step: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let output = step.await;
    println!("{what}: {:.1?}", started.elapsed());
    output
}

/// Writes `key` on the primary serving it, and waits until a replica has it too; returns that
/// primary and the key's slot.
async fn write(cluster: &RedisCluster, key: &str, value: &str) -> (Node, u16) {
    let slot = cluster.slot_of(key).await;
    let primary = cluster.owner_of_slot(slot).await;
    let mut connection = cluster.connect(primary).await;
    let () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(&mut connection)
        .await
        .unwrap_or_else(|e| panic!("SET {key} on {primary}: {e}"));
    let acknowledged: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(PATIENCE.as_millis() as u64)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(
        acknowledged, 1,
        "no replica of {primary} acknowledged {key}"
    );
    (primary, slot)
}

async fn read(cluster: &RedisCluster, node: Node, key: &str) -> Result<Option<String>, RedisError> {
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut cluster.connect(node).await)
        .await
}

/// What the cluster's changes promise when they return, checked on every reachable node with
/// raw commands: it serves all slots, sees `owner` serve `slot`, and as a replica has its link
/// to its primary up.
async fn every_node_agrees(cluster: &RedisCluster, slot: u16, owner: Node) {
    for node in cluster.reachable() {
        let mut connection = cluster.connect(node).await;
        let info = cluster_info(&mut connection).await;
        assert!(info.contains("cluster_state:ok"), "{node}: {info}");
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut connection)
            .await
            .unwrap();
        let serving = nodes.lines().find(|line| {
            line.split(' ').skip(8).any(|range| {
                let (first, last) = range.split_once('-').unwrap_or((range, range));
                let inside = first.parse().is_ok_and(|first: u16| first <= slot)
                    && last.parse().is_ok_and(|last: u16| slot <= last);
                !range.starts_with('[') && inside
            })
        });
        let address = format!(" {}@", owner.addr());
        assert!(
            serving.is_some_and(|line| line.contains(&address)),
            "{node} does not see {owner} serve slot {slot}: {nodes}"
        );
        let replication = info_replication(&mut connection).await;
        assert!(
            replication.contains("role:master") || replication.contains("master_link_status:up"),
            "{node}: {replication}"
        );
    }
}

/// The flags `viewer` gives `node` in its `CLUSTER NODES` (`master`, `slave`, `fail?`, ...).
async fn flags_of(cluster: &RedisCluster, viewer: Node, node: Node) -> String {
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut cluster.connect(viewer).await)
        .await
        .unwrap();
    let address = format!("{}@", node.addr());
    let line = nodes
        .lines()
        .find(|line| {
            line.split(' ')
                .nth(1)
                .is_some_and(|at| at.starts_with(&address))
        })
        .unwrap_or_else(|| panic!("{viewer} does not know {node}: {nodes}"));
    line.split(' ').nth(2).unwrap_or_default().to_owned()
}

/// GET `key` on `node` right after `first` on the same connection: READONLY (a replica
/// answers reads), ASKING (a slot's importing node answers for a key it has).
async fn read_after(cluster: &RedisCluster, node: Node, first: &str, key: &str) -> Option<String> {
    let (_, value): ((), Option<String>) = redis::pipe()
        .cmd(first)
        .cmd("GET")
        .arg(key)
        .query_async(&mut cluster.connect(node).await)
        .await
        .unwrap_or_else(|e| panic!("{first}, GET {key} on {node}: {e}"));
    value
}

/// `error` is a MOVED or ASK (`kind`) that sends a client with a key of `slot` to `to`.
fn assert_redirected(error: &RedisError, kind: ServerErrorKind, slot: u16, to: Node) {
    assert_eq!(error.kind(), ErrorKind::Server(kind), "{error}");
    let to = to.addr();
    assert_eq!(error.redirect_node(), Some((to.as_str(), slot)), "{error}");
}

async fn another_primary(cluster: &RedisCluster, than: Node) -> Node {
    let primaries = cluster.primaries().await;
    *primaries
        .iter()
        .find(|&&primary| primary != than)
        .unwrap_or_else(|| panic!("no primary besides {than}: {primaries:?}"))
}

async fn raw(addr: &str) -> MultiplexedConnection {
    redis::Client::open(format!("redis://{addr}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

async fn cluster_info(connection: &mut MultiplexedConnection) -> String {
    redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async(connection)
        .await
        .unwrap()
}

async fn info_replication(connection: &mut MultiplexedConnection) -> String {
    redis::cmd("INFO")
        .arg("replication")
        .query_async(connection)
        .await
        .unwrap()
}
