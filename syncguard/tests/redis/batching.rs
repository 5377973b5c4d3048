//! Concurrent calls share script calls: each still gets its own answer.

use std::error::Error as _;
use std::time::Duration;

use redis::AsyncCommands as _;
use syncguard::ErrorCode;
use syncguard::backend::{AcquireOutcome, LockBackend};
use syncguard::get_by_id;

use crate::{acquired, both_backends, raw, redis_url, unique};

/// Concurrent calls share script calls (batches); each still gets its own answer, and a call
/// that meets a wrong type fails alone, having changed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_batched_together_answer_separately() {
    let mut conn = raw(&redis_url()).await;
    for backend in both_backends().await {
        let bad = unique("batch-bad");
        let _: () = conn
            .hset(backend.lock_key(&bad).unwrap(), "field", "value")
            .await
            .unwrap();
        let held = unique("batch-held");
        let holder = acquired(&backend, &held, Duration::from_secs(30)).await;
        let keys: Vec<String> = (0..40).map(|_| unique("batch")).collect();

        // 40 free keys, one held key and one wrong-type key, all at once.
        let mut calls = tokio::task::JoinSet::new();
        for key in keys.iter().chain([&held, &bad]) {
            let (backend, key) = (backend.clone(), key.clone());
            calls.spawn(async move {
                let outcome = backend.acquire(&key, Duration::from_secs(30)).await;
                (key, outcome)
            });
        }
        let mut leases = Vec::new();
        while let Some(joined) = calls.join_next().await {
            let (key, outcome) = joined.unwrap();
            if key == bad {
                let err = outcome.unwrap_err();
                assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
                assert!(err.source().unwrap().to_string().contains("WRONGTYPE"));
            } else if key == held {
                assert!(matches!(outcome, Ok(AcquireOutcome::Contended(_))));
            } else {
                match outcome {
                    Ok(AcquireOutcome::Acquired(lease)) => leases.push((key, lease)),
                    other => panic!("{key}: {other:?}"),
                }
            }
        }
        assert_eq!(leases.len(), keys.len());
        let kind: String = redis::cmd("TYPE")
            .arg(backend.lock_key(&bad).unwrap())
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kind, "hash", "the failed call wrote nothing");

        // Releases and extends, concurrently, each answered for its own lock.
        let mut calls = tokio::task::JoinSet::new();
        for (i, (key, lease)) in leases.into_iter().enumerate() {
            let backend = backend.clone();
            calls.spawn(async move {
                if i % 2 == 0 {
                    let released = backend.release(&lease.lock_id).await.unwrap();
                    assert!(released.is_released(), "{key}");
                    assert!(!backend.is_locked(&key).await.unwrap());
                } else {
                    let extended = backend
                        .extend(&lease.lock_id, Duration::from_secs(60))
                        .await
                        .unwrap();
                    let info = get_by_id(&backend, &lease.lock_id).await.unwrap().unwrap();
                    assert_eq!(Some(info.expires_at_ms), extended.expires_at_ms(), "{key}");
                    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
                }
            });
        }
        while let Some(joined) = calls.join_next().await {
            joined.unwrap();
        }
        assert!(
            backend
                .release(&holder.lock_id)
                .await
                .unwrap()
                .is_released()
        );
    }
}
