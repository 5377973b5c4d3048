// The conformance suite's futures on a cluster connection are several layers deep.
#![recursion_limit = "256"]
//! TLS to PostgreSQL (`sslmode`), Redis (`rediss://`) and a Redis Cluster
//! (`rediss-cluster://`), against the servers `bash scripts/services.sh` starts (and a cluster
//! of the test's own) with a certificate for 127.0.0.1 from a CA of its own: locks work over
//! verified TLS, the connections really are encrypted, and a certificate the client does not
//! trust fails the connection with a message that says so.

use std::collections::BTreeMap;
use std::error::Error as _;
use std::time::Duration;

use syncguard::backend::{ExtendOutcome, Lease, LockBackend};
use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig};
use syncguard::{ErrorCode, LockError, LockId, conformance};
use tokio::time::{Instant, sleep, timeout};

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/urls.rs"]
mod urls;
#[path = "support/waiters.rs"]
mod waiters;

use cluster::{ClusterTls, Node, RedisCluster};
use waiters::{spawn_waiter, taken, waiting_every};

const HOW_TO_RUN: &str = "run `bash scripts/test-all.sh`, or `bash scripts/with-services.sh \
    cargo test -p syncguard --all-features --test tls`: it installs PostgreSQL, Redis (Debian's \
    redis-server, built with TLS) and OpenSSL if missing, makes a test CA and starts both \
    servers with TLS";

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: {HOW_TO_RUN}"))
}

/// The PEM file of the CA that signed the servers' certificate.
fn ca_path() -> String {
    var("SYNCGUARD_TEST_TLS_CA")
}

/// The PEM file of a CA that signed nothing the servers present.
fn other_ca_path() -> String {
    var("SYNCGUARD_TEST_TLS_OTHER_CA")
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|error| panic!("read {path}: {error} ({HOW_TO_RUN})"))
}

/// The test PostgreSQL's URL with these `sslmode`... parameters.
fn postgres_url(params: &str) -> String {
    let url = urls::postgres_url();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{params}")
}

/// Generous timeouts: a busy machine must not turn a certificate error into a timeout.
fn postgres_config() -> PostgresConfig {
    PostgresConfig::new()
        .with_connect_timeout(Duration::from_secs(10))
        .with_operation_timeout(Duration::from_secs(10))
}

async fn postgres_backend(params: &str) -> PostgresBackend {
    let url = postgres_url(params);
    let backend = PostgresBackend::connect_with(&url, postgres_config())
        .await
        .unwrap_or_else(|error| panic!("connect to {url}: {error} (source: {:?})", error.source()));
    setup_schema(backend.pool(), backend.config())
        .await
        .expect("setup_schema");
    backend
}

/// Whether the server sees the backend's pooled connection as TLS.
async fn postgres_sees_tls(backend: &PostgresBackend) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(backend.pool())
        .await
        .expect("query pg_stat_ssl")
}

