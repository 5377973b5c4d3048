//! Where the test servers `bash scripts/test-all.sh` starts are: the URLs it exports, or a
//! failure that says how to get them (a test never passes by skipping).

#![allow(dead_code, unreachable_pub)]

fn exported(name: &str, install: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run `bash scripts/test-all.sh`, which installs {install} and \
             starts it, or `bash scripts/with-services.sh cargo test ...`"
        )
    })
}

/// The test PostgreSQL (15+; tests may create tables in it).
pub fn postgres_url() -> String {
    exported(
        "SYNCGUARD_TEST_POSTGRES_URL",
        "PostgreSQL (apt-get install postgresql)",
    )
}

/// The test redis-server.
pub fn redis_url() -> String {
    exported(
        "SYNCGUARD_TEST_REDIS_URL",
        "redis-server (apt-get install redis-server)",
    )
}

/// The shared test Sentinel group: `redis+sentinel://` with its three Sentinels, watching a
/// primary with one replica. Tests must not fail it over: `support/sentinels.rs` starts groups
/// of a test's own for that.
pub fn redis_sentinel_url() -> String {
    exported(
        "SYNCGUARD_TEST_REDIS_SENTINEL_URL",
        "redis-server (apt-get install redis-server; Sentinel is redis-server --sentinel)",
    )
}

/// The shared test Redis Cluster: `redis-cluster://` and its three primaries (each with one
/// replica), as seeds. Tests must not stop or pause its nodes: `support/cluster.rs` starts
/// clusters of a test's own for that.
pub fn redis_cluster_url() -> String {
    exported(
        "SYNCGUARD_TEST_REDIS_CLUSTER_URL",
        "redis-server 7+ (apt-get install redis-server)",
    )
}

/// Every node of the shared test Redis Cluster, primaries and replicas, as `127.0.0.1:<port>`.
pub fn redis_cluster_nodes() -> Vec<String> {
    let nodes = exported(
        "SYNCGUARD_TEST_REDIS_CLUSTER_NODES",
        "redis-server 7+ (apt-get install redis-server)",
    );
    nodes.split(',').map(str::to_owned).collect()
}
