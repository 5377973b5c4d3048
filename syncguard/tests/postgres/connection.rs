//! Connecting, the errors mapped from real failures and how they print, and the connections
//! the backend keeps between statements.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection};
use syncguard::backend::LockBackend;
use syncguard::backend::key::make_storage_key;
use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
use syncguard::{ErrorCode, conformance};

use crate::{backend, pool, postgres_url, takes_and_releases, unique};

#[tokio::test]
async fn connect_builds_a_working_backend_and_rejects_bad_urls() {
    let backend = PostgresBackend::connect(&postgres_url()).await.unwrap();
    assert_eq!(
        backend.config(),
        &PostgresConfig::new(),
        "connect uses the defaults"
    );
    setup_schema(backend.pool(), backend.config())
        .await
        .unwrap();
    let key = conformance::unique_key("connect");
    let lease = backend
        .acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());

    // The builder takes a configuration, and uses it.
    let config = PostgresConfig::new().with_lock_table(unique("built"));
    let built = PostgresBackend::connect_with(&postgres_url(), config.clone())
        .await
        .unwrap();
    assert_eq!(built.config(), &config);
    setup_schema(built.pool(), built.config()).await.unwrap();
    let lease = built
        .acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .lease()
        .expect("another lock table: the key is free there");
    let stored: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT lock_id FROM \"{}\"",
        config.lock_table()
    )))
    .fetch_one(built.pool())
    .await
    .unwrap();
    assert_eq!(
        stored,
        lease.lock_id.as_str(),
        "stored in the configured table"
    );
    assert!(built.release(&lease.lock_id).await.unwrap().is_released());

    let error = PostgresBackend::connect("not a url").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
    let error = PostgresBackend::connect_with("not a url", PostgresConfig::new())
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
    let error = PostgresBackend::connect_with(
        &postgres_url(),
        PostgresConfig::new().with_lock_table("a-b"),
    )
    .await
    .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
}

#[tokio::test]
async fn errors_are_mapped_from_real_failures() {
    // Nothing listens on a freshly freed port: connection refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let refused = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        .unwrap();
    let backend = PostgresBackend::new(refused, PostgresConfig::new()).unwrap();
    let error = backend.is_locked("x").await.unwrap_err();
    assert!(
        matches!(
            error.code(),
            ErrorCode::ServiceUnavailable | ErrorCode::NetworkTimeout
        ),
        "{error}"
    );

    // A role that may not log in: authentication failure.
    let pool = pool(2).await;
    let role = unique("nologin");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE \"{role}\" NOLOGIN"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let options = PgConnectOptions::from_str(&postgres_url())
        .unwrap()
        .username(&role);
    let denied = PgPoolOptions::new().connect_lazy_with(options);
    let backend = PostgresBackend::new(denied, PostgresConfig::new()).unwrap();
    let error = backend.is_locked("x").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::AuthFailed, "{error}");

    // Every pooled connection busy past the acquire timeout: rate limited.
    let tiny = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(300))
        .connect(&postgres_url())
        .await
        .unwrap();
    setup_schema(&tiny, &PostgresConfig::new()).await.unwrap();
    let backend = PostgresBackend::new(tiny.clone(), PostgresConfig::new()).unwrap();
    let held = tiny.acquire().await.unwrap();
    let error = backend.is_locked("x").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::RateLimited, "{error}");
    drop(held);

    // A statement timeout while the key's advisory lock is held elsewhere: network timeout.
    let key = conformance::unique_key("timeout");
    let storage_key = make_storage_key("", &key, 1700, 0).unwrap();
    let mut blocker = PgConnection::connect(&postgres_url()).await.unwrap();
    let mut tx = blocker.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(&storage_key)
        .execute(&mut *tx)
        .await
        .unwrap();
    let options = PgConnectOptions::from_str(&postgres_url())
        .unwrap()
        .options([("statement_timeout", "200")]);
    let slow = PgPoolOptions::new().connect_lazy_with(options);
    let backend = PostgresBackend::new(slow, PostgresConfig::new()).unwrap();
    let error = backend
        .acquire(&key, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::NetworkTimeout, "{error}");
    tx.rollback().await.unwrap();
    takes_and_releases(&backend, &key, "free once the blocker is gone").await;
}