/// `error`'s message and every source's, for asserting on what a user would read.
fn chain(error: &LockError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn assert_untrusted(result: Result<impl std::fmt::Debug, LockError>, what: &str) {
    let error = result.expect_err(what);
    assert_eq!(
        error.code(),
        ErrorCode::ServiceUnavailable,
        "{what}: {error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("TLS") && message.contains("certificate"),
        "{what}: the message should say that the server's certificate is not trusted: {}",
        chain(&error)
    );
    assert!(
        chain(&error).contains("UnknownIssuer"),
        "{what}: the driver's error should be kept as the source: {}",
        chain(&error)
    );
}

#[tokio::test]
async fn postgres_verify_full_with_the_ca_locks_over_tls() {
    let backend = postgres_backend(&format!("sslmode=verify-full&sslrootcert={}", ca_path())).await;
    assert!(
        postgres_sees_tls(&backend).await,
        "the connection should be TLS"
    );
    conformance::lifecycle(backend.clone()).await;
    conformance::contention(backend.clone()).await;
    assert!(postgres_sees_tls(&backend).await);
}

#[tokio::test]
async fn postgres_sslmode_require_encrypts() {
    // sqlx's `require` encrypts without checking the certificate.
    let backend = postgres_backend("sslmode=require").await;
    assert!(
        postgres_sees_tls(&backend).await,
        "the connection should be TLS"
    );
    conformance::lifecycle(backend).await;
}

#[tokio::test]
async fn postgres_plain_connections_still_work() {
    let backend = postgres_backend("sslmode=disable").await;
    assert!(
        !postgres_sees_tls(&backend).await,
        "sslmode=disable should not be TLS"
    );
}

#[tokio::test]
async fn postgres_verify_full_rejects_an_untrusted_certificate() {
    let other = format!("sslmode=verify-full&sslrootcert={}", other_ca_path());
    let result = PostgresBackend::connect_with(&postgres_url(&other), postgres_config()).await;
    assert_untrusted(result, "verify-full with another CA");
    // Without `sslrootcert`, only public CAs are trusted.
    let result =
        PostgresBackend::connect_with(&postgres_url("sslmode=verify-full"), postgres_config())
            .await;
    assert_untrusted(result, "verify-full with the public roots only");
}

fn redis_tls_url() -> String {
    var("SYNCGUARD_TEST_REDIS_TLS_URL")
}

/// A configuration for the TLS port, with generous timeouts: a busy machine must not turn a
/// certificate error into a timeout.
fn redis_tls_config(mode: ConnectionMode) -> RedisConfig {
    RedisConfig::new()
        .with_connection_mode(mode)
        .with_connect_timeout(Duration::from_secs(10))
        .with_operation_timeout(Duration::from_secs(10))
}

const MODES: [ConnectionMode; 2] = [
    ConnectionMode::Multiplexed,
    ConnectionMode::Pool { max_size: 4 },
];

#[tokio::test]
async fn redis_over_tls_with_the_ca_locks_in_both_modes() {
    for mode in MODES {
        // The TLS port speaks nothing but TLS, so a working lock is a lock over TLS.
        let config = redis_tls_config(mode).with_tls_root_certs(read(&ca_path()));
        let backend = RedisBackend::connect_with(&redis_tls_url(), config)
            .await
            .unwrap_or_else(|error| panic!("{mode:?}: {}", chain(&error)));
        conformance::lifecycle(backend.clone()).await;
        conformance::contention(backend).await;
    }
}

#[tokio::test]
async fn redis_rejects_an_untrusted_certificate() {
    for mode in MODES {
        let public_roots_only =
            RedisBackend::connect_with(&redis_tls_url(), redis_tls_config(mode)).await;
        assert_untrusted(public_roots_only, &format!("public roots only ({mode:?})"));
        let config = redis_tls_config(mode).with_tls_root_certs(read(&other_ca_path()));
        let other_ca = RedisBackend::connect_with(&redis_tls_url(), config).await;
        assert_untrusted(other_ca, &format!("another CA ({mode:?})"));
    }
}

#[tokio::test]
async fn redis_tls_root_certs_need_a_rediss_url() {
    let plain = urls::redis_url();
    let error = RedisBackend::connect_with(
        &plain,
        RedisConfig::new().with_tls_root_certs(read(&ca_path())),
    )
    .await
    .expect_err("root certificates with redis://");
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
    assert!(error.to_string().contains("rediss://"), "{error}");
}

/// A private Redis Cluster of 3 primaries whose nodes serve clients over TLS only (one start
/// for all the checks, which run in turn): `rediss-cluster://` with the test CA locks on every
/// primary (from all three seeds, and from one, which learns the others' TLS ports from the
/// slot map) and wakes waiters; a plain client, a plain cluster URL and a client that does not
/// trust the certificate all fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_over_tls() {
    let started = Instant::now();
    let cluster = RedisCluster::start_tls(3, 0, ClusterTls::from_env()).await;
    eprintln!("TLS cluster of 3 primaries up in {:?}", started.elapsed());
    let url = cluster.url();
    assert!(url.starts_with("rediss-cluster://"), "{url}");
    serves_clients_over_tls_only(&cluster).await;
    let backend = RedisBackend::connect_with(&url, redis_tls_cluster_config())
        .await
        .unwrap_or_else(|error| panic!("connect to {url}: {}", chain(&error)));
    locks_on_every_primary(&cluster, &backend).await;
    wakes_waiters_on_every_primary(&cluster, &backend).await;
    // From one seed, the other primaries' addresses come from the slot map: their TLS ports.
    let one_seed = url.split(',').next().unwrap();
    let from_one_seed = RedisBackend::connect_with(one_seed, redis_tls_cluster_config())
        .await
        .unwrap_or_else(|error| panic!("connect to {one_seed}: {}", chain(&error)));
    locks_on_every_primary(&cluster, &from_one_seed).await;
    conformance::lifecycle(backend.clone()).await;
    conformance::contention(backend).await;
    rejects_an_untrusted_certificate(&url).await;
    refuses_root_certs_with_a_plain_cluster_url(&cluster).await;
    eprintln!("TLS cluster checks done in {:?}", started.elapsed());
}

