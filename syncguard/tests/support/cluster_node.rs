//! A node of a test's Redis Cluster, and the connections kept to each.

use std::collections::HashMap;
use std::fmt;
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

    /// A plain connection to this node alone, within [`COMMAND_TIMEOUT`].
    pub async fn connect(self) -> RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(COMMAND_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT));
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection_with_config(&config)
            .await
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
}

impl NodeConnections {
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
        let mut connection = node.connect().await?;
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
