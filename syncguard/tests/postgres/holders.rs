//! Locks with a holder (`acquire_as`, `extend_by`): their round trips, exclusion among
//! holders, and an `acquire_as` whose outcome was lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::{Connection, PgConnection};
use syncguard::backend::LockBackend;
use syncguard::backend::key::{make_fence_key, make_storage_key};
use syncguard::postgres::{PostgresBackend, PostgresConfig};
use syncguard::{ErrorCode, conformance};

use crate::{backend, backend_with, bench_support, postgres_url};

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
        let Some(landed) = syncguard::get_by_key(backend, &key)
            .await
            .unwrap()
            .map(syncguard::LockInfo::reveal)
        else {
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
        let raw = syncguard::get_by_key(backend, &key)
            .await
            .unwrap()
            .map(syncguard::LockInfo::reveal)
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
