//! When a test's Redis Cluster is stable, and the waits until it is.

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::{Node, PATIENCE, RedisCluster};

impl RedisCluster {
    /// Waits until every reachable node serves all slots (`cluster_state:ok`), knows every
    /// node, doubts none of the reachable ones, agrees with the others on which primary serves
    /// each slot and whom each reachable node follows, and, as a replica, has its link to its
    /// primary up.
    pub async fn wait_until_stable(&self) {
        self.wait_until("the cluster to be stable", async || self.stability().await)
            .await;
    }

    /// Why the cluster is not stable (see [`wait_until_stable`](Self::wait_until_stable)).
    pub(super) async fn stability(&self) -> Result<(), String> {
        let reachable = self.reachable();
        let ports: Vec<u16> = reachable.iter().map(|node| node.port).collect();
        let known = self.processes().len();
        let mut agreed = None;
        for &node in &reachable {
            let info: String = self
                .query(node, redis::cmd("CLUSTER").arg("INFO"))
                .await
                .map_err(|e| format!("CLUSTER INFO on {node}: {e}"))?;
            if !info.contains("cluster_state:ok") || !info.contains("cluster_slots_ok:16384") {
                return Err(format!("{node} does not serve all slots: {}", info.trim()));
            }
            let view = self.view_of(node).await?;
            if view.entries.len() != known {
                return Err(format!(
                    "{node} knows {} nodes of {known}",
                    view.entries.len()
                ));
            }
            if let Some(doubted) = view
                .entries
                .iter()
                .find(|entry| ports.contains(&entry.port) && entry.is_suspect())
            {
                return Err(format!("{node} doubts {}: {doubted:?}", doubted.port));
            }
            let layout = view.layout(&ports);
            match &agreed {
                None => agreed = Some((node, layout)),
                Some((first, first_layout)) if *first_layout != layout => {
                    return Err(format!(
                        "{node} and {first} disagree: {layout:?} and {first_layout:?}"
                    ));
                }
                Some(_) => {}
            }
            if !view.myself().is_primary() {
                let replication: String = self
                    .query(node, redis::cmd("INFO").arg("replication"))
                    .await
                    .map_err(|e| format!("INFO replication on {node}: {e}"))?;
                if !replication.contains("master_link_status:up") {
                    return Err(format!("the replica {node}'s link to its primary is down"));
                }
            }
        }
        Ok(())
    }

    pub(super) async fn wait_until_answering(&self, node: Node) {
        self.wait_until(&format!("{node} to answer PING"), async || {
            self.query::<String>(node, &redis::cmd("PING"))
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .await;
    }

    /// Runs `check` until it passes; panics after [`PATIENCE`] with what it last said.
    pub(super) async fn wait_until(
        &self,
        what: &str,
        mut check: impl AsyncFnMut() -> Result<(), String>,
    ) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let error = match check().await {
                Ok(()) => return,
                Err(error) => error,
            };
            assert!(
                Instant::now() < deadline,
                "waited {PATIENCE:?} for {what}; last: {error} (node logs in {})",
                self.dir.display()
            );
            sleep(Duration::from_millis(100)).await;
        }
    }
}