/// `error`'s message and every source's, as a reporter that walks the chain prints it
/// (anyhow's `{:#}`, tracing's error display).
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[tokio::test]
async fn a_missing_database_is_a_configuration_error() {
    let mut options = PgConnectOptions::from_str(&postgres_url()).unwrap();
    let database = unique("no_such_db");
    options = options.database(&database);
    let check = |error: syncguard::LockError, how: &str| {
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{how}: {error}");
        assert!(!error.is_retryable(), "{how}");
        let message = error.to_string();
        assert!(
            message.contains(&database) && message.contains("CREATE DATABASE"),
            "{how}: the message should name the database and say to create it: {message}"
        );
        assert!(message.contains("URL"), "{how}: {message}");
        // The server's own words are kept, once, in the source.
        let chain = chain(&error);
        assert_eq!(chain.matches("does not exist").count(), 1, "{how}: {chain}");
    };

    let base = postgres_url();
    let (server, _) = base.rsplit_once('/').unwrap();
    let url = format!("{server}/{database}");
    let error = PostgresBackend::connect(&url).await.unwrap_err();
    check(error, "PostgresBackend::connect");

    let lazy = PostgresBackend::pool_options().connect_lazy_with(options.clone());
    let backend = PostgresBackend::new(lazy.clone(), PostgresConfig::new()).unwrap();
    check(backend.is_locked("x").await.unwrap_err(), "is_locked");
    check(
        setup_schema(&lazy, &PostgresConfig::new())
            .await
            .unwrap_err(),
        "setup_schema",
    );
}

#[tokio::test]
async fn a_refused_connection_prints_the_driver_error_once() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let once = |error: syncguard::LockError, how: &str| {
        assert_eq!(
            error.code(),
            ErrorCode::ServiceUnavailable,
            "{how}: {error}"
        );
        let chain = chain(&error);
        // The driver's text ("Connection refused (os error 111)" on Linux) appears once.
        assert_eq!(chain.matches("os error").count(), 1, "{how}: {chain}");
        assert!(
            !error.to_string().contains("os error"),
            "{how}: the message should say it in our words: {error}"
        );
    };
    once(
        PostgresBackend::connect(&url).await.unwrap_err(),
        "PostgresBackend::connect",
    );
    let lazy = PostgresBackend::pool_options().connect_lazy(&url).unwrap();
    let backend = PostgresBackend::new(lazy, PostgresConfig::new()).unwrap();
    once(backend.is_locked("x").await.unwrap_err(), "is_locked");
}

#[tokio::test]
async fn a_malformed_url_prints_the_driver_error_once() {
    let error = PostgresBackend::connect("postgres://app@db/app?sslmode=sometimes")
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
    // The innermost error of the chain, the driver's own words, appears once.
    let mut innermost = std::error::Error::source(&error).expect("the driver error is kept");
    while let Some(cause) = innermost.source() {
        innermost = cause;
    }
    let driver = innermost.to_string();
    let chain = chain(&error);
    assert_eq!(chain.matches(&driver).count(), 1, "{chain}");
}

