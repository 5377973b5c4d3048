//! The fencing story end to end: a holder that stalls past its lease loses the lock to a new
//! holder, and the protected resource refuses the stale holder's late write by its fence.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use syncguard::{Fence, LockBackend, LockOptions, LostReason, MemoryBackend, RetryPolicy};

/// A store that accepts a write only with a fence at least as new as the newest it has seen.
#[derive(Default)]
struct FencedStore {
    newest: Option<Fence>,
    writes: Vec<(Fence, &'static str)>,
}

impl FencedStore {
    fn write(&mut self, fence: Fence, value: &'static str) -> Result<(), String> {
        if self.newest.is_some_and(|newest| fence < newest) {
            return Err(format!("stale fence {fence}"));
        }
        self.newest = Some(fence);
        self.writes.push((fence, value));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_holder_is_refused_by_its_fence() {
    let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    let store = Arc::new(Mutex::new(FencedStore::default()));

    // Holder A: short ttl, no heartbeat, then a long stall (a GC pause, a partition...).
    let stalled = LockOptions::builder()
        .ttl(Duration::from_millis(200))
        .heartbeat(false)
        .build()
        .unwrap();
    let a = syncguard::acquire(&backend, "ledger:1", &stalled)
        .await
        .unwrap();
    let a_fence = a.fence();
    assert_eq!(a.lost().await, LostReason::TtlElapsed);

    // Holder B gets the lock once A's lease and the tolerance have passed, and writes.
    let patient = LockOptions::builder()
        .retry(RetryPolicy::wait_for(Duration::from_secs(10)))
        .build()
        .unwrap();
    let b = syncguard::acquire(&backend, "ledger:1", &patient)
        .await
        .unwrap();
    assert!(b.fence() > a_fence);
    store.lock().unwrap().write(b.fence(), "from B").unwrap();

    // A wakes up and tries to write with its old fence: refused.
    let late = store.lock().unwrap().write(a_fence, "from A");
    assert_eq!(late, Err(format!("stale fence {a_fence}")));
    assert_eq!(store.lock().unwrap().writes, vec![(b.fence(), "from B")]);

    assert!(!a.release().await.unwrap(), "A no longer holds anything");
    assert!(b.release().await.unwrap());
}
