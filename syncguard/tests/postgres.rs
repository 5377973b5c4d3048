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

#[path = "support/frozen.rs"]
mod frozen;

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
/// Takes the lock on `key`, which must be free (`why` says why it should be), and releases it.
async fn takes_and_releases(backend: &PostgresBackend, key: &str, why: &str) {
    let lease = backend
        .acquire(key, Duration::from_secs(30))
        .await
        .unwrap()
        .lease()
        .unwrap_or_else(|| panic!("{key}: {why}"));
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

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
        // Only the default schema's: other tests make schemas of their own with the same tables.
        "SELECT indexname::text FROM pg_indexes WHERE tablename = 'syncguard_locks' \
         AND schemaname = current_schema() ORDER BY 1",
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
    takes_and_releases(&backend, &key, "free once the blocker is gone").await;
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

/// Events of `sqlx::postgres::notice` (server notices, which sqlx logs at INFO) seen on this
/// thread while the guard lives.
mod notices {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::{Event, Level, Subscriber};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

    #[derive(Clone, Default)]
    pub(crate) struct Notices(Arc<Mutex<Vec<(Level, String)>>>);

    impl Notices {
        pub(crate) fn install() -> (Self, tracing::subscriber::DefaultGuard) {
            let notices = Self::default();
            let subscriber = tracing_subscriber::registry().with(notices.clone());
            (notices, tracing::subscriber::set_default(subscriber))
        }

        pub(crate) fn seen(&self) -> Vec<(Level, String)> {
            self.0.lock().unwrap().clone()
        }
    }

    struct Message(String);

    impl Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}");
            }
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == "message" {
                self.0 = value.to_owned();
            }
        }
    }

    impl<S: Subscriber> Layer<S> for Notices {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            if event
                .metadata()
                .target()
                .starts_with("sqlx::postgres::notice")
            {
                let mut message = Message(String::new());
                event.record(&mut message);
                self.0
                    .lock()
                    .unwrap()
                    .push((*event.metadata().level(), message.0));
            }
        }
    }
}

#[tokio::test]
async fn setup_schema_is_quiet_when_the_schema_exists() {
    let (notices, _guard) = notices::Notices::install();
    let pool = pool(2).await;
    let config = PostgresConfig::new()
        .with_schema(unique("quiet"))
        .with_lock_table(unique("quietl"))
        .with_fence_table(unique("quietf"));
    setup_schema(&pool, &config)
        .await
        .expect("first setup_schema");
    // Everything exists now: PostgreSQL would say "relation ... already exists, skipping" for
    // each CREATE ... IF NOT EXISTS, and sqlx would log each notice at INFO.
    setup_schema(&pool, &config)
        .await
        .expect("second setup_schema");
    setup_schema(&pool, &config)
        .await
        .expect("third setup_schema");
    assert_eq!(
        notices.seen(),
        [],
        "setup_schema made PostgreSQL send notices"
    );

    // The quieting is local to setup_schema's transaction: the pooled connections still
    // report notices to the application.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS \"{}\".\"{}\" (key TEXT)",
        config.schema().unwrap_or("public"),
        config.lock_table()
    )))
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(notices.seen().len(), 1, "{:?}", notices.seen());
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

// Holders (`acquire_as`, `extend_by`) on PostgreSQL: the schema upgrade, the reference's
// writes, round trips, and many holders on one key. (The conformance suite checks the
// contract itself.)

