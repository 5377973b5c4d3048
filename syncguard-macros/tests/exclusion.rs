//! Calls with the same key exclude each other; different keys run in parallel.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use syncguard::{LockError, MemoryBackend, locked};
use tokio::time::Instant;

struct Counters {
    locks: MemoryBackend,
    inside: AtomicUsize,
    max_inside: AtomicUsize,
}

impl Counters {
    #[locked(key = "shared:{name}", backend = self.locks, wait = "20s", retry_delay = "5ms", backoff = fixed)]
    async fn work(&self, name: &str) -> Result<(), LockError> {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inside.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn run(names: [&'static str; 5]) -> (usize, Duration) {
    let counters = Arc::new(Counters {
        locks: MemoryBackend::new(),
        inside: AtomicUsize::new(0),
        max_inside: AtomicUsize::new(0),
    });
    let started = Instant::now();
    let calls: Vec<_> = names
        .into_iter()
        .map(|name| {
            let counters = Arc::clone(&counters);
            tokio::spawn(async move { counters.work(name).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    (
        counters.max_inside.load(Ordering::SeqCst),
        started.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_calls_run_one_at_a_time() {
    let (max_inside, elapsed) = run(["a"; 5]).await;
    assert_eq!(max_inside, 1);
    assert!(elapsed >= Duration::from_millis(500), "{elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn different_keys_run_in_parallel() {
    let (max_inside, _) = run(["a", "b", "c", "d", "e"]).await;
    assert_eq!(max_inside, 5, "all five bodies ran at the same time");
}
