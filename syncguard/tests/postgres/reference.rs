//! The storage layout and its compatibility with the reference implementation: rows stored as
//! it stores them, acquires that exclude each other, fences that only grow, expired rows
//! swept without touching live locks or fences.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::{Connection, PgConnection, Row};
use syncguard::backend::LockBackend;
use syncguard::backend::key::{make_fence_key, make_storage_key};
use syncguard::postgres::PostgresConfig;
use syncguard::{LockOptions, conformance};

use crate::pg_reference::reference_acquire;
use crate::{backend, backend_with, pg_reference, postgres_url, unique};

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
    let raw = syncguard::get_by_key(&backend, &key)
        .await
        .unwrap()
        .map(syncguard::LockInfo::reveal)
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
    let raw = syncguard::get_by_key(&backend, &key)
        .await
        .unwrap()
        .map(syncguard::LockInfo::reveal)
        .unwrap();
    assert_eq!(raw.holder.as_deref(), Some("client-a"));
    assert!(backend.release(&next.lock_id).await.unwrap().is_released());
}
