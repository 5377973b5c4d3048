//! Several workers contend for one key on the in-memory backend; each prints its fence, and a
//! long job outlives its short ttl thanks to the heartbeat.
//!
//! Run with `cargo run --example quickstart`.

use std::time::Duration;

use syncguard::{LockOptions, MemoryBackend, RetryPolicy};

#[tokio::main]
async fn main() -> Result<(), syncguard::LockError> {
    let backend = MemoryBackend::new();

    // Four workers want the same key; they take turns, and every turn gets a larger fence.
    let options = LockOptions::new("report:daily")
        .with_ttl(Duration::from_secs(5))
        .with_retry(RetryPolicy::new().with_timeout(Duration::from_secs(10)));
    let workers: Vec<_> = (1..=4)
        .map(|worker| {
            let (backend, options) = (backend.clone(), options.clone());
            tokio::spawn(async move {
                syncguard::with_lock(&backend, &options, async |guard| {
                    println!(
                        "worker {worker}: holding report:daily, fence {}",
                        guard.fence()
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok::<_, syncguard::LockError>(())
                })
                .await
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker panicked")?;
    }

    // A 2-second job under a 500 ms ttl: the heartbeat extends the lock while the job runs,
    // so nobody else can take it.
    let long = LockOptions::new("import:big").with_ttl(Duration::from_millis(500));
    let guard = syncguard::acquire(&backend, &long).await?;
    let first_expiry = guard.expires_at_ms();
    for second in 1..=4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rival = syncguard::acquire(
            &backend,
            &LockOptions::new("import:big").with_retry(RetryPolicy::single_attempt()),
        )
        .await;
        println!(
            "long job: {} ms in, expiry moved by {} ms, rival refused: {}",
            second * 500,
            guard.expires_at_ms() - first_expiry,
            rival.is_err_and(|e| e.is_contended()),
        );
    }
    assert!(!guard.is_lost());
    println!("long job: done, released: {}", guard.release().await?);
    Ok(())
}