/// The test CA, and timeouts generous enough that a busy machine does not turn a certificate
/// error into a timeout.
fn redis_tls_cluster_config() -> RedisConfig {
    redis_cluster_config().with_tls_root_certs(read(&ca_path()))
}

fn redis_cluster_config() -> RedisConfig {
    RedisConfig::new()
        .with_connect_timeout(Duration::from_secs(10))
        .with_operation_timeout(Duration::from_secs(10))
}

/// `redis-cluster://` (no TLS) and the TLS cluster's seeds.
fn plain_url(cluster: &RedisCluster) -> String {
    cluster
        .url()
        .replacen("rediss-cluster://", "redis-cluster://", 1)
}

/// Whether `node` answers a `PING` sent without TLS (within 10 s).
async fn answers_plain_ping(node: Node) -> bool {
    let ping = async {
        let mut connection = node.connect().await?;
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
    };
    matches!(timeout(Duration::from_secs(10), ping).await, Ok(Ok(_)))
}

/// Every node has no plain port (`port 0`), announces its TLS port, and a plain connection to
/// that port gets no answer: whatever reaches the cluster is TLS.
async fn serves_clients_over_tls_only(cluster: &RedisCluster) {
    for node in cluster.nodes() {
        let mut tls = cluster.connect(node).await;
        let port: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("port")
            .query_async(&mut tls)
            .await
            .unwrap();
        assert_eq!(port, ["port", "0"], "{node} should have no plain port");
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut tls)
            .await
            .unwrap();
        assert!(
            nodes.contains(&format!("{}@", node.addr())),
            "{node} should announce its TLS port: {nodes}"
        );
        assert!(
            !answers_plain_ping(node).await,
            "{node} should answer nothing without TLS"
        );
    }
    let error = RedisBackend::connect_with(&plain_url(cluster), redis_cluster_config())
        .await
        .expect_err("a plain redis-cluster:// URL to TLS-only nodes");
    assert!(
        matches!(
            error.code(),
            ErrorCode::ServiceUnavailable | ErrorCode::NetworkTimeout
        ),
        "{}",
        chain(&error)
    );
}

/// One key whose lock a primary serves, for each primary.
async fn key_on_each_primary(
    cluster: &RedisCluster,
    backend: &RedisBackend,
) -> Vec<(Node, String)> {
    let primaries = cluster.primaries().await;
    let mut found = BTreeMap::new();
    for _ in 0..300 {
        if found.len() == primaries.len() {
            break;
        }
        let key = format!("tls-cluster:{}", LockId::generate());
        let slot = cluster.slot_of(&backend.lock_key(&key).unwrap()).await;
        found
            .entry(cluster.owner_of_slot(slot).await)
            .or_insert(key);
    }
    assert_eq!(
        found.len(),
        primaries.len(),
        "300 random keys should reach every primary: {found:?}"
    );
    found.into_iter().collect()
}

/// Whether `node` itself stores `key` (`EXISTS` there, no redirection followed).
async fn stored_on(cluster: &RedisCluster, node: Node, key: &str) -> bool {
    let mut connection = cluster.connect(node).await;
    let count: u32 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut connection)
        .await
        .unwrap();
    count == 1
}

/// The lease of `key`, which must be free, for 30 s.
async fn acquired(backend: &RedisBackend, key: &str, primary: Node) -> Lease {
    (backend.acquire(key, Duration::from_secs(30)).await)
        .unwrap_or_else(|error| panic!("acquire {key} on {primary}: {}", chain(&error)))
        .lease()
        .unwrap_or_else(|| panic!("{key} on {primary} should be free"))
}

