//! Acquires nobody waits for any more: their locks are let go, not left held for their ttl.
//! (An acquire whose answer was lost in the network is in `redis_faults`.)

use std::future::Future as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use redis::AsyncCommands as _;
use syncguard::RedisBackend;
use syncguard::backend::LockBackend;
use tokio::time::{Instant, sleep};

use crate::{acquired, both_backends, raw, redis_url, unique};

/// An acquire whose caller gave up (its future dropped) after Redis applied it does not leave
/// the lock held for its ttl. A lone caller sends its own call; this one is dropped mid-flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_lone_acquires_do_not_leave_locks_held() {
    for backend in both_backends().await {
        abandon_acquires(&backend).await;
    }
}

/// The same while other callers keep the backend busy, so that the abandoned calls go out in
/// batches, answered by the batch task to a caller that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_batched_acquires_do_not_leave_locks_held() {
    for backend in both_backends().await {
        let busy = Arc::new(AtomicBool::new(true));
        let load: Vec<_> = (0..8)
            .map(|_| {
                let (backend, busy) = (backend.clone(), busy.clone());
                tokio::spawn(async move {
                    let key = unique("busy");
                    while busy.load(Ordering::Relaxed) {
                        let lease = acquired(&backend, &key, Duration::from_secs(5)).await;
                        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
                    }
                })
            })
            .collect();
        abandon_acquires(&backend).await;
        busy.store(false, Ordering::Relaxed);
        for task in load {
            task.await.unwrap();
        }
    }
}

/// Starts acquires of fresh keys, each dropped as soon as Redis has applied it (its fence is
/// taken) but before its caller looked at the answer; then every key must be free again.
async fn abandon_acquires(backend: &RedisBackend) {
    let mut conn = raw(&redis_url()).await;
    let keys: Vec<String> = (0..30).map(|_| unique("abandoned")).collect();
    let mut abandoned = 0;
    for key in &keys {
        let fence_key = backend.fence_key(key).unwrap();
        let mut attempt = std::pin::pin!(backend.acquire(key, Duration::from_secs(60)));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match attempt
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
            {
                // The answer came before this thread (preempted on a loaded machine) looked
                // at the fence: an ordinary acquisition, released here.
                Poll::Ready(outcome) => {
                    let lease = outcome.unwrap().lease().expect("a fresh key is free");
                    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
                    break;
                }
                Poll::Pending => {
                    let fence: Option<String> = conn.get(&fence_key).await.unwrap();
                    if fence.is_some() {
                        // Applied: dropped with its answer unread.
                        abandoned += 1;
                        break;
                    }
                    assert!(Instant::now() < deadline, "{key}: the acquire never ran");
                    tokio::task::yield_now().await;
                }
            }
        }
    }
    assert!(abandoned > 0, "no acquire was abandoned before its answer");
    let deadline = Instant::now() + Duration::from_secs(10);
    for key in &keys {
        while backend.is_locked(key).await.unwrap() {
            assert!(
                Instant::now() < deadline,
                "{key} still held by an abandoned acquire"
            );
            sleep(Duration::from_millis(20)).await;
        }
        let lease = acquired(backend, key, Duration::from_secs(5)).await;
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
}