/// The lock table as the TypeScript reference (and syncguard before holders) creates it, with
/// a live lock of such a client in it; then `setup_schema` adds the column, and the old lock
/// reads as one without holder. Once the column is there, `setup_schema` no longer locks the
/// table: it finishes while a reader holds the table.
#[tokio::test]
async fn setup_schema_adds_the_holder_column_to_an_older_table() {
    let schema = unique("older");
    let config = PostgresConfig::new().with_schema(&schema);
    let pool = pool(4).await;
    let key = conformance::unique_key("older");
    let old_lock = LockId::generate();
    let mut tx = pool.begin().await.unwrap();
    // As setup_schema does, so that the table count of another test stays undisturbed.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('syncguard:setup_schema'))")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA \"{schema}\"; \
         CREATE TABLE \"{schema}\".syncguard_locks (key TEXT PRIMARY KEY, lock_id TEXT NOT NULL, \
           expires_at_ms BIGINT NOT NULL, acquired_at_ms BIGINT NOT NULL, fence TEXT NOT NULL, \
           user_key TEXT NOT NULL); \
         CREATE UNIQUE INDEX idx_syncguard_locks_lock_id ON \"{schema}\".syncguard_locks (lock_id); \
         CREATE INDEX idx_syncguard_locks_expires ON \"{schema}\".syncguard_locks (expires_at_ms); \
         CREATE TABLE \"{schema}\".syncguard_fence_counters (fence_key TEXT PRIMARY KEY, \
           fence BIGINT NOT NULL DEFAULT 0, key_debug TEXT);"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".syncguard_locks \
         (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key) \
         SELECT $1, $2, now_ms + 60000, now_ms, '000000000000007', $1 \
         FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT AS now_ms) AS clock"
    )))
    .bind(make_storage_key("", &key, 1700, 0).unwrap())
    .bind(old_lock.as_str())
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".syncguard_fence_counters (fence_key, fence, key_debug) \
         VALUES ($1, 7, $2)"
    )))
    .bind(make_fence_key("", &make_storage_key("", &key, 1700, 0).unwrap(), 1700, 0).unwrap())
    .bind(&key)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();

    setup_schema(&pool, &config)
        .await
        .expect("setup_schema upgrades");
    let column: (String, String) = sqlx::query_as(
        "SELECT data_type::text, is_nullable::text FROM information_schema.columns \
         WHERE table_schema = $1 AND table_name = 'syncguard_locks' AND column_name = 'holder'",
    )
    .bind(&schema)
    .fetch_one(&pool)
    .await
    .expect("the holder column was added");
    assert_eq!(column, ("text".to_owned(), "YES".to_owned()));

    let backend = PostgresBackend::new(pool.clone(), config.clone()).unwrap();
    let old = syncguard::get_by_key_raw(&backend, &key)
        .await
        .unwrap()
        .expect("the old lock is live");
    assert_eq!(old.lock_id, old_lock);
    assert_eq!(old.holder, None, "an old row has no holder");
    assert_eq!(old.info.fence.get(), 7);
    let refused = backend
        .acquire_as(&key, Duration::from_secs(30), "client-a")
        .await
        .unwrap();
    assert!(
        refused.is_contended(),
        "a lock without holder is not re-entered"
    );
    assert!(backend.release(&old_lock).await.unwrap().is_released());
    let lease = backend
        .acquire_as(&key, Duration::from_secs(30), "client-a")
        .await
        .unwrap()
        .lease()
        .expect("free after the release");
    assert_eq!(lease.fence.get(), 8, "the old counter goes on");
    let raw = syncguard::get_by_id_raw(&backend, &lease.lock_id)
        .await
        .unwrap()
        .expect("held");
    assert_eq!(raw.holder.as_deref(), Some("client-a"));

    // A reader of the table in an open transaction: an ALTER TABLE would wait for it.
    let mut reader = PgConnection::connect(&postgres_url()).await.unwrap();
    let mut reading = reader.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{schema}\".syncguard_locks"
    )))
    .execute(&mut *reading)
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(10), setup_schema(&pool, &config))
        .await
        .expect("setup_schema of an up-to-date table does not wait for its readers")
        .unwrap();
    reading.rollback().await.unwrap();
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

