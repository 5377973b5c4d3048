//! A Redis Cluster of a test's own, on free loopback ports, whose nodes the test may kill,
//! restart, pause, fail over and reshard without disturbing the shared cluster other tests use
//! (`SYNCGUARD_TEST_REDIS_CLUSTER_URL`). The binaries come from the variables
//! `bash scripts/test-all.sh` exports (`SYNCGUARD_REDIS_SERVER_BIN`, `SYNCGUARD_REDIS_CLI_BIN`).
//!
//! ```ignore
//! let cluster = RedisCluster::start(3, 1).await;
//! let slot = cluster.slot_of("lock:{orders}").await;
//! let primary = cluster.owner_of_slot(slot).await;
//! let replica = cluster.replicas_of(primary).await[0];
//! cluster.kill(primary);
//! cluster.takeover(replica).await; // the replica serves the slot; every node agrees
//! cluster.restart(primary).await; // back, as the replica of its former replica
//! ```
//!
//! Every change this type makes ends when the cluster is stable again
//! ([`RedisCluster::wait_until_stable`]); the topology queries read the first reachable node's
//! `CLUSTER NODES`. Every wait gives up with a panic naming what did not happen after
//! [`PATIENCE`].
//!
//! [`RedisCluster::start_tls`] starts one whose nodes serve clients over TLS only (no plain
//! port), announce their TLS ports, and speak TLS to each other; everything above works on it
//! the same, over TLS (it needs the `redis-tls` feature):
//!
//! ```ignore
//! let cluster = RedisCluster::start_tls(3, 0, ClusterTls::from_env()).await;
//! let url = cluster.url(); // rediss-cluster://127.0.0.1:<tls port>,...
//! ```

#![allow(dead_code, unreachable_pub)]

#[path = "cluster_migration.rs"]
mod migration;
#[path = "cluster_node.rs"]
mod node;
#[path = "processes.rs"]
mod processes;
#[path = "cluster_stability.rs"]
mod stability;
#[path = "cluster_view.rs"]
mod view;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{FromRedisValue, RedisResult};
use tokio::time::{Instant, timeout};

pub use migration::SlotMigration;
use node::{COMMAND_TIMEOUT, NodeConnections};
pub use node::{ClusterTls, Node};
use processes::{HOW_TO_RUN, env, free_ports, scratch_dir, signal, signal_quietly};
use view::ClusterView;

/// How long a node may be unreachable before the others count it as failed and one of its
/// replicas takes over by itself: short, so that failovers take seconds.
pub const NODE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long any wait here lasts at most: generous, for a loaded 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(60);
/// The slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// One redis-server process, and what starts it again.
struct Process {
    node: Node,
    bus_port: u16,
    dir: PathBuf,
    child: Option<Child>,
    paused: bool,
}

