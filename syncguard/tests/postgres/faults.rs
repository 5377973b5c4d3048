//! The PostgreSQL backend when things go wrong: a server that refuses connections, a network
//! partition, connections cut or terminated under the pool, many callers on a small pool,
//! a fence counter damaged by hand, and the waiters' listening connection cut off. Against
//! the real server `bash scripts/test-all.sh` starts (`SYNCGUARD_TEST_POSTGRES_URL`), through
//! a TCP proxy of the test's own where the network must fail.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};
use syncguard::backend::key::{make_fence_key, make_storage_key};
use syncguard::backend::{LockBackend, Lookup};
use syncguard::postgres::{MAX_STORAGE_KEY_BYTES, PostgresBackend, PostgresConfig, setup_schema};
use syncguard::{ErrorCode, Fence, LockOptions};
use tokio::time::Instant;

use crate::proxy::Proxy;

use crate::min_hold_partition;

use crate::urls::postgres_url;

/// The test server's `host:port`.
fn server_addr() -> String {
    let options = PgConnectOptions::from_str(&postgres_url()).expect("a PostgreSQL URL");
    format!("{}:{}", options.get_host(), options.get_port())
}

/// `postgres_url()` dialing `addr` instead.
fn url_at(addr: impl std::fmt::Display) -> String {
    postgres_url().replace(&server_addr(), &addr.to_string())
}

async fn backend_on(url: &str, max_connections: u32, config: PostgresConfig) -> PostgresBackend {
    let pool = PostgresBackend::pool_options()
        .max_connections(max_connections)
        .connect(url)
        .await
        .expect("connect to the test PostgreSQL");
    setup_schema(&pool, &config).await.expect("setup_schema");
    PostgresBackend::new(pool, config).expect("valid config")
}

