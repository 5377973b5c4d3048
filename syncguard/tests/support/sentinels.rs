//! A Sentinel group of a test's own, to fail over: a primary, its replica and three Sentinels
//! on free loopback ports (quorum 2, a primary down after 2 s: with 1 s, a primary just
//! promoted and busy on a 2-core machine was taken for down in turn, and failed over back to
//! the restarted old one). The servers come from `SYNCGUARD_REDIS_SERVER_BIN`; a Sentinel is
//! `redis-server <conf> --sentinel`.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::time::{Instant, sleep};

#[path = "servers.rs"]
mod servers;

pub use servers::RedisServer;
use servers::{HOW_TO_RUN, env, free_port, scratch_dir};

/// The name the Sentinels monitor the primary by.
pub const MASTER_NAME: &str = "group";

pub struct SentinelGroup {
    /// The two data servers; which one is the primary changes with each failover.
    servers: [RedisServer; 2],
    sentinels: Vec<(Child, u16, PathBuf)>,
}

impl SentinelGroup {
    /// Starts the group and waits until every Sentinel names the primary, sees the replica and
    /// knows the other Sentinels (a failover needs them to agree).
    pub async fn start() -> Self {
        let primary = RedisServer::start("everysec").await;
        let replica = RedisServer::start_replica_of(&primary).await;
        let primary_port = primary.port();
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let dir = scratch_dir("sentinel");
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\nlogfile sentinel.log\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 2000\n\
                     sentinel failover-timeout {MASTER_NAME} 5000\n",
                    dir.display()
                ),
            )
            .unwrap();
            let child = Command::new(env("SYNCGUARD_REDIS_SERVER_BIN"))
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start a Sentinel: {e}; {HOW_TO_RUN}"));
            sentinels.push((child, port, dir));
        }
        let group = Self {
            servers: [primary, replica],
            sentinels,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        for (_, port, _) in &group.sentinels {
            loop {
                if group.sentinel_ready(*port, primary_port).await {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "Sentinel {port} did not get ready"
                );
                sleep(Duration::from_millis(100)).await;
            }
        }
        group
    }

    /// `redis+sentinel://` with every Sentinel.
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self
            .sentinels
            .iter()
            .map(|(_, port, _)| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", addrs.join(","))
    }

    async fn sentinel(&self, port: u16) -> Option<MultiplexedConnection> {
        redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .ok()?
            .get_multiplexed_async_connection()
            .await
            .ok()
    }

    async fn sentinel_ready(&self, port: u16, primary_port: u16) -> bool {
        let Some(mut conn) = self.sentinel(port).await else {
            return false;
        };
        let named: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER_NAME)
            .query_async(&mut conn)
            .await
            .ok()
            .flatten();
        let master: Vec<String> = redis::cmd("SENTINEL")
            .arg("master")
            .arg(MASTER_NAME)
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        let field = |name: &str| {
            master
                .iter()
                .position(|f| f == name)
                .and_then(|i| master.get(i + 1))
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        };
        named.is_some_and(|(_, port)| port == primary_port.to_string())
            && field("num-slaves") >= 1
            && field("num-other-sentinels") >= 2
    }

    /// The port of the primary the first answering Sentinel names.
    pub async fn primary_port(&self) -> u16 {
        for (_, port, _) in &self.sentinels {
            if let Some(mut conn) = self.sentinel(*port).await
                && let Ok(Some((_, primary))) = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(MASTER_NAME)
                    .query_async::<Option<(String, String)>>(&mut conn)
                    .await
            {
                return primary.parse().unwrap();
            }
        }
        panic!("no Sentinel answered")
    }

    /// The data server on `port`.
    pub fn server(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|server| server.port() == port)
            .unwrap_or_else(|| panic!("no server of the group on port {port}"))
    }

    /// The port of the data server that is not on `port`.
    pub fn other_than(&self, port: u16) -> u16 {
        self.servers
            .iter()
            .map(RedisServer::port)
            .find(|other| *other != port)
            .unwrap()
    }

    /// A planned failover (`SENTINEL FAILOVER`), once it is done: the replica is the primary,
    /// says so itself, and every Sentinel names it.
    pub async fn failover(&self) -> u16 {
        let before = self.primary_port().await;
        let mut conn = self
            .sentinel(self.sentinels[0].1)
            .await
            .expect("a Sentinel");
        let _: () = redis::cmd("SENTINEL")
            .arg("failover")
            .arg(MASTER_NAME)
            .query_async(&mut conn)
            .await
            .expect("SENTINEL FAILOVER");
        self.wait_for_primary(self.other_than(before), Duration::from_secs(30))
            .await
    }

    /// Waits until every Sentinel names the server on `port` and it says it is the primary.
    pub async fn wait_for_primary(&self, port: u16, within: Duration) -> u16 {
        let deadline = Instant::now() + within;
        loop {
            let mut named = 0;
            for (_, sentinel, _) in &self.sentinels {
                if let Some(mut conn) = self.sentinel(*sentinel).await
                    && let Ok(Some((_, primary))) = redis::cmd("SENTINEL")
                        .arg("get-master-addr-by-name")
                        .arg(MASTER_NAME)
                        .query_async::<Option<(String, String)>>(&mut conn)
                        .await
                    && primary == port.to_string()
                {
                    named += 1;
                }
            }
            if named == self.sentinels.len() && is_primary(port).await {
                return port;
            }
            assert!(
                Instant::now() < deadline,
                "the server on {port} did not become the primary within {within:?}"
            );
            sleep(Duration::from_millis(100)).await;
        }
    }
}