/// The lock table as syncguard before the `contended` mark made it (with holders), holding a
/// live lock: a backend of this version refuses to release it before `setup_schema` has run
/// (the statements read and write the mark), saying what to run and changing nothing;
/// `setup_schema` adds the column, and rows written without the mark (NULL: not known) are
/// announced while new locks start unmarked.
#[tokio::test]
async fn releases_ask_for_setup_schema_then_announce_once_it_adds_the_mark() {
    let schema = unique("unmarked");
    let channel = unique("sgtest_ch");
    let config = PostgresConfig::new()
        .with_schema(&schema)
        .with_release_channel(&channel);
    let pool = pool(4).await;
    let mut tx = pool.begin().await.unwrap();
    // As setup_schema does, so that the table count of another test stays undisturbed.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('syncguard:setup_schema'))")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA \"{schema}\"; \
         CREATE TABLE \"{schema}\".syncguard_locks (key TEXT PRIMARY KEY, lock_id TEXT NOT NULL, \
           expires_at_ms BIGINT NOT NULL, acquired_at_ms BIGINT NOT NULL, fence TEXT NOT NULL, \
           user_key TEXT NOT NULL, holder TEXT); \
         CREATE UNIQUE INDEX idx_syncguard_locks_lock_id ON \"{schema}\".syncguard_locks (lock_id); \
         CREATE INDEX idx_syncguard_locks_expires ON \"{schema}\".syncguard_locks (expires_at_ms); \
         CREATE TABLE \"{schema}\".syncguard_fence_counters (fence_key TEXT PRIMARY KEY, \
           fence BIGINT NOT NULL DEFAULT 0, key_debug TEXT);"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    // A live lock, as an acquire that does not know the mark stores it.
    let insert_lock = async |key: &str| {
        let lock_id = LockId::generate();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO \"{schema}\".syncguard_locks \
             (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key) \
             SELECT $1, $2, now_ms + 60000, now_ms, '000000000000001', $1 \
             FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT AS now_ms) AS clock"
        )))
        .bind(make_storage_key("", key, 1700, 0).unwrap())
        .bind(lock_id.as_str())
        .execute(&pool)
        .await
        .unwrap();
        lock_id
    };
    let mut listener = sqlx::postgres::PgListener::connect(&postgres_url())
        .await
        .unwrap();
    listener.listen(&channel).await.unwrap();
    let mut next = async || {
        tokio::time::timeout(Duration::from_millis(500), listener.recv())
            .await
            .ok()
            .map(|received| received.unwrap().payload().to_owned())
    };

    let backend = PostgresBackend::new(pool.clone(), config.clone()).unwrap();
    let key = conformance::unique_key("unmarked");
    let lock_id = insert_lock(&key).await;
    let err = backend.release(&lock_id).await.unwrap_err();
    assert!(err.to_string().contains("setup_schema"), "{err}");
    let stored: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{schema}\".syncguard_locks WHERE lock_id = $1"
    )))
    .bind(lock_id.as_str())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stored, 1, "the failed release changed nothing");
    assert_eq!(next().await, None, "nothing announced");

    setup_schema(&pool, &config)
        .await
        .expect("setup_schema upgrades");
    let column: (String, String) = sqlx::query_as(
        "SELECT data_type::text, is_nullable::text FROM information_schema.columns \
         WHERE table_schema = $1 AND table_name = 'syncguard_locks' AND column_name = 'contended'",
    )
    .bind(&schema)
    .fetch_one(&pool)
    .await
    .expect("the contended column was added");
    assert_eq!(column, ("boolean".to_owned(), "YES".to_owned()));
    let mark = async |lock_id: &LockId| -> Option<bool> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT contended FROM \"{schema}\".syncguard_locks WHERE lock_id = $1"
        )))
        .bind(lock_id.as_str())
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(mark(&lock_id).await, None, "an old row's mark is not known");
    let ttl = Duration::from_secs(30);
    assert!(backend.acquire(&key, ttl).await.unwrap().is_contended());
    assert_eq!(
        mark(&lock_id).await,
        None,
        "a refusal leaves an unknown mark"
    );
    assert!(backend.release(&lock_id).await.unwrap().is_released());
    assert_eq!(next().await.as_deref(), Some(key.as_str()), "announced");

    let lease = backend.acquire(&key, ttl).await.unwrap().lease().unwrap();
    assert_eq!(
        mark(&lease.lock_id).await,
        Some(false),
        "a new lock is unmarked"
    );
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    assert_eq!(next().await, None, "nobody was refused: not announced");
}

