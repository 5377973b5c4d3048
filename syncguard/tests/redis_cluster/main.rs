// The conformance suite's tests hold the cluster connection's futures several layers deep.
#![recursion_limit = "256"]
//! The Redis backend on a Redis Cluster, one concern per module; [`support_check`] checks the
//! clusters the others run on: the shared one `scripts/services.sh` starts and the private
//! ones of `support/cluster.rs`.
//!
//! Needs `SYNCGUARD_TEST_REDIS_CLUSTER_URL` and `SYNCGUARD_TEST_REDIS_CLUSTER_NODES` (the
//! shared cluster, which these tests may write to), and `SYNCGUARD_REDIS_SERVER_BIN` and
//! `SYNCGUARD_REDIS_CLI_BIN` (to start private clusters): `bash scripts/test-all.sh` or
//! `bash scripts/with-services.sh cargo test -p syncguard --all-features --test redis_cluster`
//! installs Redis if missing and sets them.

#[path = "../support/cluster.rs"]
mod cluster;
#[path = "../support/forward.rs"]
mod forward;
#[path = "../faults/timed.rs"]
mod timed;
#[path = "../support/urls.rs"]
mod urls;
#[path = "../faults/workload.rs"]
mod workload;

mod batching;
mod conformance;
mod connection;
mod faults;
mod node_calls;
mod scripts;
mod support_check;
mod topology;
mod waiting;

use syncguard::redis::RedisBackend;

/// The `redis-cluster://` URL of the shared cluster `bash scripts/test-all.sh` starts.
pub(crate) use urls::redis_cluster_url as cluster_url;

/// A backend on the shared cluster, with the default configuration.
pub(crate) async fn cluster_backend() -> RedisBackend {
    RedisBackend::connect(&cluster_url())
        .await
        .expect("connect to the cluster")
}

/// The seed nodes of the shared cluster, as plain `redis://` URLs.
pub(crate) fn seed_nodes() -> Vec<String> {
    let url = cluster_url();
    let (_, nodes) = url.split_once("://").expect("a URL");
    nodes
        .trim_end_matches('/')
        .split(',')
        .map(|node| format!("redis://{node}"))
        .collect()
}

/// A key of its own for each test run.
pub(crate) fn unique(label: &str) -> String {
    format!("{label}:{}", syncguard::LockId::generate())
}
