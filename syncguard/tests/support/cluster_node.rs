//! A node of a test's Redis Cluster, the connections kept to each, and the files of a cluster
//! whose nodes serve clients over TLS only.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, FromRedisValue, RedisResult};

/// How long one command to one node may take.
pub(super) const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// A node of a [`RedisCluster`](super::RedisCluster), named by its port on 127.0.0.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Node {
    pub(super) port: u16,
}

impl Node {
    pub fn port(self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`, as MOVED and ASK redirections name it.
    pub fn addr(self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:<port>`: this node alone.
    pub fn url(self) -> String {
        format!("redis://{}", self.addr())
    }

    /// A plain connection to this node alone, within [`COMMAND_TIMEOUT`] (a node of a TLS
    /// cluster has no plain port: see [`RedisCluster::connect`](super::RedisCluster::connect)).
    pub async fn connect(self) -> RedisResult<MultiplexedConnection> {
        self.connect_over(None).await
    }

    /// A connection to this node alone, within [`COMMAND_TIMEOUT`]: over TLS, trusting the CA
    /// of `tls`, when given.
    pub(super) async fn connect_over(
        self,
        tls: Option<&ClusterTls>,
    ) -> RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(COMMAND_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT));
        let client = match tls {
            None => redis::Client::open(self.url())?,
            Some(tls) => tls.client(self)?,
        };
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }
}

/// What the nodes of a TLS cluster serve with: they listen for clients on their TLS port only
/// (`--port 0`), and speak TLS to each other on the cluster bus and for replication.
#[derive(Debug, Clone)]
pub struct ClusterTls {
    /// The PEM certificate each node presents (for 127.0.0.1).
    pub cert: PathBuf,
    /// Its PEM private key.
    pub key: PathBuf,
    /// The PEM certificate of the CA that signed `cert`, which the nodes, `redis-cli` and the
    /// support's own connections trust.
    pub ca: PathBuf,
}

impl ClusterTls {
    /// The test CA and its certificate for 127.0.0.1 that `scripts/services.sh` makes
    /// (`SYNCGUARD_TEST_TLS_CA`, `SYNCGUARD_TEST_TLS_CERT`, `SYNCGUARD_TEST_TLS_KEY`).
    pub fn from_env() -> Self {
        use super::processes::env;
        Self {
            cert: env("SYNCGUARD_TEST_TLS_CERT").into(),
            key: env("SYNCGUARD_TEST_TLS_KEY").into(),
            ca: env("SYNCGUARD_TEST_TLS_CA").into(),
        }
    }

    /// `rediss://127.0.0.1:<port>`, trusting the CA only.
    #[cfg(feature = "redis-tls")]
    fn client(&self, node: Node) -> RedisResult<redis::Client> {
        // As syncguard does (the dev build has two rustls providers, so none is the default);
        // an error only says that one is in place already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let root_cert = std::fs::read(&self.ca)
            .unwrap_or_else(|e| panic!("read the CA {}: {e}", self.ca.display()));
        let certificates = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_cert),
        };
        redis::Client::build_with_tls(format!("rediss://{}", node.addr()), certificates)
    }

    #[cfg(not(feature = "redis-tls"))]
    fn client(&self, _node: Node) -> RedisResult<redis::Client> {
        panic!("a TLS cluster needs syncguard's redis-tls feature (run with --all-features)")
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "127.0.0.1:{}", self.port)
    }
}

/// One connection kept per node, opened on first use and again after the node went away.
#[derive(Default)]
pub struct NodeConnections {
    kept: Mutex<HashMap<Node, MultiplexedConnection>>,
    /// Set for a TLS cluster: every connection is TLS.
    tls: Option<ClusterTls>,
}

impl NodeConnections {
    pub fn new(tls: Option<ClusterTls>) -> Self {
        Self {
            kept: Mutex::default(),
            tls,
        }
    }

    /// A fresh connection to `node` alone, over TLS for a TLS cluster.
    pub async fn open(&self, node: Node) -> RedisResult<MultiplexedConnection> {
        node.connect_over(self.tls.as_ref()).await
    }

    /// One command to one node, within [`COMMAND_TIMEOUT`], on a connection kept for the
    /// next (the waits here ask every node several times a second).
    pub async fn query<T: FromRedisValue>(
        &self,
        node: Node,
        command: &redis::Cmd,
    ) -> RedisResult<T> {
        let kept = self.kept().get(&node).cloned();
        if let Some(mut connection) = kept {
            let answer = command.query_async(&mut connection).await;
            match &answer {
                // Not sent: the node went away since (or the runtime that drove it ended).
                Err(error) if error.is_connection_dropped() => {}
                Err(error) if !matches!(error.kind(), ErrorKind::Server(_)) => {
                    self.forget(node);
                    return answer;
                }
                _ => return answer,
            }
        }
        self.forget(node);
        let mut connection = self.open(node).await?;
        self.kept().insert(node, connection.clone());
        command.query_async(&mut connection).await
    }

    /// Drops the connection kept for `node`: the next query opens a fresh one.
    pub fn forget(&self, node: Node) {
        self.kept().remove(&node);
    }

    fn kept(&self) -> MutexGuard<'_, HashMap<Node, MultiplexedConnection>> {
        (self.kept.lock()).unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
