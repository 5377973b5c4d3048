//! Batching on the shared cluster: concurrent operations on many keys (which one server would
//! run in one script call) go out one call per primary (see `node_calls` for the count), all
//! succeeding, and the operations of one hot key share calls.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use syncguard::backend::{AcquireOutcome, LockBackend};

use crate::{cluster_backend, unique};

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_operations_on_many_keys_never_span_slots() {
    let backend = Arc::new(cluster_backend().await);
    let run = unique("many");
    let tasks: Vec<_> = (0..400)
        .map(|n| {
            let backend = Arc::clone(&backend);
            let key = format!("{run}:{n}");
            tokio::spawn(async move {
                let lease = backend
                    .acquire(&key, TTL)
                    .await
                    .map_err(|error| format!("acquire {key}: {error}"))?
                    .lease()
                    .ok_or_else(|| format!("{key} is contended"))?;
                let extended = backend
                    .extend(&lease.lock_id, TTL)
                    .await
                    .map_err(|error| format!("extend {key}: {error}"))?;
                if extended.expires_at_ms().is_none() {
                    return Err(format!("{key} was lost before its extend"));
                }
                let released = backend
                    .release(&lease.lock_id)
                    .await
                    .map_err(|error| format!("release {key}: {error}"))?;
                if !released.is_released() {
                    return Err(format!("{key} was lost before its release"));
                }
                Ok(())
            })
        })
        .collect();
    let mut failures = Vec::new();
    for task in tasks {
        if let Err(failure) = task.await.unwrap() {
            failures.push(failure);
        }
    }
    assert!(
        failures.is_empty(),
        "{} failed: {failures:#?}",
        failures.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hot_key_stays_exclusive_with_its_fences_distinct() {
    let backend = Arc::new(cluster_backend().await);
    let key = unique("hot");
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let backend = Arc::clone(&backend);
            let key = key.clone();
            tokio::spawn(async move {
                let mut fences = Vec::new();
                for _ in 0..20 {
                    if let AcquireOutcome::Acquired(lease) = backend.acquire(&key, TTL).await? {
                        fences.push(lease.fence);
                        assert!(backend.release(&lease.lock_id).await?.is_released());
                    }
                }
                Ok::<_, syncguard::LockError>(fences)
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap().expect("no errors on a hot key"));
    }
    assert!(!all.is_empty());
    let distinct: HashSet<_> = all.iter().collect();
    assert_eq!(
        distinct.len(),
        all.len(),
        "every acquisition has its own fence"
    );
}
