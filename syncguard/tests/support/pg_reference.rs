//! The SyncGuard reference implementation's PostgreSQL operations, statement by statement, as
//! a TypeScript service runs them against the same tables: shared by the interoperability test
//! and the benchmark (which compares against them in the same run).

#![allow(dead_code, unreachable_pub)]

use sqlx::{Connection, PgConnection};
use syncguard::LockId;
use syncguard::backend::key::{make_fence_key, make_storage_key};

/// The reference's acquire: one transaction of eight round trips (BEGIN, the server time, the
/// advisory lock, `SELECT ... FOR UPDATE`, the two fence statements, the lock upsert, COMMIT).
/// Returns the fence and the lock id, or `None` when the key is held.
pub async fn reference_acquire_with_id(
    conn: &mut PgConnection,
    key: &str,
    ttl_ms: i64,
) -> Option<(u64, String)> {
    let storage_key = make_storage_key("", key, 1700, 0).unwrap();
    let fence_key = make_fence_key("", &storage_key, 1700, 0).unwrap();
    let lock_id = LockId::generate().as_str().to_owned();
    let mut tx = conn.begin().await.unwrap();
    let now: i64 = sqlx::query_scalar("SELECT floor(EXTRACT(EPOCH FROM NOW()) * 1000)::bigint")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(&storage_key)
        .execute(&mut *tx)
        .await
        .unwrap();
    let current: Option<i64> =
        sqlx::query_scalar("SELECT expires_at_ms FROM syncguard_locks WHERE key = $1 FOR UPDATE")
            .bind(&storage_key)
            .fetch_optional(&mut *tx)
            .await
            .unwrap();
    if current.is_some_and(|expires| expires > now - 1000) {
        tx.rollback().await.unwrap();
        return None;
    }
    sqlx::query(
        "INSERT INTO syncguard_fence_counters (fence_key, fence, key_debug) VALUES ($1, 0, $2) \
         ON CONFLICT (fence_key) DO NOTHING",
    )
    .bind(&fence_key)
    .bind(key)
    .execute(&mut *tx)
    .await
    .unwrap();
    let fence: i64 = sqlx::query_scalar(
        "UPDATE syncguard_fence_counters SET fence = fence + 1 WHERE fence_key = $1 RETURNING fence",
    )
    .bind(&fence_key)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO syncguard_locks (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, \
         expires_at_ms = EXCLUDED.expires_at_ms, acquired_at_ms = EXCLUDED.acquired_at_ms, \
         fence = EXCLUDED.fence, user_key = EXCLUDED.user_key",
    )
    .bind(&storage_key)
    .bind(&lock_id)
    .bind(now + ttl_ms)
    .bind(now)
    .bind(format!("{fence:015}"))
    .bind(key)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    Some((fence as u64, lock_id))
}

/// As [`reference_acquire_with_id`], the fence only.
pub async fn reference_acquire(conn: &mut PgConnection, key: &str, ttl_ms: i64) -> Option<u64> {
    reference_acquire_with_id(conn, key, ttl_ms)
        .await
        .map(|(fence, _)| fence)
}

/// The reference's release: one transaction of five round trips (BEGIN, the server time,
/// `SELECT ... FOR UPDATE` by lock id, DELETE, COMMIT). Returns whether it released.
pub async fn reference_release(conn: &mut PgConnection, lock_id: &str) -> bool {
    let mut tx = conn.begin().await.unwrap();
    let now: i64 = sqlx::query_scalar("SELECT floor(EXTRACT(EPOCH FROM NOW()) * 1000)::bigint")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let row: Option<(String, String, i64)> = sqlx::query_as(
        "SELECT key, lock_id, expires_at_ms FROM syncguard_locks WHERE lock_id = $1 FOR UPDATE",
    )
    .bind(lock_id)
    .fetch_optional(&mut *tx)
    .await
    .unwrap();
    let Some((key, stored_id, expires)) = row else {
        tx.rollback().await.unwrap();
        return false;
    };
    if stored_id != lock_id || expires <= now - 1000 {
        tx.rollback().await.unwrap();
        return false;
    }
    sqlx::query("DELETE FROM syncguard_locks WHERE key = $1")
        .bind(key)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    true
}