impl SentinelGroup {
    /// Waits until the group is whole again with the primary on `primary`: every Sentinel
    /// names it and sees its replica, and the replica's link is up.
    pub async fn wait_until_whole(&self, primary: u16) {
        self.wait_for_primary(primary, Duration::from_secs(60))
            .await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut ready = linked(self.other_than(primary)).await;
            for (_, port, _) in &self.sentinels {
                ready = ready && self.sentinel_ready(*port, primary).await;
            }
            if ready {
                return;
            }
            if Instant::now() >= deadline {
                let mut report = String::new();
                for server in &self.servers {
                    let port = server.port();
                    report += &format!("\n{port}: {}", replication(port).await);
                }
                for (_, port, dir) in &self.sentinels {
                    let log = std::fs::read_to_string(dir.join("sentinel.log")).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(40).collect();
                    report += &format!("\nSentinel {port}, last lines:\n");
                    for line in tail.into_iter().rev() {
                        report += line;
                        report.push('\n');
                    }
                }
                panic!("the group did not become whole with the primary on {primary}:{report}");
            }
            sleep(Duration::from_millis(100)).await;
        }
    }
}

impl SentinelGroup {
    /// Points the replica on `replica` at `upstream` (a proxy to its primary, say) with
    /// `REPLICAOF`, and waits until its link is up (a partial resync: the same primary). The
    /// Sentinels set it back to the primary's own address only `failover-timeout` (5 s) after
    /// such a change.
    pub async fn replicate_through(&self, replica: u16, upstream: std::net::SocketAddr) {
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{replica}"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the replica");
        let _: () = redis::cmd("REPLICAOF")
            .arg(upstream.ip().to_string())
            .arg(upstream.port())
            .query_async(&mut conn)
            .await
            .expect("REPLICAOF");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info = replication(replica).await;
            if info.contains("master_link_status:up")
                && info.contains(&format!("master_port:{}", upstream.port()))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replica's link through {upstream} did not come up: {info}"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Whether the server on `port` is a replica whose link to its primary is up.
async fn linked(port: u16) -> bool {
    replication(port).await.contains("master_link_status:up")
}

/// `INFO replication` of the server on `port`, or why there is none.
async fn replication(port: u16) -> String {
    let conn = match redis::Client::open(format!("redis://127.0.0.1:{port}")) {
        Ok(client) => client.get_multiplexed_async_connection().await,
        Err(error) => Err(error),
    };
    let info = match conn {
        Ok(mut conn) => {
            redis::cmd("INFO")
                .arg("replication")
                .query_async::<String>(&mut conn)
                .await
        }
        Err(error) => Err(error),
    };
    info.unwrap_or_else(|error| format!("unreachable: {error}"))
}

/// Whether the server on `port` says it is a primary (`ROLE`).
pub async fn is_primary(port: u16) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) else {
        return false;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return false;
    };
    let role: Result<Vec<redis::Value>, _> = redis::cmd("ROLE").query_async(&mut conn).await;
    matches!(role.as_deref(), Ok([redis::Value::BulkString(role), ..]) if role == b"master")
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        for (child, _, dir) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
