//! Holders (`acquire_as`, `extend_by`) as Firestore stores them, beside the conformance checks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use firestore::FirestoreDb;
use serde_json::Value;
use syncguard::Fence;
use syncguard::backend::key::{make_fence_key, make_storage_key};
use syncguard::backend::time::{TIME_TOLERANCE_MS, now_ms};
use syncguard::backend::{ExtendOutcome, LockBackend, ReleaseOutcome};
use syncguard::firestore::{FirestoreBackend, FirestoreConfig};
use syncguard::{LockId, conformance};
use tokio::sync::RwLock;
use tokio::time::sleep;

use crate::{backend_in, client, lease, project, read_doc, write_doc};

/// The lock document of `key` in the default collection.
async fn lock_doc(db: &FirestoreDb, key: &str) -> Option<HashMap<String, Value>> {
    read_doc(db, "locks", &make_storage_key("", key, 1500, 0).unwrap()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_document_has_a_holder_only_when_one_is_given() {
    let project = project();
    let backend = backend_in(&project, FirestoreConfig::new()).await;
    let db = client(&project).await;
    let key = conformance::unique_key("holder-field");
    let fence_id =
        make_fence_key("", &make_storage_key("", &key, 1500, 0).unwrap(), 1500, 0).unwrap();

    // Without a holder: no field at all (not null).
    let plain = lease(
        backend
            .acquire(&key, Duration::from_secs(30))
            .await
            .unwrap(),
    );
    let doc = lock_doc(&db, &key).await.expect("lock document");
    assert!(!doc.contains_key("holder"), "{doc:?}");
    assert!(backend.release(&plain.lock_id).await.unwrap().is_released());

    // With one: stored as given, kept by a re-entry and by extend_by.
    let first = lease(
        backend
            .acquire_as(&key, Duration::from_secs(30), "client-a")
            .await
            .unwrap(),
    );
    let doc = lock_doc(&db, &key).await.expect("lock document");
    assert_eq!(doc["holder"], "client-a");
    assert_eq!(doc["lockId"], first.lock_id.as_str());
    assert_eq!(doc["fence"], "000000000000002");
    sleep(Duration::from_millis(20)).await;
    let again = lease(
        backend
            .acquire_as(&key, Duration::from_secs(60), "client-a")
            .await
            .unwrap(),
    );
    assert_eq!(again.lock_id, first.lock_id);
    assert_eq!(again.fence, first.fence);
    let doc = lock_doc(&db, &key).await.expect("lock document");
    assert_eq!(doc["holder"], "client-a");
    assert_eq!(doc["lockId"], first.lock_id.as_str());
    assert_eq!(doc["fence"], "000000000000002");
    assert_eq!(doc["expiresAtMs"].as_u64(), Some(again.expires_at_ms));
    assert_eq!(
        doc["acquiredAtMs"].as_u64().map(|at| at + 60_000),
        Some(again.expires_at_ms),
        "the acquisition time restarts"
    );
    let counter = read_doc(&db, "fence_counters", &fence_id).await.unwrap();
    assert_eq!(
        counter["fence"], "000000000000002",
        "a re-entry takes no fence"
    );

    let extended = backend
        .extend_by(&first.lock_id, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(extended.expires_at_ms(), Some(again.expires_at_ms + 10_000));
    let doc = lock_doc(&db, &key).await.expect("lock document");
    assert_eq!(
        doc["expiresAtMs"].as_u64(),
        Some(again.expires_at_ms + 10_000)
    );
    assert_eq!(doc["holder"], "client-a");
    let raw = syncguard::get_by_id(&backend, &first.lock_id)
        .await
        .unwrap()
        .map(syncguard::LockInfo::reveal)
        .expect("held");
    assert_eq!(raw.holder.as_deref(), Some("client-a"));
    assert!(backend.release(&first.lock_id).await.unwrap().is_released());
    assert!(lock_doc(&db, &key).await.is_none());

    // An expired holder's lock, taken by a plain acquire: the holder goes with it.
    let short = lease(
        backend
            .acquire_as(&key, Duration::from_millis(50), "client-a")
            .await
            .unwrap(),
    );
    sleep(Duration::from_millis(50 + TIME_TOLERANCE_MS + 300)).await;
    let next = lease(
        backend
            .acquire(&key, Duration::from_secs(30))
            .await
            .unwrap(),
    );
    assert_ne!(next.lock_id, short.lock_id);
    assert!(next.fence > short.fence);
    let doc = lock_doc(&db, &key).await.expect("lock document");
    assert!(!doc.contains_key("holder"), "{doc:?}");
    assert!(
        backend
            .acquire_as(&key, Duration::from_secs(30), "client-a")
            .await
            .unwrap()
            .is_contended(),
        "the former holder does not re-enter a lock taken without holder"
    );
    assert!(backend.release(&next.lock_id).await.unwrap().is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reference_document_is_never_reentered() {
    let project = project();
    let backend = backend_in(&project, FirestoreConfig::new()).await;
    let db = client(&project).await;
    let key = conformance::unique_key("reference-holder");
    let doc_id = make_storage_key("", &key, 1500, 0).unwrap();
    let fence_id = make_fence_key("", &doc_id, 1500, 0).unwrap();
    let lock_id = LockId::generate();
    let now = now_ms();
    // As the TypeScript reference writes them: no holder field.
    write_doc(
        &db,
        "fence_counters",
        &fence_id,
        &serde_json::json!({ "fence": "000000000000007", "keyDebug": key }),
    )
    .await;
    write_doc(
        &db,
        "locks",
        &doc_id,
        &serde_json::json!({
            "lockId": lock_id.as_str(),
            "expiresAtMs": now + 30_000,
            "acquiredAtMs": now,
            "key": key,
            "fence": "000000000000007",
        }),
    )
    .await;
    let before = lock_doc(&db, &key).await.expect("lock document");

    for holder in ["client-a", "anyone", "null", " "] {
        let outcome = backend
            .acquire_as(&key, Duration::from_secs(30), holder)
            .await
            .unwrap();
        assert!(outcome.is_contended(), "{holder:?} re-entered: {outcome:?}");
    }
    assert_eq!(
        lock_doc(&db, &key).await.as_ref(),
        Some(&before),
        "unchanged"
    );
    let raw = syncguard::get_by_key(&backend, &key)
        .await
        .unwrap()
        .map(syncguard::LockInfo::reveal)
        .expect("held");
    assert_eq!(raw.lock_id, lock_id);
    assert_eq!(raw.holder, None);

    // extend_by works on it, and writes no holder.
    let extended = backend
        .extend_by(&lock_id, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(extended.expires_at_ms(), Some(now + 35_000));
    let doc = lock_doc(&db, &key).await.expect("lock document");
    assert!(!doc.contains_key("holder"), "{doc:?}");
    assert_eq!(doc["expiresAtMs"].as_u64(), Some(now + 35_000));

    // Once expired, it is taken (not re-entered): a new lock id, the next fence.
    write_doc(
        &db,
        "locks",
        &doc_id,
        &serde_json::json!({
            "lockId": lock_id.as_str(),
            "expiresAtMs": now - 5_000,
            "acquiredAtMs": now - 35_000,
            "key": key,
            "fence": "000000000000007",
        }),
    )
    .await;
    let taken = lease(
        backend
            .acquire_as(&key, Duration::from_secs(30), "client-a")
            .await
            .unwrap(),
    );
    assert_ne!(taken.lock_id, lock_id);
    assert_eq!(taken.fence.get(), 8);
    let doc = lock_doc(&db, &key).await.expect("lock document");
    assert_eq!(doc["holder"], "client-a");
    assert!(matches!(
        backend
            .extend_by(&lock_id, Duration::from_secs(5))
            .await
            .unwrap(),
        ExtendOutcome::NotHeld(_)
    ));
    assert!(backend.release(&taken.lock_id).await.unwrap().is_released());
}

const HOLDERS: usize = 4;
const TASKS: usize = 8;

/// What the tasks saw: who holds the key now (the unit of holding is the holder, whose
/// tasks share its lock), and since when.
#[derive(Default)]
struct Seen {
    owner: Option<usize>,
    session: Option<(LockId, Fence, Instant)>,
    inside: [usize; HOLDERS],
    last_fence: u64,
    sessions: usize,
    reentries: usize,
    extends: usize,
}

/// One task of `holder`: enter (acquire_as), hold briefly, leave; the holder's last task
/// to leave releases. A holder's enters and its release take turns (`turns`), so that a
/// release never takes the lock from a task that has just re-entered it.
async fn run_task(
    backend: FirestoreBackend,
    key: String,
    holder: usize,
    task: usize,
    seen: Arc<Mutex<Seen>>,
    turns: Arc<[RwLock<()>; HOLDERS]>,
    until: Instant,
) {
    let name = format!("holder-{holder}");
    let ttl = Duration::from_secs(15);
    let mut round = 0;
    while Instant::now() < until {
        round += 1;
        // A session that has lasted a while lets the others in.
        let long_session = {
            let seen = seen.lock().unwrap();
            seen.owner == Some(holder)
                && seen.session.as_ref().unwrap().2.elapsed() > Duration::from_millis(300)
        };
        if long_session {
            sleep(Duration::from_millis(20)).await;
            continue;
        }
        let turn = turns[holder].read().await;
        let outcome = backend
            .acquire_as(&key, ttl, &name)
            .await
            .unwrap_or_else(|error| panic!("{name} task {task}: {error}"));
        let Some(lease) = outcome.lease() else {
            drop(turn);
            sleep(Duration::from_millis(10 + (task as u64 * 3) % 20)).await;
            continue;
        };
        {
            let mut seen = seen.lock().unwrap();
            match seen.owner {
                Some(owner) => {
                    assert_eq!(
                        owner, holder,
                        "holder-{owner} and {name} hold the key at once"
                    );
                    let (id, fence, _) = seen.session.as_ref().unwrap();
                    assert_eq!(&lease.lock_id, id, "a re-entry keeps the lock id");
                    assert_eq!(lease.fence, *fence, "a re-entry keeps the fence");
                    seen.reentries += 1;
                }
                None => {
                    assert!(
                        lease.fence.get() > seen.last_fence,
                        "fences increase across holders: {} after {}",
                        lease.fence,
                        seen.last_fence
                    );
                    seen.last_fence = lease.fence.get();
                    seen.owner = Some(holder);
                    seen.session = Some((lease.lock_id.clone(), lease.fence, Instant::now()));
                    seen.sessions += 1;
                }
            }
            seen.inside[holder] += 1;
        }
        drop(turn);

        sleep(Duration::from_millis(5 + ((task + round) as u64 * 7) % 25)).await;
        if round % 3 == 0 {
            let extended = backend
                .extend_by(&lease.lock_id, Duration::from_secs(1))
                .await
                .unwrap_or_else(|error| panic!("{name} task {task}: {error}"));
            assert!(
                matches!(extended, ExtendOutcome::Extended { .. }),
                "{name} holds the lock it extends: {extended:?}"
            );
            seen.lock().unwrap().extends += 1;
        }

        {
            let mut seen = seen.lock().unwrap();
            seen.inside[holder] -= 1;
            if seen.inside[holder] > 0 {
                continue;
            }
        }
        let _turn = turns[holder].write().await;
        let session = {
            let mut seen = seen.lock().unwrap();
            if seen.inside[holder] > 0 || seen.owner != Some(holder) {
                continue; // re-entered meanwhile, or released by another task
            }
            seen.owner = None;
            seen.session.take().unwrap()
        };
        let released = backend
            .release(&session.0)
            .await
            .unwrap_or_else(|error| panic!("{name} task {task}: {error}"));
        assert!(
            matches!(released, ReleaseOutcome::Released),
            "{name} releases the lock it holds: {released:?}"
        );
        sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn holders_never_hold_one_key_together() {
    // Each holder on a client of its own (as in separate server processes), its 8 tasks
    // sharing it: re-entries within a holder, commits conflicting across holders.
    let project = project();
    let mut backends = Vec::new();
    for _ in 0..HOLDERS {
        backends.push(backend_in(&project, FirestoreConfig::new()).await);
    }
    let key = conformance::unique_key("holders-race");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let turns: Arc<[RwLock<()>; HOLDERS]> = Arc::new(std::array::from_fn(|_| RwLock::new(())));
    let until = Instant::now() + Duration::from_secs(3);
    let mut handles = Vec::new();
    for (holder, backend) in backends.iter().enumerate() {
        for task in 0..TASKS {
            handles.push(tokio::spawn(run_task(
                backend.clone(),
                key.clone(),
                holder,
                task,
                Arc::clone(&seen),
                Arc::clone(&turns),
                until,
            )));
        }
    }
    for handle in handles {
        handle.await.expect("a task failed");
    }
    {
        let seen = seen.lock().unwrap();
        eprintln!(
            "{} sessions, {} re-entries, {} extends, last fence {}",
            seen.sessions, seen.reentries, seen.extends, seen.last_fence
        );
        assert!(seen.sessions >= 2, "the key changed hands");
        assert!(seen.reentries >= 1, "holders re-entered");
        assert_eq!(seen.owner, None, "every session was released");
    }
    assert!(!backends[0].is_locked(&key).await.unwrap());
}
