//! A scheduled job on three replicas: each has the schedule (a firing every second, their
//! clocks a little apart), and each firing runs once, on whichever replica takes its lock
//! first. The others skip it; `min_hold` keeps the firing's lock after a quick run, so a
//! replica whose clock fires late skips it too.
//!
//! ```text
//! cargo run -p syncguard-examples --example scheduled
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use syncguard::{LockError, MemoryBackend, locked};

/// Who ran each firing.
type Runs = Arc<Mutex<BTreeMap<u64, Vec<&'static str>>>>;

/// The job of one firing: a quick report. Skipped (`Ok(())`) if another replica has it.
#[locked(key = "report:{firing}", backend = backend, skip_if_held = true, min_hold = "3s")]
async fn report(
    backend: &MemoryBackend,
    firing: u64,
    replica: &'static str,
    runs: &Runs,
) -> Result<(), LockError> {
    runs.lock()
        .unwrap()
        .entry(firing)
        .or_default()
        .push(replica);
    println!("firing {firing}: report run by {replica}");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // syncguard reports what needs attention (a lost lock, a failed release) as `tracing`
    // events: without a subscriber nobody sees them.
    tracing_subscriber::fmt::init();
    // One store shared by the replicas (a PostgresBackend or RedisBackend across processes).
    let backend = MemoryBackend::new();
    let runs = Runs::default();
    let replicas = [("replica-a", 0), ("replica-b", 150), ("replica-c", 400)];
    let tasks: Vec<_> = replicas
        .into_iter()
        .map(|(replica, skew_ms)| {
            let (backend, runs) = (backend.clone(), runs.clone());
            tokio::spawn(async move {
                // This replica's clock is `skew_ms` behind: its firings come that much later.
                tokio::time::sleep(Duration::from_millis(skew_ms)).await;
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                for firing in 1..=5 {
                    tick.tick().await;
                    report(&backend, firing, replica, &runs).await?;
                }
                Ok::<_, LockError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("replica")?;
    }
    for (firing, by) in runs.lock().unwrap().iter() {
        assert_eq!(by.len(), 1, "firing {firing} ran once: {by:?}");
    }
    println!("5 firings on 3 replicas: each ran once");
    // Release what is still held (the dropped guards' pending releases too) before exiting.
    syncguard::shutdown(std::time::Duration::from_secs(5)).await;
    Ok(())
}
