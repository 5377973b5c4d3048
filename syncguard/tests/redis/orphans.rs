//! Acquires nobody waits for any more: their locks are let go, not left held for their ttl.
//! (An acquire whose answer was lost in the network is in `redis_faults`.)

use std::future::Future as _;
use std::time::Duration;

use redis::AsyncCommands as _;
use syncguard::backend::LockBackend;
use tokio::time::{Instant, sleep};

use crate::{acquired, manager_backend, raw, redis_url, unique};

/// An acquire whose caller gave up (its future dropped) after the call was queued does not
/// leave the lock held for its ttl: the batch task releases what nobody will.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_acquires_do_not_leave_locks_held() {
    let backend = manager_backend().await;
    let keys: Vec<String> = (0..50).map(|_| unique("abandoned")).collect();
    let mut abandoned = 0;
    for key in &keys {
        // Polled once (the call is queued), then dropped before the reply.
        let mut attempt = std::pin::pin!(backend.acquire(key, Duration::from_secs(60)));
        let polled = attempt
            .as_mut()
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        match polled {
            std::task::Poll::Pending => abandoned += 1,
            // The batch task (on the other worker) had its answer before this thread, preempted
            // on a loaded machine, looked: an ordinary acquisition, released here.
            std::task::Poll::Ready(outcome) => {
                let lease = outcome.unwrap().lease().expect("a fresh key is free");
                assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
            }
        }
    }
    assert!(abandoned > 0, "no acquire was abandoned before its reply");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut conn = raw(&redis_url()).await;
    for key in &keys {
        loop {
            // The call ran (its fence was used), and its lock was let go.
            let fence: Option<String> = conn.get(backend.fence_key(key).unwrap()).await.unwrap();
            if fence.is_some() && !backend.is_locked(key).await.unwrap() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{key} still held by an abandoned acquire"
            );
            sleep(Duration::from_millis(20)).await;
        }
        let lease = acquired(&backend, key, Duration::from_secs(5)).await;
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
}