fn key(label: &str) -> String {
    syncguard::conformance::unique_key(label)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn a_refused_connection_is_reported_at_once() {
    let nowhere = url_at(format!("127.0.0.1:{}", free_port()));
    let started = Instant::now();
    let error = PostgresBackend::connect(&nowhere).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::ServiceUnavailable, "{error}");
    assert!(error.to_string().contains("refused"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // The same through a pool of the caller's own, with sqlx's default 30 s acquire timeout.
    let lazy = PostgresBackend::pool_options()
        .connect_lazy(&nowhere)
        .unwrap();
    let backend = PostgresBackend::new(lazy, PostgresConfig::new()).unwrap();
    let started = Instant::now();
    let error = backend.is_locked("x").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::ServiceUnavailable, "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_callers_share_a_pool_of_ten_fairly() {
    let backend = backend_on(&postgres_url(), 10, PostgresConfig::new()).await;
    let prefix = key("fair");
    let slowest = Arc::new(Mutex::new(Duration::ZERO));
    let started = Instant::now();
    let callers: Vec<_> = (0..64)
        .map(|caller| {
            let (backend, prefix, slowest) =
                (backend.clone(), prefix.clone(), Arc::clone(&slowest));
            tokio::spawn(async move {
                for round in 0..20 {
                    let key = format!("{prefix}:{caller}:{round}");
                    let asked = Instant::now();
                    let lease = backend
                        .acquire(&key, Duration::from_secs(30))
                        .await
                        .expect("acquire")
                        .lease()
                        .expect("a fresh key is free");
                    let waited = asked.elapsed();
                    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
                    let mut slowest = slowest.lock().unwrap();
                    *slowest = (*slowest).max(waited);
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.expect("every caller completes");
    }
    let slowest = *slowest.lock().unwrap();
    println!(
        "64 callers x 20 acquire+release on a pool of 10: {:?} in all, slowest acquire {slowest:?}",
        started.elapsed()
    );
    // Each caller waits for its turn among 64 on 10 connections: a few round trips, not the
    // half minute callers starved for when connections were kept aside.
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_guards_are_all_released_promptly() {
    let backend = backend_on(&postgres_url(), 10, PostgresConfig::new()).await;
    let prefix = key("dropped");
    let options = LockOptions::default();
    let mut guards = Vec::new();
    for i in 0..2_000 {
        let key = format!("{prefix}:{i}");
        guards.push(syncguard::acquire(&backend, &key, &options).await.unwrap());
    }
    drop(guards); // 2,000 background releases at once
    let pool: &PgPool = backend.pool();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let held: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM syncguard_locks WHERE user_key LIKE $1 || ':%'",
        )
        .bind(&prefix)
        .fetch_one(pool)
        .await
        .unwrap();
        if held == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{held} locks still held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_fails_every_operation_within_its_timeouts() {
    let proxy = Proxy::start(&server_addr()).await;
    let config = PostgresConfig::new()
        .with_operation_timeout(Duration::from_millis(500))
        .with_connect_timeout(Duration::from_millis(500));
    let backend = backend_on(&url_at(proxy.addr()), 4, config).await;
    let held = key("partition");
    let lease = backend
        .acquire(&held, Duration::from_secs(30))
        .await
        .unwrap()
        .lease()
        .unwrap();

    proxy.stall();
    // The operation timeout bounds each operation end to end (the pool wait included).
    let bound = Duration::from_millis(500) + Duration::from_secs(2); // margin
    let other = key("partition-other");
    let timed = |what: &'static str, started: Instant, code: ErrorCode| {
        let took = started.elapsed();
        assert!(took < bound, "{what} took {took:?}");
        assert!(
            matches!(code, ErrorCode::NetworkTimeout | ErrorCode::RateLimited),
            "{what}: {code}"
        );
    };
    let started = Instant::now();
    let error = backend
        .acquire(&other, Duration::from_secs(30))
        .await
        .unwrap_err();
    timed("acquire", started, error.code());
    let started = Instant::now();
    let error = backend
        .extend(&lease.lock_id, Duration::from_secs(30))
        .await
        .unwrap_err();
    timed("extend", started, error.code());
    let started = Instant::now();
    let error = backend.is_locked(&held).await.unwrap_err();
    timed("is_locked", started, error.code());
    let started = Instant::now();
    let error = backend.lookup(Lookup::Key(&held)).await.unwrap_err();
    timed("lookup", started, error.code());
    let started = Instant::now();
    let error = backend.release(&lease.lock_id).await.unwrap_err();
    timed("release", started, error.code());

    proxy.resume();
    // Healed: the next operations succeed (connections in doubt were closed, not reused).
    assert!(backend.is_locked(&held).await.unwrap());
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_cut_under_the_pool_cost_no_failed_operation() {
    let proxy = Proxy::start(&server_addr()).await;
    let backend = backend_on(&url_at(proxy.addr()), 10, PostgresConfig::new()).await;
    // Fill the pool with idle connections, as a busy service has.
    let warm: Vec<_> = (0..10)
        .map(|_| {
            let backend = backend.clone();
            tokio::spawn(async move { backend.is_locked("warm").await })
        })
        .collect();
    for task in warm {
        task.await.unwrap().unwrap();
    }
    let before = proxy.connections();
    proxy.cut(); // every pooled connection is dead now, as after a server restart
    for i in 0..25 {
        let key = key(&format!("after-cut-{i}"));
        let lease = backend
            .acquire(&key, Duration::from_secs(30))
            .await
            .unwrap_or_else(|error| panic!("acquire {i} after the cut: {error}"))
            .lease()
            .unwrap();
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
    assert!(
        proxy.connections() > before,
        "fresh connections were opened"
    );
}

#[tokio::test]
async fn a_terminated_connection_costs_no_failed_operation() {
    let app = format!("sg-term-{}", free_port());
    let options = PgConnectOptions::from_str(&postgres_url())
        .unwrap()
        .application_name(&app);
    let pool = PostgresBackend::pool_options()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    setup_schema(&pool, &PostgresConfig::new()).await.unwrap();
    let backend = PostgresBackend::new(pool, PostgresConfig::new()).unwrap();
    let key = key("terminate");
    assert!(!backend.is_locked(&key).await.unwrap());

    let mut admin = PgConnection::connect(&postgres_url()).await.unwrap();
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&app)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(terminated, [true]);

    // Retried once on a fresh connection: the caller never sees the dead one.
    let lease = backend
        .acquire(&key, Duration::from_secs(30))
        .await
        .expect("acquired on a fresh connection")
        .lease()
        .unwrap();
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    assert!(!backend.is_locked(&key).await.unwrap());
}

#[tokio::test]
async fn a_damaged_fence_counter_fails_the_acquire_and_stores_nothing() {
    let backend = backend_on(&postgres_url(), 2, PostgresConfig::new()).await;
    let pool = backend.pool();
    // Stored counters whose next fence is negative, zero, or past the maximum.
    for stored in [-6_i64, -1, i64::try_from(Fence::MAX.get()).unwrap()] {
        let key = key("damaged");
        let storage_key = make_storage_key("", &key, MAX_STORAGE_KEY_BYTES, 0).unwrap();
        let fence_key = make_fence_key("", &storage_key, MAX_STORAGE_KEY_BYTES, 0).unwrap();
        sqlx::query("INSERT INTO syncguard_fence_counters (fence_key, fence, key_debug) VALUES ($1, $2, $3)")
            .bind(&fence_key)
            .bind(stored)
            .bind(&key)
            .execute(pool)
            .await
            .unwrap();
        let error = backend
            .acquire(&key, Duration::from_secs(30))
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::Internal, "{stored}: {error}");
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM syncguard_locks WHERE key = $1")
            .bind(&storage_key)
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(rows, 0, "a failed acquire (counter {stored}) stored a lock");
        assert!(!backend.is_locked(&key).await.unwrap());
        let counter: i64 =
            sqlx::query_scalar("SELECT fence FROM syncguard_fence_counters WHERE fence_key = $1")
                .bind(&fence_key)
                .fetch_one(pool)
                .await
                .unwrap();
        assert_eq!(counter, stored, "the counter is left as it was");
    }
    // A sound key is unaffected.
    let fine = key("undamaged");
    let lease = backend
        .acquire(&fine, Duration::from_secs(30))
        .await
        .unwrap()
        .lease()
        .expect("a sound key is acquired");
    assert_eq!(lease.fence.get(), 1);
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

/// The listening connection of the waiters cut off by a partition (cut, and new connections
/// held): a release in the meantime goes unheard, and the waiter gets the lock as soon as
/// the listener is back (it tries the releases it may have missed), not at its 30 s poll;
/// then releases wake waiters at once again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listener_cut_off_comes_back_and_catches_up_on_missed_releases() {
    let proxy = Proxy::start(&server_addr()).await;
    let application = format!("sg-listen-{}", free_port());
    let url = url_at(proxy.addr());
    let separator = if url.contains('?') { '&' } else { '?' };
    let config = PostgresConfig::new()
        .with_operation_timeout(Duration::from_millis(500))
        .with_connect_timeout(Duration::from_millis(500));
    let backend = backend_on(
        &format!("{url}{separator}application_name={application}"),
        4,
        config,
    )
    .await;
    // Shares the tables, not the network: it releases during the partition.
    let direct = backend_on(&postgres_url(), 2, PostgresConfig::new()).await;
    let mut admin = PgConnection::connect(&postgres_url()).await.unwrap();
    let listener_pids = async |admin: &mut PgConnection| -> Vec<i32> {
        sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
            .bind(format!("{application} (syncguard listener)"))
            .fetch_all(admin)
            .await
            .unwrap()
    };
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .retry(
            syncguard::RetryPolicy::wait_for(Duration::from_secs(120))
                .with_backoff(syncguard::Backoff::Fixed)
                .with_jitter(syncguard::Jitter::None)
                .with_base_delay(Duration::from_secs(30)),
        )
        .build()
        .unwrap();
    let spawn_waiter = |key: &str| {
        let (backend, key, options) = (backend.clone(), key.to_owned(), options.clone());
        tokio::spawn(async move { syncguard::acquire(&backend, &key, &options).await })
    };

    let key = key("listener-partition");
    let holder = direct
        .acquire(&key, Duration::from_secs(60))
        .await
        .unwrap()
        .lease()
        .unwrap();
    let waiter = spawn_waiter(&key);
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let [pid] = listener_pids(&mut admin).await[..] {
            break pid;
        }
        assert!(Instant::now() < deadline, "the waiter's backend listens");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    proxy.stall();
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(direct.release(&holder.lock_id).await.unwrap().is_released());
    // Reconnects fail meanwhile (each within the connect timeout), at growing intervals.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiter.is_finished(), "nothing heard during the partition");
    let healed = Instant::now();
    proxy.resume();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the missed release is caught up when the listener is back, not at the poll")
        .unwrap()
        .expect("the waiter takes the lock");
    println!(
        "lock taken {:?} after the partition healed",
        healed.elapsed()
    );
    let second = listener_pids(&mut admin).await;
    assert_eq!(second.len(), 1, "one listening connection: {second:?}");
    assert_ne!(second[0], first, "another connection");

    // Prompt again.
    let waiter = spawn_waiter(&key);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    println!("hand-over after the partition: {:?}", released.elapsed());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_min_hold_release_landing_late_keeps_nothing_past_min_hold() {
    let proxy = Proxy::start(&server_addr()).await;
    let config = PostgresConfig::new().with_operation_timeout(Duration::from_millis(500));
    let cut_off = backend_on(&url_at(proxy.addr()), 2, config).await;
    let direct = backend_on(&postgres_url(), 2, PostgresConfig::new()).await;
    let key = key("min-hold-partition");
    // Warm a connection, so that the operations go out on it. A connection whose statement
    // timed out is closed, so the held release may never be delivered: the test checks the
    // bound, not the landing.
    assert!(!cut_off.is_locked(&key).await.unwrap());
    min_hold_partition::a_min_hold_release_landing_late_keeps_nothing_past_min_hold(
        cut_off,
        direct,
        &proxy,
        &key,
        Duration::from_secs(5),
        false,
    )
    .await;
}

/// Ways a DBA might alter the tables the schema owns. After each, an acquire (the plain
/// statement of a free key, and the acquire function, which `acquire_as` calls) either
/// succeeds with what it stored, or fails and leaves no live lock behind.
const ALTERATIONS: &[&str] = &[
    "ALTER TABLE {locks} ALTER COLUMN expires_at_ms TYPE NUMERIC",
    "ALTER TABLE {locks} ALTER COLUMN expires_at_ms TYPE DOUBLE PRECISION",
    "ALTER TABLE {locks} ALTER COLUMN expires_at_ms TYPE INTEGER",
    "ALTER TABLE {locks} ALTER COLUMN acquired_at_ms TYPE NUMERIC",
    "ALTER TABLE {locks} ALTER COLUMN fence TYPE VARCHAR(20)",
    "ALTER TABLE {locks} ADD CONSTRAINT short_ids CHECK (length(lock_id) < 10)",
    "ALTER TABLE {locks} ADD COLUMN team TEXT NOT NULL",
    "ALTER TABLE {fences} ALTER COLUMN fence TYPE NUMERIC",
    "ALTER TABLE {fences} ALTER COLUMN key_debug TYPE VARCHAR(3)",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_acquire_stores_nothing_whatever_the_tables_were_altered_to() {
    let pool = PostgresBackend::pool_options()
        .max_connections(2)
        .connect(&postgres_url())
        .await
        .expect("connect to the test PostgreSQL");
    for (n, alteration) in ALTERATIONS.iter().enumerate() {
        let schema = format!("altered_{n}_{}", std::process::id());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE"
        )))
        .execute(&pool)
        .await
        .unwrap();
        let config = PostgresConfig::new().with_schema(&schema);
        setup_schema(&pool, &config).await.expect("setup_schema");
        let locks = format!("{schema}.syncguard_locks");
        let fences = format!("{schema}.syncguard_fence_counters");
        let sql = alteration
            .replace("{locks}", &locks)
            .replace("{fences}", &fences);
        sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .execute(&pool)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
        let backend = PostgresBackend::new(pool.clone(), config).unwrap();

        for holder in [None, Some("dba-test")] {
            let key = key("altered");
            let outcome = match holder {
                None => backend.acquire(&key, Duration::from_secs(30)).await,
                Some(holder) => {
                    backend
                        .acquire_as(&key, Duration::from_secs(30), holder)
                        .await
                }
            };
            let storage_key = make_storage_key("", &key, MAX_STORAGE_KEY_BYTES, 0).unwrap();
            let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {locks} WHERE key = $1"
            )))
            .bind(&storage_key)
            .fetch_one(&pool)
            .await
            .unwrap();
            match outcome {
                Err(error) => {
                    assert_eq!(
                        rows, 0,
                        "{sql} ({holder:?}): failed ({error}) but stored a lock"
                    );
                }
                Ok(outcome) => {
                    let lease = outcome
                        .lease()
                        .unwrap_or_else(|| panic!("{sql} ({holder:?}): a free key is contended"));
                    assert_eq!(rows, 1, "{sql} ({holder:?})");
                    // Refused by the plain statement's caller, then by the acquire function.
                    for _ in 0..2 {
                        let refused = backend.acquire(&key, Duration::from_secs(30)).await;
                        assert!(
                            matches!(&refused, Ok(outcome) if outcome.is_contended()),
                            "{sql} ({holder:?}): a held key is contended, got {refused:?}"
                        );
                    }
                    let stored: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                        "SELECT expires_at_ms::TEXT FROM {locks} WHERE key = $1"
                    )))
                    .bind(&storage_key)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                    assert_eq!(
                        stored.parse::<f64>().unwrap(),
                        lease.expires_at_ms as f64,
                        "{sql} ({holder:?}): the lease is what was stored"
                    );
                    assert!(
                        backend.release(&lease.lock_id).await.unwrap().is_released(),
                        "{sql} ({holder:?})"
                    );
                }
            }
        }
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&pool)
            .await
            .unwrap();
    }
}