/// The reference's acquire over an expired lock of a holder (an upsert that never names the
/// holder column) leaves a lock without holder: the old holder cannot re-enter it.
#[tokio::test]
async fn a_reference_acquire_over_an_expired_holder_lock_clears_the_holder() {
    let backend = backend().await;
    let key = conformance::unique_key("ref-over-holder");
    let short = backend
        .acquire_as(&key, Duration::from_millis(50), "client-a")
        .await
        .unwrap()
        .lease()
        .unwrap();
    // Past the ttl and the reference's 1 s tolerance.
    tokio::time::sleep(Duration::from_millis(50 + 1000 + 300)).await;
    let mut conn = PgConnection::connect(&postgres_url()).await.unwrap();
    let (fence, reference_lock) = pg_reference::reference_acquire_with_id(&mut conn, &key, 30_000)
        .await
        .expect("the expired lock is free for the reference");
    assert_eq!(fence, short.fence.get() + 1);
    let raw = syncguard::get_by_key_raw(&backend, &key)
        .await
        .unwrap()
        .expect("held by the reference client");
    assert_eq!(raw.lock_id.as_str(), reference_lock);
    assert_eq!(
        raw.holder, None,
        "the expired lock's holder is not carried over"
    );
    // Nor its contended mark (ours say nobody was refused): whether anyone was refused during
    // the new hold is not known, and its release would be announced.
    let mark: Option<bool> =
        sqlx::query_scalar("SELECT contended FROM syncguard_locks WHERE key = $1")
            .bind(make_storage_key("", &key, 1700, 0).unwrap())
            .fetch_one(backend.pool())
            .await
            .unwrap();
    assert_eq!(mark, None);
    let refused = backend
        .acquire_as(&key, Duration::from_secs(30), "client-a")
        .await
        .unwrap();
    assert!(refused.is_contended(), "client-a never took this lock");
    let stored: Option<String> =
        sqlx::query_scalar("SELECT holder FROM syncguard_locks WHERE key = $1")
            .bind(make_storage_key("", &key, 1700, 0).unwrap())
            .fetch_one(backend.pool())
            .await
            .unwrap();
    assert_eq!(stored, None);
    assert!(pg_reference::reference_release(&mut conn, &reference_lock).await);

    // Our own acquire over an expired lock of the same holder keeps the new holder.
    let short = backend
        .acquire_as(&key, Duration::from_millis(50), "client-a")
        .await
        .unwrap()
        .lease()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50 + 1000 + 300)).await;
    let next = backend
        .acquire_as(&key, Duration::from_secs(30), "client-a")
        .await
        .unwrap()
        .lease()
        .expect("expired: taken anew");
    assert_ne!(next.lock_id, short.lock_id, "a new lock, not a re-entry");
    assert!(next.fence > short.fence);
    let raw = syncguard::get_by_key_raw(&backend, &key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(raw.holder.as_deref(), Some("client-a"));
    assert!(backend.release(&next.lock_id).await.unwrap().is_released());
}

#[path = "../benches/support/mod.rs"]
mod bench_support;

