//! Several workers contend for one key on the in-memory backend; each prints its fence, and a
//! long job outlives its short ttl thanks to the heartbeat.
//!
//! Run with `cargo run --example quickstart`.

use std::time::Duration;

use syncguard::{LockOptions, MemoryBackend, RetryPolicy};

#[tokio::main]
async fn main() -> Result<(), syncguard::LockError> {
    // syncguard reports what needs attention (a lost lock, a failed release) as `tracing`
    // events: without a subscriber nobody sees them.
    tracing_subscriber::fmt::init();
    let backend = MemoryBackend::new();

    // Four workers want the same key; they take turns, and every turn gets a larger fence.
    // The options are the policy, apart from the key: one value serves every worker.
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(5))
        .retry(RetryPolicy::wait_for(Duration::from_secs(10)))
        .build()?;
    let workers: Vec<_> = (1..=4)
        .map(|worker| {
            let (backend, options) = (backend.clone(), options.clone());
            tokio::spawn(async move {
                syncguard::with_lock(&backend, "report:daily", &options, async |guard| {
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
    // so nobody else can take it. A rival makes one attempt each time (`try_acquire`), and
    // finds the key held.
    let short = LockOptions::builder()
        .ttl(Duration::from_millis(500))
        .build()?;
    let guard = syncguard::acquire(&backend, "import:big", &short).await?;
    let first_expiry = guard.expires_at_ms();
    for step in 1..=4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rival = syncguard::try_acquire(&backend, "import:big", &short).await?;
        println!(
            "long job: {} ms in, expiry moved by {} ms, rival refused: {}",
            step * 500,
            guard.expires_at_ms() - first_expiry,
            rival.is_none(),
        );
    }
    assert!(!guard.is_lost());
    println!("long job: done, released: {}", guard.release().await?);
    // Release what is still held (the dropped guards' pending releases too) before exiting.
    syncguard::shutdown(std::time::Duration::from_secs(5)).await;
    Ok(())
}