/// Connections the backend keeps between statements go back to the pool once idle (so that a
/// pool shared with the application is not held by a past burst of locking), and a pool being
/// closed gets them back at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_connections_go_back_to_the_pool() {
    backend().await; // the schema
    let pool = pool(4).await;
    let backend = PostgresBackend::new(pool.clone(), PostgresConfig::new()).unwrap();
    let burst = |backend: PostgresBackend| async move {
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let backend = backend.clone();
                tokio::spawn(async move {
                    let key = conformance::unique_key("kept");
                    for _ in 0..20 {
                        let lease = backend
                            .acquire(&key, Duration::from_secs(30))
                            .await
                            .unwrap()
                            .lease()
                            .unwrap();
                        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    };
    burst(backend.clone()).await;
    assert!(
        pool.num_idle() < pool.size() as usize,
        "right after the burst the backend keeps connections: {} of {} idle in the pool",
        pool.num_idle(),
        pool.size()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while pool.num_idle() < pool.size() as usize {
        assert!(
            tokio::time::Instant::now() < deadline,
            "kept connections never went back: {} of {} idle in the pool",
            pool.num_idle(),
            pool.size()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The application can have every connection of the pool.
    let mut all = Vec::new();
    for _ in 0..4 {
        all.push(
            tokio::time::timeout(Duration::from_secs(5), pool.acquire())
                .await
                .expect("a connection given back is free")
                .unwrap(),
        );
    }
    drop(all);

    burst(backend.clone()).await;
    tokio::time::timeout(Duration::from_secs(10), pool.close())
        .await
        .expect("closing the pool gets the kept connections back");
    let error = backend
        .is_locked(&conformance::unique_key("closed"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("closed"), "{error}");
}

/// A URL of another scheme is refused before any I/O, naming the scheme (and, for a Redis
/// URL, the Redis backend): before, `mysql://` connected as if it were PostgreSQL, and a Redis
/// URL waited for a PostgreSQL handshake until the connect timeout.
#[tokio::test]
async fn urls_of_other_schemes_are_refused_at_once_naming_the_backend() {
    // Accepts connections and never answers, as a server of another protocol would not.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let config = PostgresConfig::new().with_connect_timeout(Duration::from_secs(5));
    for (url, says) in [
        (format!("redis://127.0.0.1:{port}"), "RedisBackend"),
        (
            format!("rediss://:secret@127.0.0.1:{port}/0"),
            "RedisBackend",
        ),
        (
            format!("mysql://root:secret@127.0.0.1:{port}/app"),
            "\"mysql\"",
        ),
        (format!("http://127.0.0.1:{port}"), "\"http\""),
    ] {
        let started = std::time::Instant::now();
        let error = PostgresBackend::connect_with(&url, config.clone())
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{url}: {error}");
        let message = error.to_string();
        assert!(message.contains(says), "{url}: {message}");
        assert!(!message.contains("secret"), "{url}: {message}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{url}: refused after {:?}, not at once",
            started.elapsed()
        );
    }
    // Both PostgreSQL schemes are taken.
    let url = postgres_url();
    let other = match url.strip_prefix("postgres://") {
        Some(rest) => format!("postgresql://{rest}"),
        None => url.replacen("postgresql://", "postgres://", 1),
    };
    PostgresBackend::connect(&other).await.unwrap();
}

/// `new` runs on a pool of yours: a setting only a pool syncguard opens can apply is refused,
/// naming it, rather than silently ignored; and a bad setting given to `connect_with` is
/// refused, naming it, before any I/O.
#[tokio::test]
async fn settings_that_cannot_apply_or_are_bad_are_refused_naming_them() {
    let pool = PgPoolOptions::new().connect_lazy(&postgres_url()).unwrap();
    let error = PostgresBackend::new(pool.clone(), PostgresConfig::new().with_max_connections(4))
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
    assert!(
        error.to_string().contains("with_max_connections"),
        "{error}"
    );
    assert!(PostgresBackend::new(pool, PostgresConfig::new()).is_ok());

    // Nothing listens there: a refusal that comes before any I/O is InvalidArgument, not
    // ServiceUnavailable.
    let unreachable = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!(
            "postgres://u@127.0.0.1:{}/db",
            listener.local_addr().unwrap().port()
        )
    };
    for (config, setting) in [
        (
            PostgresConfig::new().with_max_connections(0),
            "with_max_connections",
        ),
        (
            PostgresConfig::new().with_operation_timeout(Duration::ZERO),
            "with_operation_timeout",
        ),
        (
            PostgresConfig::new().with_connect_timeout(Duration::ZERO),
            "with_connect_timeout",
        ),
        (PostgresConfig::new().with_lock_table("a-b"), "lock table"),
    ] {
        let error = PostgresBackend::connect_with(&unreachable, config)
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
        assert!(error.to_string().contains(setting), "{setting}: {error}");
    }

    // A pool size given to `connect_with` is the pool's.
    let sized = PostgresBackend::connect_with(
        &postgres_url(),
        PostgresConfig::new().with_max_connections(3),
    )
    .await
    .unwrap();
    assert_eq!(sized.pool().options().get_max_connections(), 3);
}

/// `connect_with` waits for a server that does not answer as long as the connect timeout says,
/// also when the operation timeout is shorter (before, the pool's wait cut it to the operation
/// timeout), and the error names the setting to change.
#[tokio::test]
async fn the_connect_timeout_bounds_connect_with_and_is_named() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let config = PostgresConfig::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_operation_timeout(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let error =
        PostgresBackend::connect_with(&format!("postgres://app@127.0.0.1:{port}/app"), config)
            .await
            .unwrap_err();
    let waited = started.elapsed();
    assert_eq!(error.code(), ErrorCode::NetworkTimeout, "{error}");
    assert!(
        error
            .to_string()
            .contains("PostgresConfig::with_connect_timeout"),
        "{error}"
    );
    assert!(
        waited >= Duration::from_millis(1_800) && waited < Duration::from_secs(10),
        "gave up after {waited:?}, not after the 2 s connect timeout"
    );
}
