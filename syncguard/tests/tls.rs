//! TLS to PostgreSQL (`sslmode`) and Redis (`rediss://`), against the servers
//! `bash scripts/services.sh` starts with a certificate for 127.0.0.1 from a CA of its own:
//! locks work over verified TLS, the connections really are encrypted, and a certificate the
//! client does not trust fails the connection with a message that says so.

use std::error::Error as _;
use std::time::Duration;

use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig};
use syncguard::{ErrorCode, LockError, conformance};

#[path = "support/urls.rs"]
mod urls;

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
