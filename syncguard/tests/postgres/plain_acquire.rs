//! The plain statement that takes a free key: a key taken while it runs, and one past its
//! timeout.

use std::time::Duration;

use sqlx::PgPool;
use syncguard::backend::LockBackend;
use syncguard::backend::key::make_storage_key;
use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
use syncguard::{ErrorCode, LockId, conformance};

use crate::{pool, takes_and_releases, unique};

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
