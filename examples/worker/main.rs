//! A job runner whose handler is `#[locked]`: several workers pull jobs from an
//! at-least-once queue (every job is delivered twice), and the lock makes each job run once
//! at a time across every worker, however many processes share the backend.
//!
//! ```sh
//! cargo run -p syncguard-examples --example worker --features worker             # in-memory
//! cargo run -p syncguard-examples --example worker --features worker -- postgres://user@host/db
//! cargo run -p syncguard-examples --example worker --features worker -- redis://127.0.0.1:6379
//! ```
//!
//! Without a URL the default backend is in memory; PostgreSQL gets its tables created. Start
//! it in two terminals against the same PostgreSQL or Redis to see two processes share
//! the work. Ctrl-C stops it the way a service should: `syncguard::shutdown` releases the
//! locks of the jobs cut short, so the other process can take them at once instead of after
//! their ttl.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use syncguard::{ErrorCode, LockError, locked};
use tokio::sync::mpsc;

/// What a job left behind: the fence of the holder that wrote it, so a stale holder's
/// late write would be refused.
#[derive(Default)]
struct Results {
    written: HashMap<u64, (u64, String)>,
}

#[derive(Debug)]
enum JobError {
    Lock(LockError),
    StaleFence { job: u64 },
}

impl From<LockError> for JobError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

/// Processes one job. `wait = false`: if another worker holds the job, skip this delivery
/// (`ErrorCode::Contended`). The 1 s ttl is shorter than some jobs; the heartbeat keeps the
/// lock meanwhile. `show_key = true`: job ids are no secret, so errors and the hold's
/// `syncguard.hold` span name the job's key, not only its hash.
#[locked(key = "job:{id}", ttl = "1s", wait = false, show_key = true, guard = lock)]
async fn handle(id: u64, worker: usize, results: &Mutex<Results>) -> Result<(), JobError> {
    if results.lock().unwrap().written.contains_key(&id) {
        println!("worker {worker}: job {id} already done, skipping");
        return Ok(());
    }
    let work = Duration::from_millis(300 + (id % 4) * 400); // up to 1.5 s, past the ttl
    tokio::time::sleep(work).await;

    let fence = lock.fence();
    let mut results = results.lock().unwrap();
    // The resource checks the fence: a write from an older holder is refused.
    if let Some((newest, _)) = results.written.get(&id)
        && *newest > fence.get()
    {
        return Err(JobError::StaleFence { job: id });
    }
    results
        .written
        .insert(id, (fence.get(), format!("worker {worker}")));
    println!(
        "worker {worker}: job {id} done in {work:?} under fence {fence} (held {:?})",
        lock.held_for()
    );
    Ok(())
}

async fn set_backend(url: Option<&str>) -> Result<&'static str, LockError> {
    match url {
        None => {
            syncguard::set_default_backend(syncguard::MemoryBackend::new())?;
            Ok("in-memory")
        }
        Some(url) if url.starts_with("postgres") => {
            let backend = syncguard::PostgresBackend::connect(url).await?;
            syncguard::postgres::setup_schema(backend.pool(), backend.config()).await?;
            syncguard::set_default_backend(backend)?;
            Ok("PostgreSQL")
        }
        Some(url) if url.starts_with("redis") => {
            let backend = syncguard::RedisBackend::connect(url).await?;
            syncguard::set_default_backend(backend)?;
            Ok("Redis")
        }
        Some(other) => Err(LockError::invalid_argument(format!(
            "unsupported URL {other:?}: give a postgres:// or redis:// URL, or nothing for in-memory"
        ))),
    }
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // syncguard reports what needs attention (a lost lock, a failed release) as `tracing`
    // events: without a subscriber nobody sees them.
    tracing_subscriber::fmt::init();
    let url = std::env::args().nth(1);
    let name = set_backend(url.as_deref()).await?;
    println!("backend: {name}");

    let (queue, deliveries) = mpsc::channel::<u64>(64);
    let deliveries = Arc::new(tokio::sync::Mutex::new(deliveries));
    let results = Arc::new(Mutex::new(Results::default()));

    let workers: Vec<_> = (1..=4)
        .map(|worker| {
            let (deliveries, results) = (Arc::clone(&deliveries), Arc::clone(&results));
            tokio::spawn(async move {
                loop {
                    let Some(id) = deliveries.lock().await.recv().await else {
                        return;
                    };
                    match handle(id, worker, &results).await {
                        Ok(()) => {}
                        Err(JobError::Lock(error)) if error.code() == ErrorCode::Contended => {
                            let lock = error.lock().expect("a contention error names its lock");
                            println!("worker {worker}: lock {lock} is held elsewhere, skipping");
                        }
                        Err(JobError::StaleFence { job }) => {
                            println!(
                                "worker {worker}: job {job} refused a write from a stale holder"
                            );
                        }
                        Err(JobError::Lock(error)) => {
                            println!("worker {worker}: job {id} failed: {error}");
                        }
                    }
                }
            })
        })
        .collect();

    // At-least-once delivery: every job arrives twice.
    for id in (1..=6).chain(1..=6) {
        queue.send(id).await.expect("workers alive");
    }
    drop(queue);
    let all_done = async {
        for worker in workers {
            worker.await.expect("worker panicked");
        }
    };
    tokio::select! {
        () = all_done => {}
        _ = tokio::signal::ctrl_c() => println!("Ctrl-C: stopping"),
    }
    // Before the runtime ends (returning from main ends it, and with it any release still
    // waiting in a task): release every lock still held. Handlers still running learn that
    // their lock is lost, and `#[locked]` cancels them.
    let report = syncguard::shutdown(Duration::from_secs(5)).await;
    if !report.all_free() {
        println!("some locks could not be released and stay held until their ttl: {report:?}");
    }

    let results = results.lock().unwrap();
    println!("\n{} jobs done:", results.written.len());
    let mut ids: Vec<_> = results.written.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        let (fence, by) = &results.written[&id];
        println!("  job {id}: by {by}, fence {fence:015}");
    }
    Ok(())
}
