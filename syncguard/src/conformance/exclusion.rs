//! Mutual exclusion: never two holders of one key, under concurrent workers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::history;
use super::support::unique_key;
use crate::backend::{AcquireOutcome, LockBackend};

/// 64 tasks hammer one key for 3 s: never two holders at once, fences unique and increasing
/// in holding order, every release succeeds.
pub async fn mutual_exclusion<B: LockBackend + Clone + 'static>(backend: B) {
    mutual_exclusion_with(backend, 64, Duration::from_secs(3)).await;
}

/// [`mutual_exclusion`] with a chosen number of tasks and duration.
pub async fn mutual_exclusion_with<B: LockBackend + Clone + 'static>(
    backend: B,
    tasks: usize,
    duration: Duration,
) {
    let key = unique_key("exclusion");
    let history = Arc::new(history::History::new());
    let failed_releases = Arc::new(AtomicUsize::new(0));
    let end = Instant::now() + duration;
    let workers: Vec<_> = (0..tasks)
        .map(|worker| {
            let (backend, key) = (backend.clone(), key.clone());
            let (history, failed_releases) = (Arc::clone(&history), Arc::clone(&failed_releases));
            tokio::spawn(async move {
                while Instant::now() < end {
                    let outcome = backend.acquire(&key, Duration::from_secs(30)).await;
                    let Ok(AcquireOutcome::Acquired(lease)) = outcome else {
                        assert!(outcome.expect("acquire failed").is_contended());
                        sleep(Duration::from_millis(1)).await;
                        continue;
                    };
                    // Acts on the resource twice, well within the 30 s lease.
                    let acquired = Instant::now();
                    tokio::task::yield_now().await;
                    let actions = vec![acquired, Instant::now()];
                    if !backend.release(&lease.lock_id).await.unwrap().is_released() {
                        failed_releases.fetch_add(1, Ordering::SeqCst);
                    }
                    history.record(history::Hold {
                        holder: format!("task {worker}"),
                        fence: lease.fence,
                        acquired,
                        actions,
                        lost: None,
                    });
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker panicked");
    }

    let checked = history
        .check()
        .unwrap_or_else(|violations| panic!("{violations}"));
    assert!(
        checked.holds >= 10,
        "only {} acquisitions in {duration:?}",
        checked.holds
    );
    assert_eq!(failed_releases.load(Ordering::SeqCst), 0);
}