/// `acquire_as` (taking a free key, and re-entering) costs the round trips of `acquire`, and
/// `extend_by` those of `extend`: one statement each. A refused acquire costs one too once
/// the key was refused lately (the first refusal runs the statement for free keys first).
#[tokio::test]
async fn holder_operations_cost_the_round_trips_of_the_plain_ones() {
    backend().await; // the schema
    let url = postgres_url();
    let upstream = bench_support::socket_addr_of(&url);
    let proxy = bench_support::RoundTripProxy::start(upstream).await;
    let separator = if url.contains('?') { '&' } else { '?' };
    let proxied = format!(
        "{}{separator}sslmode=disable",
        url.replacen(&upstream.to_string(), &proxy.addr.to_string(), 1)
    );
    let pool = PostgresBackend::pool_options()
        .max_connections(1)
        .connect(&proxied)
        .await
        .unwrap();
    let backend = PostgresBackend::new(pool, PostgresConfig::new()).unwrap();
    let ttl = Duration::from_secs(30);
    // Round trips of one operation, counted a moment after it (a connection that went back
    // to the pool would be pinged there: that would count with the operation).
    async fn counted<T>(
        proxy: &bench_support::RoundTripProxy,
        operation: impl std::future::Future<Output = T>,
    ) -> (T, u64) {
        let before = proxy.round_trips();
        let value = operation.await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        (value, proxy.round_trips() - before)
    }
    let key = conformance::unique_key("rtt");
    let mut counts = std::collections::BTreeMap::<&str, Vec<u64>>::new();
    // The first round prepares the statements on the connection; the others are counted.
    for round in 0..8 {
        let (plain, acquire) = counted(&proxy, backend.acquire(&key, ttl)).await;
        let plain = plain.unwrap().lease().unwrap();
        let (refused, _) = counted(&proxy, backend.acquire(&key, ttl)).await;
        assert!(refused.unwrap().is_contended());
        let (refused, refused_again) = counted(&proxy, backend.acquire(&key, ttl)).await;
        assert!(refused.unwrap().is_contended());
        let (extended, extend) = counted(&proxy, backend.extend(&plain.lock_id, ttl)).await;
        assert!(extended.unwrap().expires_at_ms().is_some());
        let (released, release) = counted(&proxy, backend.release(&plain.lock_id)).await;
        assert!(released.unwrap().is_released());
        let (taken, acquire_as) = counted(&proxy, backend.acquire_as(&key, ttl, "client-a")).await;
        let taken = taken.unwrap().lease().unwrap();
        let (again, reentry) = counted(&proxy, backend.acquire_as(&key, ttl, "client-a")).await;
        assert_eq!(again.unwrap().lease().unwrap().lock_id, taken.lock_id);
        let (extended, extend_by) = counted(&proxy, backend.extend_by(&taken.lock_id, ttl)).await;
        assert!(extended.unwrap().expires_at_ms().is_some());
        let (released, _) = counted(&proxy, backend.release(&taken.lock_id)).await;
        assert!(released.unwrap().is_released());
        if round > 0 {
            for (name, count) in [
                ("acquire", acquire),
                ("acquire refused again", refused_again),
                ("extend", extend),
                ("release", release),
                ("acquire_as", acquire_as),
                ("acquire_as re-entering", reentry),
                ("extend_by", extend_by),
            ] {
                counts.entry(name).or_default().push(count);
            }
        }
    }
    println!("round trips per operation: {counts:?}");
    // A connection goes back to the pool (and is pinged there) at most every 250 ms, adding a
    // round trip to whichever operation was being counted: the fewest of each is compared.
    let fewest = |name: &str| *counts[name].iter().min().unwrap();
    assert_eq!(fewest("acquire_as"), fewest("acquire"), "{counts:?}");
    assert_eq!(
        fewest("acquire_as re-entering"),
        fewest("acquire"),
        "{counts:?}"
    );
    assert_eq!(fewest("extend_by"), fewest("extend"), "{counts:?}");
    assert_eq!(
        fewest("acquire refused again"),
        fewest("acquire"),
        "{counts:?}"
    );
    assert_eq!(
        fewest("acquire"),
        fewest("release"),
        "one statement, as release: {counts:?}"
    );
    assert_eq!(
        fewest("acquire"),
        1,
        "one exchange per operation: the connection is kept, not pinged back into the pool"
    );
}

/// A live lock on `key` in `schema`'s table, inserted by another writer whose transaction
/// stays open (uncommitted) until the caller commits or rolls back the returned transaction.
async fn insert_uncommitted_lock(
    pool: &PgPool,
    schema: &str,
    key: &str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut writer = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".syncguard_locks \
         (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key, contended) \
         SELECT $1, $2, now_ms + 60000, now_ms, '999999999999999', $3, TRUE \
         FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT AS now_ms) AS clock"
    )))
    .bind(make_storage_key("", key, 1700, 0).unwrap())
    .bind(LockId::generate().as_str())
    .bind(key)
    .execute(&mut *writer)
    .await
    .unwrap();
    writer
}

/// Until the plain acquire statement of a backend on `schema` (its SQL names the schema)
/// waits on a row another transaction inserted.
async fn wait_for_the_plain_acquire(pool: &PgPool, schema: &str) {
    let waiting = "wait_event_type = 'Lock'";
    until_plain_acquires(
        pool,
        schema,
        waiting,
        true,
        "never waited on the uncommitted row",
    )
    .await;
}

/// Until no plain acquire statement of a backend on `schema` is running.
async fn wait_until_the_plain_acquire_ended(pool: &PgPool, schema: &str) {
    until_plain_acquires(pool, schema, "state = 'active'", false, "never ended").await;
}