impl Process {
    /// Starts the node: serving clients on its port, or, with `tls`, on its port over TLS only.
    fn spawn(&mut self, tls: Option<&ClusterTls>) {
        let mut command = Command::new(env("SYNCGUARD_REDIS_SERVER_BIN"));
        let port = self.node.port.to_string();
        match tls {
            None => command.args(["--port", &port]),
            Some(tls) => command
                .args(["--port", "0", "--tls-port", &port])
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                // TLS on the cluster bus and for replication too; clients need no certificate.
                .args(["--tls-cluster", "yes", "--tls-replication", "yes"])
                .args(["--tls-auth-clients", "no"]),
        };
        let child = command
            .args(["--bind", "127.0.0.1"])
            // A bus port of its own: the default, port + 10000, can lie past 65535.
            .args(["--cluster-enabled", "yes", "--cluster-port"])
            .arg(self.bus_port.to_string())
            .args([
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
            ])
            .arg(NODE_TIMEOUT.as_millis().to_string())
            .arg("--dir")
            .arg(&self.dir)
            // No persistence; replicas sync at once (diskless, without the default 5 s delay).
            .args([
                "--appendonly",
                "no",
                "--save",
                "",
                "--repl-diskless-sync-delay",
                "0",
            ])
            .args(["--daemonize", "no", "--logfile", "redis.log"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server: {e}; {HOW_TO_RUN}"));
        self.child = Some(child);
        self.paused = false;
    }

    /// Running and not paused: it answers.
    fn is_reachable(&self) -> bool {
        self.child.is_some() && !self.paused
    }
}

/// A Redis Cluster (7+) of the test's own; dropping it kills every node and removes its files.
pub struct RedisCluster {
    dir: PathBuf,
    /// Locked only for moments, never across an await.
    processes: Mutex<Vec<Process>>,
    /// The primaries when it started.
    seeds: Vec<Node>,
    /// The connections [`query`](Self::query) keeps, one per node.
    connections: NodeConnections,
    /// Set when the nodes serve clients over TLS only.
    tls: Option<ClusterTls>,
}

impl RedisCluster {
    /// Starts `primaries` primaries (3 at least, as Redis Cluster requires) with
    /// `replicas_each` replicas each, created with `redis-cli --cluster create`; returns once
    /// every node serves all slots and agrees on the layout.
    pub async fn start(primaries: usize, replicas_each: usize) -> Self {
        Self::start_with(primaries, replicas_each, None).await
    }

    /// [`start`](Self::start), with nodes that serve clients over TLS only, with `tls`'s
    /// certificate (see [`ClusterTls`]); [`url`](Self::url) is then `rediss-cluster://`.
    pub async fn start_tls(primaries: usize, replicas_each: usize, tls: ClusterTls) -> Self {
        Self::start_with(primaries, replicas_each, Some(tls)).await
    }

    async fn start_with(primaries: usize, replicas_each: usize, tls: Option<ClusterTls>) -> Self {
        assert!(
            primaries >= 3,
            "a Redis Cluster needs at least 3 primaries, asked for {primaries}"
        );
        let count = primaries * (1 + replicas_each);
        let ports = free_ports(2 * count);
        let dir = scratch_dir("redis-cluster");
        let processes = (0..count)
            .map(|index| {
                let node = Node { port: ports[index] };
                let node_dir = dir.join(node.port.to_string());
                std::fs::create_dir_all(&node_dir).unwrap();
                Process {
                    node,
                    bus_port: ports[count + index],
                    dir: node_dir,
                    child: None,
                    paused: false,
                }
            })
            .collect();
        let mut cluster = Self {
            dir,
            processes: Mutex::new(processes),
            seeds: Vec::new(),
            connections: NodeConnections::new(tls.clone()),
            tls,
        };
        // Spawned once the cluster owns them: if one fails to start, dropping it kills the rest.
        for process in cluster.processes().iter_mut() {
            process.spawn(cluster.tls.as_ref());
        }
        for node in cluster.nodes() {
            cluster.wait_until_answering(node).await;
        }
        cluster.create(replicas_each).await;
        cluster
            .wait_until("the new cluster to be stable", async || {
                cluster.stability().await?;
                let view = cluster.view_from_any().await?;
                let served = view.primaries().len();
                let following = view
                    .layout(&cluster.ports())
                    .roles
                    .values()
                    .flatten()
                    .count();
                if served != primaries || following != count - primaries {
                    return Err(format!(
                        "{served} primaries serve slots and {following} replicas follow one, \
                         of {primaries} and {}",
                        count - primaries
                    ));
                }
                Ok(())
            })
            .await;
        cluster.seeds = cluster.primaries().await;
        cluster
    }

    async fn create(&self, replicas_each: usize) {
        let mut command = tokio::process::Command::new(env("SYNCGUARD_REDIS_CLI_BIN"));
        if let Some(tls) = &self.tls {
            command.args(["--tls", "--cacert"]).arg(&tls.ca);
        }
        command
            .args(["--cluster", "create"])
            .args(self.nodes().iter().map(|node| node.addr()))
            .args([
                "--cluster-replicas",
                &replicas_each.to_string(),
                "--cluster-yes",
            ])
            .kill_on_drop(true);
        // redis-cli waits for the nodes to meet without a deadline of its own.
        let output = timeout(PATIENCE, command.output())
            .await
            .unwrap_or_else(|_| panic!("redis-cli --cluster create took over {PATIENCE:?}"))
            .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}; {HOW_TO_RUN}"));
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed (logs in {}): {}{}",
            self.dir.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// `redis-cluster://` (`rediss-cluster://` for a TLS cluster) and the primaries, as
    /// seeds, when it started.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.seeds.iter().map(|node| node.addr()).collect();
        let scheme = match self.tls {
            None => "redis-cluster",
            Some(_) => "rediss-cluster",
        };
        format!("{scheme}://{}", seeds.join(","))
    }

    /// What the nodes serve with, for a TLS cluster.
    pub fn tls(&self) -> Option<&ClusterTls> {
        self.tls.as_ref()
    }

    /// Every node, whatever its role or state, in the order they started.
    pub fn nodes(&self) -> Vec<Node> {
        self.processes()
            .iter()
            .map(|process| process.node)
            .collect()
    }

    /// The primaries serving slots now (one that was killed and not yet replaced included).
    pub async fn primaries(&self) -> Vec<Node> {
        let view = self.current_view().await;
        view.primaries()
            .into_iter()
            .map(|port| Node { port })
            .collect()
    }

    /// The replicas following `node` now.
    pub async fn replicas_of(&self, node: Node) -> Vec<Node> {
        let view = self.current_view().await;
        let replicas = view.replicas_of(node.port);
        replicas.into_iter().map(|port| Node { port }).collect()
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub async fn slot_of(&self, key: &str) -> u16 {
        let node = *self.reachable().first().expect("no node is reachable");
        self.query(node, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .await
            .unwrap_or_else(|e| panic!("CLUSTER KEYSLOT on {node}: {e}"))
    }

    /// The primary serving `slot` now.
    pub async fn owner_of_slot(&self, slot: u16) -> Node {
        let view = self.current_view().await;
        let port = view
            .owner_of(slot)
            .unwrap_or_else(|| panic!("no node serves slot {slot}: {view:?}"));
        Node { port }
    }

    /// A connection to one node (no redirections followed): over TLS for a TLS cluster.
    pub async fn connect(&self, node: Node) -> MultiplexedConnection {
        (self.connections.open(node).await).unwrap_or_else(|e| panic!("connect to {node}: {e}"))
    }

    /// A manual failover (`CLUSTER FAILOVER` on `replica`, which waits until it has all its
    /// primary's writes): returns when `replica` is a primary and every node agrees.
    pub async fn failover(&self, replica: Node) {
        self.promote(replica, None).await;
    }

    /// `CLUSTER FAILOVER TAKEOVER` on `replica`, for when its primary is dead (or cut off): the
    /// replica takes the slots without its primary or the other primaries agreeing. Returns
    /// when `replica` is a primary and every reachable node agrees; if it already became one
    /// by itself (the others failed its primary over after [`NODE_TIMEOUT`]), only waits.
    pub async fn takeover(&self, replica: Node) {
        self.promote(replica, Some("TAKEOVER")).await;
    }

    async fn promote(&self, replica: Node, how: Option<&str>) {
        let own = self
            .view_of(replica)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let me = own.myself();
        let promoted_already = how.is_some() && me.is_primary() && !me.slots.is_empty();
        assert!(
            promoted_already || me.primary.is_some(),
            "{replica} is not a replica: {}",
            me.flags.join(",")
        );
        let mut asked = None;
        self.wait_until(&format!("{replica} to become a primary"), async || {
            // A manual failover the primary did not finish within its 5 s is given up: ask again.
            let now = self.view_of(replica).await?;
            if !now.myself().is_primary()
                && asked.is_none_or(|at: Instant| at.elapsed() > COMMAND_TIMEOUT)
            {
                let mut command = redis::cmd("CLUSTER");
                command.arg("FAILOVER").arg(how);
                self.query::<()>(replica, &command)
                    .await
                    .map_err(|e| format!("CLUSTER FAILOVER on {replica}: {e}"))?;
                asked = Some(Instant::now());
            }
            let now = self.view_of(replica).await?;
            if !now.myself().is_primary() || now.myself().slots.is_empty() {
                return Err(format!(
                    "{replica} is still {}",
                    now.myself().flags.join(",")
                ));
            }
            self.stability().await
        })
        .await;
    }

    /// SIGKILL: no shutdown, no goodbye to the other nodes.
    pub fn kill(&self, node: Node) {
        let mut processes = self.processes();
        let process = find(&mut processes, node);
        let mut child = process
            .child
            .take()
            .unwrap_or_else(|| panic!("{node} is not running"));
        child.kill().expect("kill -9 redis-server");
        child.wait().expect("reap redis-server");
        process.paused = false;
        drop(processes);
        self.connections.forget(node);
    }

    /// Starts a killed node again on its port, directory and cluster configuration; returns
    /// when it has rejoined (every node sees it, agrees with it, and a replica's link is up).
    pub async fn restart(&self, node: Node) {
        {
            let mut processes = self.processes();
            let process = find(&mut processes, node);
            assert!(process.child.is_none(), "{node} is running: kill it first");
            process.spawn(self.tls.as_ref());
        }
        self.wait_until_answering(node).await;
        self.wait_until_stable().await;
    }

    /// SIGSTOP: the node keeps its connections and answers nothing until [`resume`](Self::resume).
    pub fn pause(&self, node: Node) {
        self.stop_or_continue(node, "STOP");
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self, node: Node) {
        self.stop_or_continue(node, "CONT");
    }

    fn stop_or_continue(&self, node: Node, how: &str) {
        let mut processes = self.processes();
        let process = find(&mut processes, node);
        let child = (process.child.as_ref()).unwrap_or_else(|| panic!("{node} is not running"));
        signal(child.id(), how);
        process.paused = how == "STOP";
    }

    /// Moves `slot` and its keys to the primary `to`, the documented way (see [`SlotMigration`]).
    pub async fn migrate_slot(&self, slot: u16, to: Node) {
        self.begin_migration(slot, to).await.finish().await;
    }

    /// Starts moving `slot` to the primary `to` and leaves it half-way: MIGRATING on its owner,
    /// IMPORTING on `to`, no key moved yet.
    pub async fn begin_migration(&self, slot: u16, to: Node) -> SlotMigration<'_> {
        SlotMigration::begin(self, slot, to).await
    }

    /// One command to one node, within [`COMMAND_TIMEOUT`].
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        node: Node,
        command: &redis::Cmd,
    ) -> RedisResult<T> {
        self.connections.query(node, command).await
    }

    /// The cluster as `node` sees it.
    pub(crate) async fn view_of(&self, node: Node) -> Result<ClusterView, String> {
        let text: String = self
            .query(node, redis::cmd("CLUSTER").arg("NODES"))
            .await
            .map_err(|e| format!("CLUSTER NODES on {node}: {e}"))?;
        ClusterView::parse(&text)
    }

    async fn view_from_any(&self) -> Result<ClusterView, String> {
        let node = *self.reachable().first().ok_or("no node is reachable")?;
        self.view_of(node).await
    }

    async fn current_view(&self) -> ClusterView {
        self.view_from_any().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// The nodes that run and are not paused.
    pub fn reachable(&self) -> Vec<Node> {
        (self.processes().iter())
            .filter(|process| process.is_reachable())
            .map(|process| process.node)
            .collect()
    }

    fn ports(&self) -> Vec<u16> {
        self.nodes().iter().map(|node| node.port).collect()
    }

    fn processes(&self) -> MutexGuard<'_, Vec<Process>> {
        self.processes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn find(processes: &mut [Process], node: Node) -> &mut Process {
    processes
        .iter_mut()
        .find(|process| process.node == node)
        .unwrap_or_else(|| panic!("{node} is no node of this cluster"))
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for process in self.processes().iter_mut() {
            if let Some(mut child) = process.child.take() {
                // A stopped process dies of SIGKILL too, but CONT first spares it a stopped zombie.
                let _ = signal_quietly(child.id(), "CONT");
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