/// Acquire, extend and release reach each primary over TLS: the lock is stored on the primary
/// that serves its slot while held, and gone after the release.
async fn locks_on_every_primary(cluster: &RedisCluster, backend: &RedisBackend) {
    let ttl = Duration::from_secs(30);
    for (primary, key) in key_on_each_primary(cluster, backend).await {
        let lock_key = backend.lock_key(&key).unwrap();
        let lease = acquired(backend, &key, primary).await;
        assert!(stored_on(cluster, primary, &lock_key).await, "{primary}");
        assert!(backend.is_locked(&key).await.unwrap());
        assert!(
            backend.acquire(&key, ttl).await.unwrap().lease().is_none(),
            "{key} on {primary} is held"
        );
        match backend.extend(&lease.lock_id, 2 * ttl).await.unwrap() {
            ExtendOutcome::Extended { expires_at_ms, .. } => {
                assert!(expires_at_ms > lease.expires_at_ms, "{primary}");
            }
            other => panic!("extend on {primary}: {other:?}"),
        }
        let released = backend.release(&lease.lock_id).await.unwrap();
        assert!(released.is_released(), "{primary}: {released:?}");
        assert!(!stored_on(cluster, primary, &lock_key).await, "{primary}");
        assert!(!backend.is_locked(&key).await.unwrap());
    }
}

/// A poll so slow that only the release's announcement explains a prompt wake-up.
const SLOW_POLL: Duration = Duration::from_secs(30);
/// A loaded 2-core machine's worst case for a wake-up that takes milliseconds.
const PROMPT: Duration = Duration::from_secs(10);

/// A waiter polling every 30 s gets the lock long before its poll when the holder releases
/// it, whichever primary serves the key: the release subscriber connects over TLS with the
/// same CA, and the cluster forwards each release to the node it listens on.
async fn wakes_waiters_on_every_primary(cluster: &RedisCluster, backend: &RedisBackend) {
    for (primary, key) in key_on_each_primary(cluster, backend).await {
        let holder = acquired(backend, &key, primary).await;
        let waiter = spawn_waiter(backend, &key, waiting_every(SLOW_POLL));
        // The waiter's first attempt is refused, and it goes to sleep.
        sleep(Duration::from_millis(500)).await;
        assert!(!waiter.is_finished(), "{key} is held");
        let released = Instant::now();
        assert!(
            backend
                .release(&holder.lock_id)
                .await
                .unwrap()
                .is_released()
        );
        // Its poll is SLOW_POLL: only the release's announcement explains a prompt wake-up.
        let guard = taken(waiter, PROMPT).await;
        eprintln!(
            "TLS cluster, key on {primary}: release to acquisition {:?}",
            released.elapsed()
        );
        assert!(guard.fence() > holder.fence);
        guard.release().await.unwrap();
    }
}

/// Another CA, and the public roots only (no CA given), fail the connection with a message
/// about the certificate.
async fn rejects_an_untrusted_certificate(url: &str) {
    let public_roots_only = RedisBackend::connect_with(url, redis_cluster_config()).await;
    assert_untrusted(
        public_roots_only,
        "rediss-cluster:// with the public roots only",
    );
    let config = redis_cluster_config().with_tls_root_certs(read(&other_ca_path()));
    let other_ca = RedisBackend::connect_with(url, config).await;
    assert_untrusted(other_ca, "rediss-cluster:// with another CA");
}

/// Root certificates with a plain `redis-cluster://` URL are refused, naming
/// `rediss-cluster://`, as they are with `redis://`: they must not turn a URL that says
/// "plain" into TLS connections.
async fn refuses_root_certs_with_a_plain_cluster_url(cluster: &RedisCluster) {
    let error = RedisBackend::connect_with(&plain_url(cluster), redis_tls_cluster_config())
        .await
        .expect_err("root certificates with redis-cluster://");
    assert_eq!(
        error.code(),
        ErrorCode::InvalidArgument,
        "{}",
        chain(&error)
    );
    assert!(error.to_string().contains("rediss-cluster://"), "{error}");
}