/// Until some (`any`), or no, plain acquire statement of a backend on `schema` is in
/// `pg_stat_activity` with `condition`.
async fn until_plain_acquires(pool: &PgPool, schema: &str, condition: &str, any: bool, or: &str) {
    let statement = format!("%\"{schema}\"%pg_try_advisory_xact_lock%");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let found: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM pg_stat_activity WHERE {condition} AND query LIKE $1"
        )))
        .bind(&statement)
        .fetch_one(pool)
        .await
        .unwrap();
        if (found > 0) == any {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the plain acquire statement {or}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A free key taken by another writer between the snapshot of the plain statement for free
/// keys and its insert: the insert fails on the key's unique index, nothing of it stays (the
/// fence counter is as the last lock left it), and the acquire function answers: refused.
#[tokio::test]
async fn a_free_key_taken_during_the_plain_acquire_is_refused_and_costs_no_fence() {
    let schema = unique("racing");
    let config = PostgresConfig::new().with_schema(&schema);
    let pool = pool(4).await;
    setup_schema(&pool, &config).await.unwrap();
    let backend = PostgresBackend::new(pool.clone(), config).unwrap();
    let ttl = Duration::from_secs(30);
    let key = conformance::unique_key("racing");
    // A lock taken and released: the key's fence counter exists, the key has no row.
    let first = backend.acquire(&key, ttl).await.unwrap().lease().unwrap();
    assert!(backend.release(&first.lock_id).await.unwrap().is_released());
    let fence = async || -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT fence FROM \"{schema}\".syncguard_fence_counters WHERE key_debug = $1"
        )))
        .bind(&key)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(fence().await as u64, first.fence.get());

    // Another writer's live lock on the key, inserted and not yet committed.
    let writer = insert_uncommitted_lock(&pool, &schema, &key).await;
    let racing = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move { backend.acquire(&key, ttl).await }
    });
    wait_for_the_plain_acquire(&pool, &schema).await;
    writer.commit().await.unwrap();

    let outcome = racing.await.unwrap().unwrap();
    assert!(outcome.is_contended(), "{outcome:?}");
    assert_eq!(
        fence().await as u64,
        first.fence.get(),
        "the failed insert took its fence increment back"
    );
}

/// A plain acquire whose statement waits on another writer's uncommitted row past the
/// operation timeout fails within it; when that writer rolls back, the statement may still land
/// and take the lock under the failed call's lock id, which nobody holds: it is released in the
/// background, and the key is free again.
#[tokio::test]
async fn a_plain_acquire_past_its_timeout_leaves_nothing_held() {
    let schema = unique("stalled");
    let config = PostgresConfig::new()
        .with_schema(&schema)
        .with_operation_timeout(Duration::from_millis(300));
    let pool = pool(4).await;
    setup_schema(&pool, &config).await.unwrap();
    let backend = PostgresBackend::new(pool.clone(), config).unwrap();
    let key = conformance::unique_key("stalled");

    let writer = insert_uncommitted_lock(&pool, &schema, &key).await;
    let stalled = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move {
            let started = tokio::time::Instant::now();
            (
                backend.acquire(&key, Duration::from_secs(30)).await,
                started.elapsed(),
            )
        }
    });
    wait_for_the_plain_acquire(&pool, &schema).await;
    let (outcome, took) = stalled.await.unwrap();
    let error = outcome.unwrap_err();
    assert_eq!(error.code(), ErrorCode::NetworkTimeout, "{error}");
    assert!(took < Duration::from_secs(5), "returned after {took:?}");
    writer.rollback().await.unwrap();
    // The held statement goes on now, and takes the lock for nobody: once it has (and only
    // then can the test tell a release from a statement yet to land), it must be released.
    wait_until_the_plain_acquire_ended(&pool, &schema).await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while backend.is_locked(&key).await.unwrap() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lock of the failed acquire was never released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    takes_and_releases(&backend, &key, "free again").await;
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

