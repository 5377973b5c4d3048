//! The fault suite's workload and history checker on a Redis Cluster of the test's own: two
//! backend instances with eight workers each contend for one key while the primary serving
//! that key is failed over (`CLUSTER FAILOVER`), killed (`kill -9`, its replica taking over,
//! then restarted), paused past the ttl (`SIGSTOP`, long enough for the cluster to fail it
//! over), and while the key's slot migrates to another primary.
//!
//! Checked for every scenario: no two holders at once, fences increasing in the order holders
//! acted and never repeated, every backend call within its timeouts, nothing panicked, and a
//! fresh acquire and release succeed on each instance after the fault. The figures (holds,
//! losses, time to notice a loss, recovery) are printed: run with `--nocapture`.
//!
//! Replication is asynchronous: a grant that a dying primary never sent its replica is lost
//! with it, and a second holder may then get the lock (and the lost grant's fence). On
//! loopback a replica is microseconds behind, so these scenarios see none; across hosts the
//! window is a network round trip (see the module documentation of `syncguard::redis`).

use std::sync::Arc;
use std::time::Duration;

use syncguard::redis::{RedisBackend, RedisConfig};
use tokio::time::sleep;

use crate::cluster::{Node, RedisCluster};
use crate::timed::{CallTimes, timed};
use crate::workload::{self, TTL, count_panics, report};

/// The fail-fast timeouts every instance runs with.
const TIMEOUT: Duration = Duration::from_millis(500);
/// Slack on a loaded machine beyond the timeouts' sum.
const MARGIN: Duration = Duration::from_millis(1500);

/// The primary that serves `key`'s lock now, and one of its replicas.
async fn primary_and_replica(
    cluster: &RedisCluster,
    backend: &RedisBackend,
    key: &str,
) -> (Node, Node) {
    let lock_key = backend.lock_key(key).unwrap();
    let primary = cluster
        .owner_of_slot(cluster.slot_of(&lock_key).await)
        .await;
    let replica = *cluster
        .replicas_of(primary)
        .await
        .first()
        .unwrap_or_else(|| panic!("{primary} has no replica"));
    (primary, replica)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_keeps_one_holder_through_failovers_migrations_and_pauses() {
    count_panics();
    let cluster = RedisCluster::start(3, 1).await;
    let times = Arc::new(CallTimes::default());
    let config = RedisConfig::new()
        .with_operation_timeout(TIMEOUT)
        .with_connect_timeout(TIMEOUT);
    let mut instances = Vec::new();
    let mut backends = Vec::new();
    for _ in 0..2 {
        let backend = RedisBackend::connect_with(&cluster.url(), config.clone())
            .await
            .expect("connect to the test's cluster");
        instances.push(timed(backend.clone(), &times));
        backends.push(backend);
    }
    let backend = &backends[0];
    let key_of = |scenario: &str| syncguard::conformance::unique_key(scenario);
    let mut figures = Vec::new();

    let key = key_of("cluster-failover");
    figures.push(
        workload::run_on_key(
            "cluster: CLUSTER FAILOVER of the key's primary",
            key.clone(),
            &instances,
            async {
                let (_, replica) = primary_and_replica(&cluster, backend, &key).await;
                cluster.failover(replica).await;
            },
        )
        .await,
    );

    let key = key_of("cluster-kill");
    figures.push(
        workload::run_on_key(
            "cluster: kill -9 of the key's primary, its replica taking over",
            key.clone(),
            &instances,
            async {
                let (primary, replica) = primary_and_replica(&cluster, backend, &key).await;
                cluster.kill(primary);
                // Promoted by the other primaries after the node timeout (or forced).
                cluster.takeover(replica).await;
                cluster.restart(primary).await;
            },
        )
        .await,
    );

    let key = key_of("cluster-migrate");
    figures.push(
        workload::run_on_key(
            "cluster: the key's slot migrates to another primary",
            key.clone(),
            &instances,
            async {
                let (primary, _) = primary_and_replica(&cluster, backend, &key).await;
                let lock_key = backend.lock_key(&key).unwrap();
                let slot = cluster.slot_of(&lock_key).await;
                let target = cluster
                    .primaries()
                    .await
                    .into_iter()
                    .find(|node| *node != primary)
                    .expect("another primary");
                // Half-way first (the lock key moved, the slot not yet: ASK), then done.
                let migration = cluster.begin_migration(slot, target).await;
                migration.move_keys(1).await;
                sleep(Duration::from_millis(500)).await;
                migration.finish().await;
            },
        )
        .await,
    );

    let key = key_of("cluster-pause");
    figures.push(
        workload::run_on_key(
            "cluster: SIGSTOP of the key's primary past the ttl and the node timeout",
            key.clone(),
            &instances,
            async {
                let (primary, replica) = primary_and_replica(&cluster, backend, &key).await;
                cluster.pause(primary);
                sleep(TTL + Duration::from_millis(2500)).await;
                cluster.resume(primary);
                // Failed over meanwhile, or not: either way the cluster settles.
                cluster.takeover(replica).await;
            },
        )
        .await,
    );
    // A call's own timeout, plus the workload's retry of a refused acquire.
    report(&figures, &times, TIMEOUT * 4 + MARGIN);
}
