//! Firestore backend benchmark (informational): acquire+release cycles/s and latency at 1 and
//! 16 workers, on distinct keys and on one hot key, against the Cloud Firestore emulator.
//!
//! The emulator is a single Java process with its own locking, so the figures say little about
//! the real service (where each operation is a network round trip to Google); they show the
//! backend's own cost and how it behaves under contention.
//!
//! A freshly started emulator runs its first few thousand operations cold (its JVM has not
//! compiled them yet): a first scenario run at once (1 worker, distinct keys) did 20-27
//! cycles/s, about 100 after a warm-up of 15 s. So `SYNCGUARD_BENCH_WARMUP_SECS` (default 15)
//! of cycles on distinct keys, 4 workers, run first, uncounted.
//!
//! ```sh
//! bash scripts/with-services.sh cargo bench -p syncguard --features firestore --bench firestore
//! ```

mod support;

use std::time::Duration;

use support::{Cycle, print_header, print_row, run, scenario_duration};
use syncguard::LockId;
use syncguard::backend::LockBackend;
use syncguard::firestore::FirestoreBackend;

const TTL: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() {
    let host = std::env::var("FIRESTORE_EMULATOR_HOST").expect(
        "FIRESTORE_EMULATOR_HOST is not set: run this through `bash scripts/with-services.sh`",
    );
    let project = format!(
        "syncguard-bench-{}",
        LockId::generate()
            .as_str()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect::<String>()
            .to_lowercase()
    );
    let backend = FirestoreBackend::connect(&project)
        .await
        .expect("connect to the emulator");
    let duration = scenario_duration();
    let warmup = std::env::var("SYNCGUARD_BENCH_WARMUP_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(15), Duration::from_secs_f64);
    let warmup_prefix = format!("warmup:{}", LockId::generate());
    let warm = backend.clone();
    let warmed = run(4, warmup, move |worker, iteration| {
        let backend = warm.clone();
        let key = format!("{warmup_prefix}:{worker}:{iteration}");
        async move {
            let lease = backend.acquire(&key, TTL).await.expect("acquire");
            let lease = lease.lease().expect("a fresh key is free");
            assert!(
                backend
                    .release(&lease.lock_id)
                    .await
                    .expect("release")
                    .is_released()
            );
            Cycle::Done
        }
    })
    .await;
    println!(
        "warm-up: {} cycles in {}s on 4 workers, not counted",
        warmed.cycles,
        warmup.as_secs_f64()
    );
    println!(
        "Firestore emulator at {host}; acquire+release cycles, {}s per scenario:\n",
        duration.as_secs_f64()
    );
    print_header();
    let run_id = LockId::generate();
    for workers in [1, 16] {
        for hot in [false, true] {
            let keys = if hot { "one hot" } else { "distinct" };
            let backend = backend.clone();
            let prefix = format!("bench:{run_id}:{workers}:{hot}");
            let measured = run(workers, duration, move |worker, iteration| {
                let backend = backend.clone();
                let key = if hot {
                    format!("{prefix}:hot")
                } else {
                    format!("{prefix}:{worker}:{iteration}")
                };
                async move {
                    let outcome = backend.acquire(&key, TTL).await.expect("acquire");
                    let Some(lease) = outcome.lease() else {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        return Cycle::Contended;
                    };
                    let released = backend.release(&lease.lock_id).await.expect("release");
                    assert!(released.is_released());
                    Cycle::Done
                }
            })
            .await;
            print_row("syncguard acquire+release", workers, keys, &measured);
        }
    }
}