/// 4 holders × 8 tasks on one key for 3 s: tasks of one holder share its lock (re-entry keeps
/// the lock id and fence), and never do two holders hold it at once; fresh locks get
/// increasing fences. A holder's lock is released by the last of its tasks to leave, while none
/// of its tasks is acquiring (so that no task is told it re-entered a lock being released);
/// each task holds for 2 ms and then stays out for 30 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_holders_of_eight_tasks_never_hold_one_key_together() {
    use syncguard::Fence;
    use syncguard::backend::Lease;
    use tokio::sync::RwLock;

    #[derive(Default)]
    struct Holder {
        /// Its tasks inside, and the lock they share.
        inside: std::sync::Mutex<(usize, Option<Lease>)>,
        /// Read by acquiring tasks, written by the task releasing.
        gate: RwLock<()>,
    }
    #[derive(Default)]
    struct Shared {
        /// Which holder is inside, and the last fresh fence.
        current: std::sync::Mutex<(Option<usize>, Option<Fence>)>,
        overlaps: AtomicUsize,
        fresh: AtomicUsize,
        reentries: AtomicUsize,
    }

    let backend = backend().await;
    let key = conformance::unique_key("holders-race");
    let holders: Arc<Vec<Holder>> = Arc::new((0..4).map(|_| Holder::default()).collect());
    let shared = Arc::new(Shared::default());
    let end = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for h in 0..4 {
        for _ in 0..8 {
            let (backend, key) = (backend.clone(), key.clone());
            let (holders, shared) = (holders.clone(), shared.clone());
            tasks.push(tokio::spawn(async move {
                let me = &holders[h];
                let name = format!("client-{h}");
                while tokio::time::Instant::now() < end {
                    let lease = {
                        let acquiring = me.gate.read().await;
                        let outcome = backend
                            .acquire_as(&key, Duration::from_secs(30), &name)
                            .await
                            .unwrap();
                        let Some(lease) = outcome.lease() else {
                            drop(acquiring);
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            continue;
                        };
                        let mut inside = me.inside.lock().unwrap();
                        let mut current = shared.current.lock().unwrap();
                        if current.0.is_some_and(|other| other != h) {
                            shared.overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        current.0 = Some(h);
                        match &inside.1 {
                            Some(shared_lease) => {
                                assert_eq!(lease.lock_id, shared_lease.lock_id, "re-entered");
                                assert_eq!(lease.fence, shared_lease.fence, "re-entered");
                                shared.reentries.fetch_add(1, Ordering::SeqCst);
                            }
                            None => {
                                assert!(
                                    current.1.is_none_or(|last| lease.fence > last),
                                    "fences increase"
                                );
                                current.1 = Some(lease.fence);
                                inside.1 = Some(lease.clone());
                                shared.fresh.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        inside.0 += 1;
                        drop((current, inside, acquiring));
                        lease
                    };
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    let releasing = me.gate.write().await;
                    let last = {
                        let mut inside = me.inside.lock().unwrap();
                        inside.0 -= 1;
                        if inside.0 == 0 {
                            inside.1 = None;
                            shared.current.lock().unwrap().0 = None;
                        }
                        inside.0 == 0
                    };
                    if last {
                        let released = backend.release(&lease.lock_id).await.unwrap();
                        assert!(released.is_released(), "its live lock: {released:?}");
                    }
                    drop(releasing);
                    // Out for a while, so that the holder's tasks all leave now and then and
                    // its lock goes to the next holder.
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (fresh, reentries) = (
        shared.fresh.load(Ordering::SeqCst),
        shared.reentries.load(Ordering::SeqCst),
    );
    println!("{fresh} locks taken, {reentries} re-entries");
    assert_eq!(
        shared.overlaps.load(Ordering::SeqCst),
        0,
        "two holders at once"
    );
    assert!(fresh >= 8, "only {fresh} locks taken");
    assert!(reentries >= 8, "only {reentries} re-entries");
    assert!(
        !backend.is_locked(&key).await.unwrap(),
        "every lock released"
    );
}

/// An `acquire_as` for `holder` that times out while its statement waits on the key; the
/// statement lands (takes the lock) once the call's first background release has had time to
/// find nothing. Returns when it has landed: the key's fence counter moved.
async fn lose_an_acquire_as(backend: &PostgresBackend, key: &str, holder: &str) {
    let storage_key = make_storage_key("", key, 1700, 0).unwrap();
    let fence_key = make_fence_key("", &storage_key, 1700, 0).unwrap();
    let mut blocker = PgConnection::connect(&postgres_url()).await.unwrap();
    let mut tx = blocker.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(&storage_key)
        .execute(&mut *tx)
        .await
        .unwrap();
    let error = backend
        .acquire_as(key, Duration::from_secs(30), holder)
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::NetworkTimeout, "{error}");
    tokio::time::sleep(Duration::from_millis(250)).await;
    tx.rollback().await.unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let fence: Option<i64> =
            sqlx::query_scalar("SELECT fence FROM syncguard_fence_counters WHERE fence_key = $1")
                .bind(&fence_key)
                .fetch_optional(backend.pool())
                .await
                .unwrap();
        if fence.is_some() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lost statement never landed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A lost `acquire_as` whose lock is claimed before its background releases are done: by its
/// holder's next `acquire_as`, which re-enters it and is told it holds it, or by an extend of
/// its lock id (as `syncguard-server`'s renew does after looking the lock up). The releases of
/// the lost call leave that lock to its holder.
#[tokio::test]
async fn a_lost_acquire_as_claimed_is_left_to_its_holder() {
    let operation_timeout = Duration::from_millis(300);
    let backend =
        backend_with(PostgresConfig::new().with_operation_timeout(operation_timeout)).await;
    for claim in ["re-entry", "extend_by"] {
        lost_acquire_as_claimed_by(&backend, claim, operation_timeout).await;
    }
}

async fn lost_acquire_as_claimed_by(backend: &PostgresBackend, claim: &str, timeout: Duration) {
    // The claim races the lost call's releases (the first may land after the statement):
    // tried until it claimed the lock the lost call took.
    for _ in 0..5 {
        let key = conformance::unique_key("lost-acquire-as");
        lose_an_acquire_as(backend, &key, "client-a").await;
        let Some(landed) = syncguard::get_by_key_raw(backend, &key).await.unwrap() else {
            continue; // released before the claim: nothing to hand over
        };
        let claimed = match claim {
            "re-entry" => {
                let lease = backend
                    .acquire_as(&key, Duration::from_secs(30), "client-a")
                    .await
                    .unwrap()
                    .lease()
                    .expect("re-entered or taken");
                if lease.lock_id != landed.lock_id {
                    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
                    continue;
                }
                true
            }
            _ => {
                let by = Duration::from_secs(30);
                let extended = backend.extend_by(&landed.lock_id, by).await.unwrap();
                extended.expires_at_ms().is_some()
            }
        };
        if !claimed {
            continue;
        }
        // Longer than the background releases take (three, `2 × operation timeout` apart).
        tokio::time::sleep(timeout * 2 * 3 + Duration::from_millis(500)).await;
        let raw = syncguard::get_by_key_raw(backend, &key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("released under its holder after a {claim}"));
        assert_eq!(raw.lock_id, landed.lock_id);
        assert!(backend.release(&raw.lock_id).await.unwrap().is_released());
        return;
    }
    panic!("the {claim} never came before the lost call's releases");
}

/// A lost `acquire_as` that nobody claimed is released in the background, as a plain
/// acquire in doubt is: its key is free long before the lock's 30 s ttl.
#[tokio::test]
async fn a_lost_acquire_as_nobody_claimed_is_released() {
    let operation_timeout = Duration::from_millis(300);
    let backend =
        backend_with(PostgresConfig::new().with_operation_timeout(operation_timeout)).await;
    let key = conformance::unique_key("lost-acquire-as-orphan");
    lose_an_acquire_as(&backend, &key, "client-a").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while backend.is_locked(&key).await.unwrap() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lock of the lost acquire_as was never released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let other = backend
        .acquire_as(&key, Duration::from_secs(30), "client-b")
        .await
        .unwrap()
        .lease()
        .expect("another holder takes the freed key");
    assert_eq!(other.fence.get(), 2, "the lost call took fence 1");
    assert!(backend.release(&other.lock_id).await.unwrap().is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_takes_no_step_past_its_lease() {
    let key = format!("frozen:{}", LockId::generate());
    frozen::a_frozen_holder_takes_no_step_past_its_lease(backend, &key).await;
}
