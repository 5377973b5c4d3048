//! The PostgreSQL backend against a real PostgreSQL server (started by
//! `bash scripts/test-all.sh`, which exports `SYNCGUARD_TEST_POSTGRES_URL`).

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool, Row};
use syncguard::backend::LockBackend;
use syncguard::key::{make_fence_key, make_storage_key};
use syncguard::postgres::{PostgresBackend, PostgresConfig, SCHEMA_SQL, setup_schema};
use syncguard::{ErrorCode, LockId, LockOptions, conformance};

#[path = "support/pg_reference.rs"]
mod pg_reference;
use pg_reference::reference_acquire;

#[path = "support/urls.rs"]
mod urls;
use urls::postgres_url;

async fn pool(max_connections: u32) -> PgPool {
    PostgresBackend::pool_options()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&postgres_url())
        .await
        .expect("connect to the test PostgreSQL")
}

async fn backend_with(config: PostgresConfig) -> PostgresBackend {
    let pool = pool(70).await;
    setup_schema(&pool, &config).await.expect("setup_schema");
    PostgresBackend::new(pool, config).expect("valid config")
}

async fn backend() -> PostgresBackend {
    backend_with(PostgresConfig::new()).await
}

/// A table-name suffix no other test (or run) uses.
fn unique(label: &str) -> String {
    format!(
        "{label}_{}",
        LockId::generate().as_str().to_lowercase().replace('-', "_")
    )
    .chars()
    .take(30)
    .collect()
}

