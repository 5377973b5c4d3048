//! `setup_schema` and `SCHEMA_SQL`: idempotent, concurrent, quiet, refusing bad names, and
//! upgrading tables created by older versions.

use std::time::Duration;

use sqlx::{Connection, PgConnection};
use syncguard::backend::LockBackend;
use syncguard::backend::key::{make_fence_key, make_storage_key};
use syncguard::postgres::{PostgresBackend, PostgresConfig, SCHEMA_SQL, setup_schema};
use syncguard::{ErrorCode, LockId, conformance};

use crate::{pool, postgres_url, unique};

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
    let old = syncguard::get_by_key(&backend, &key)
        .await
        .unwrap()
        .map(syncguard::LockInfo::reveal)
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
    let raw = syncguard::get_by_id(&backend, &lease.lock_id)
        .await
        .unwrap()
        .map(syncguard::LockInfo::reveal)
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