mod conformance_suite {
    syncguard::conformance_tests!(super::backend());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_workers_on_one_key_for_five_seconds() {
    conformance::mutual_exclusion_with(backend().await, 64, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn bundled_schema_sql_matches_setup_schema_and_is_idempotent() {
    let pool = pool(4).await;
    assert_eq!(PostgresConfig::new().schema_sql().unwrap(), SCHEMA_SQL);
    for _ in 0..2 {
        // As a migration tool would apply it: in a transaction (serialized with the other
        // tests' setup_schema on the same advisory lock).
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('syncguard:setup_schema'))")
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::raw_sql(SCHEMA_SQL).execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
        setup_schema(&pool, &PostgresConfig::new()).await.unwrap();
    }
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE tablename = 'syncguard_locks' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        indexes,
        [
            "idx_syncguard_locks_expires",
            "idx_syncguard_locks_lock_id",
            "syncguard_locks_pkey"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_setup_with_custom_schema_and_names() {
    let schema = unique("s");
    let config = PostgresConfig::new()
        .with_schema(&schema)
        .with_lock_table("App_Locks")
        .with_fence_table("app_fences");
    let pool = pool(8).await;
    let setups: Vec<_> = (0..4)
        .map(|_| {
            let (pool, config) = (pool.clone(), config.clone());
            tokio::spawn(async move { setup_schema(&pool, &config).await })
        })
        .collect();
    for setup in setups {
        setup.await.unwrap().expect("concurrent setup_schema");
    }
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = $1 ORDER BY 1",
    )
    .bind(&schema)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(tables, ["App_Locks", "app_fences"]);

    let backend = PostgresBackend::new(pool.clone(), config).unwrap();
    let lease = backend
        .acquire("custom:1", Duration::from_secs(30))
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(lease.fence.get(), 1);
    let stored: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT lock_id FROM \"{schema}\".\"App_Locks\" WHERE key = 'custom:1'"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stored, lease.lock_id.as_str());
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

#[tokio::test]
async fn invalid_and_injected_names_are_rejected_and_change_nothing() {
    let pool = pool(2).await;
    // Every test creates its tables through setup_schema, which takes this advisory lock:
    // holding it keeps the other tests' tables out of the count below.
    let mut quiet = PgConnection::connect(&postgres_url()).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(hashtext('syncguard:setup_schema'))")
        .execute(&mut quiet)
        .await
        .unwrap();
    let tables_before: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables")
        .fetch_one(&pool)
        .await
        .unwrap();
    let attempts = [
        PostgresConfig::new().with_lock_table("locks; DROP TABLE syncguard_fence_counters; --"),
        PostgresConfig::new().with_fence_table("f\" (x int); DROP TABLE syncguard_locks; --"),
        PostgresConfig::new().with_schema("public\"; DROP SCHEMA public CASCADE; --"),
        PostgresConfig::new().with_lock_table(""),
        PostgresConfig::new().with_lock_table("9lives"),
        PostgresConfig::new().with_lock_table("x".repeat(64)),
        PostgresConfig::new()
            .with_lock_table("same")
            .with_fence_table("same"),
    ];
    for config in attempts {
        let error = setup_schema(&pool, &config).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{config:?}");
        let error = PostgresBackend::new(pool.clone(), config.clone()).unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{config:?}");
    }
    let tables_after: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables")
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::query("SELECT pg_advisory_unlock(hashtext('syncguard:setup_schema'))")
        .execute(&mut quiet)
        .await
        .unwrap();
    assert_eq!(tables_before, tables_after);
}

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
    let built = PostgresBackend::builder(&postgres_url())
        .config(config.clone())
        .build()
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
    let error = PostgresBackend::builder("not a url")
        .build()
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
    let error = PostgresBackend::builder(&postgres_url())
        .config(PostgresConfig::new().with_lock_table("a-b"))
        .build()
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
}

#[tokio::test]
async fn fences_keep_increasing_across_a_new_pool() {
    let key = conformance::unique_key("restart");
    let mut last = 0;
    for _ in 0..3 {
        // A fresh pool each round, as a restarted service would have.
        let backend = backend().await;
        for _ in 0..2 {
            let lease = backend
                .acquire(&key, Duration::from_secs(30))
                .await
                .unwrap()
                .lease()
                .unwrap();
            assert_eq!(lease.fence.get(), last + 1);
            last = lease.fence.get();
            assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
        }
        backend.pool().close().await;
    }
    assert_eq!(last, 6);
}

#[tokio::test]
async fn rows_are_stored_exactly_as_the_reference_stores_them() {
    let backend = backend().await;
    let key = format!("{}:caf\u{e9}", conformance::unique_key("layout"));
    let lease = backend
        .acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .lease()
        .unwrap();
    let storage_key = make_storage_key("", &key, 1700, 0).unwrap();
    let row = sqlx::query(
        "SELECT key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key FROM syncguard_locks WHERE lock_id = $1",
    )
    .bind(lease.lock_id.as_str())
    .fetch_one(backend.pool())
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>("key"), storage_key);
    assert_eq!(row.get::<String, _>("user_key"), key);
    assert_eq!(row.get::<String, _>("fence"), "000000000000001");
    assert_eq!(
        row.get::<i64, _>("expires_at_ms") as u64,
        lease.expires_at_ms
    );
    assert_eq!(
        row.get::<i64, _>("expires_at_ms") - row.get::<i64, _>("acquired_at_ms"),
        30_000
    );
    let fence_row =
        sqlx::query("SELECT fence, key_debug FROM syncguard_fence_counters WHERE fence_key = $1")
            .bind(make_fence_key("", &storage_key, 1700, 0).unwrap())
            .fetch_one(backend.pool())
            .await
            .unwrap();
    assert_eq!(fence_row.get::<i64, _>("fence"), 1);
    assert_eq!(fence_row.get::<String, _>("key_debug"), key);

    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    // No valid key is ever hashed here: 512-byte keys stay below the 1700-byte limit.
    assert_eq!(
        make_storage_key("", &"k".repeat(512), 1700, 0).unwrap(),
        "k".repeat(512)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rust_and_reference_acquires_exclude_each_other() {
    let backend = backend().await;
    let key = conformance::unique_key("mixed");
    let holders = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(std::sync::Mutex::new(Vec::new()));
    let end = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let (backend, key) = (backend.clone(), key.clone());
        let (holders, overlaps, fences) = (holders.clone(), overlaps.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = PgConnection::connect(&postgres_url()).await.unwrap();
            while tokio::time::Instant::now() < end {
                // Even workers are Rust services, odd ones TypeScript reference services.
                let fence = if worker % 2 == 0 {
                    backend
                        .acquire(&key, Duration::from_secs(30))
                        .await
                        .unwrap()
                        .lease()
                        .map(|lease| (lease.fence.get(), Some(lease)))
                } else {
                    reference_acquire(&mut conn, &key, 30_000)
                        .await
                        .map(|fence| (fence, None))
                };
                let Some((fence, lease)) = fence else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                };
                if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                fences.lock().unwrap().push(fence);
                tokio::task::yield_now().await;
                holders.fetch_sub(1, Ordering::SeqCst);
                // Release: Rust leases through the backend, reference ones by deleting the row
                // as the reference's release does (after its ownership check).
                match lease {
                    Some(lease) => {
                        assert!(backend.release(&lease.lock_id).await.unwrap().is_released())
                    }
                    None => {
                        let storage_key = make_storage_key("", &key, 1700, 0).unwrap();
                        sqlx::query("DELETE FROM syncguard_locks WHERE key = $1 AND fence = $2")
                            .bind(storage_key)
                            .bind(format!("{fence:015}"))
                            .execute(&mut conn)
                            .await
                            .unwrap();
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let fences = fences.lock().unwrap().clone();
    assert!(fences.len() >= 20, "only {} acquisitions", fences.len());
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    let mut sorted = fences.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), fences.len(), "duplicate fences");
    assert_eq!(sorted, fences, "fences increase in holding order");
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
    let lease = backend
        .acquire(&key, Duration::from_secs(5))
        .await
        .unwrap()
        .lease()
        .expect("free once the blocker is gone");
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

/// Fence rows are never deleted: a trigger makes any DELETE or TRUNCATE of the fence table
/// fail, and every path that deletes lock rows (release, expiry, sweep, is_locked cleanup)
/// still succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_statement_ever_deletes_fence_rows() {
    let fences = unique("fences");
    let config = PostgresConfig::new()
        .with_lock_table(unique("locks"))
        .with_fence_table(&fences)
        .with_cleanup_in_is_locked(true);
    let backend = backend_with(config).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION \"{fences}_guard\"() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'fence rows must never be deleted'; END $$; \
         CREATE TRIGGER no_delete BEFORE DELETE OR TRUNCATE ON \"{fences}\" \
         FOR EACH STATEMENT EXECUTE FUNCTION \"{fences}_guard\"();"
    )))
    .execute(backend.pool())
    .await
    .unwrap();

    let keys: Vec<String> = (0..3)
        .map(|i| conformance::unique_key(&format!("nodelete{i}")))
        .collect();
    // Released, expired and swept, expired and cleaned up by is_locked.
    let released = backend
        .acquire(&keys[0], Duration::from_secs(30))
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert!(
        backend
            .release(&released.lock_id)
            .await
            .unwrap()
            .is_released()
    );
    for key in &keys[1..] {
        backend
            .acquire(key, Duration::from_millis(50))
            .await
            .unwrap()
            .lease()
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50 + 1000 + 2000 + 700)).await;
    assert_eq!(backend.sweep_expired().await.unwrap(), 2);
    let again = backend
        .acquire(&keys[2], Duration::from_millis(50))
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(again.fence.get(), 2, "the counter survived the sweep");
    tokio::time::sleep(Duration::from_millis(50 + 1000 + 2000 + 700)).await;
    assert!(!backend.is_locked(&keys[2]).await.unwrap());
    // The cleanup is fire-and-forget; wait for it to land.
    let locks_table = backend.config().lock_table().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{locks_table}\""
        )))
        .fetch_one(backend.pool())
        .await
        .unwrap();
        if rows == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "is_locked cleanup did not delete the expired row"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let counters: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT fence FROM \"{fences}\" ORDER BY fence"
    )))
    .fetch_all(backend.pool())
    .await
    .unwrap();
    assert_eq!(counters, [1, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_and_cleanup_never_touch_live_locks() {
    let config = PostgresConfig::new()
        .with_lock_table(unique("sweep"))
        .with_fence_table(unique("sweepf"))
        .with_cleanup_in_is_locked(true);
    let backend = backend_with(config).await;
    let live_key = conformance::unique_key("live");
    let live = backend
        .acquire(&live_key, Duration::from_millis(600))
        .await
        .unwrap()
        .lease()
        .unwrap();
    // Keep it alive through what would be its expiry, sweeping and checking all the while.
    let options = LockOptions::builder()
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let guard = syncguard::acquire(&backend, &conformance::unique_key("kept"), &options)
        .await
        .unwrap();
    for _ in 0..8 {
        assert_eq!(backend.sweep_expired().await.unwrap(), 0);
        assert!(backend.is_locked(guard.key()).await.unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!guard.is_lost());
    assert!(guard.release().await.unwrap());
    // The unextended lock is expired but inside the cleanup guard: still not swept.
    assert_eq!(backend.sweep_expired().await.unwrap(), 0);
    assert!(!backend.release(&live.lock_id).await.unwrap().is_released());
}
