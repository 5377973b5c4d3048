//! Leader election: three replicas of a service in one process campaign in one election on a
//! shared backend. One leads and runs the singleton job; an observer prints who leads. The
//! leader is killed (its task aborted), and another replica takes over with a higher term.
//! Then the service shuts down: the new leader stops its job and resigns.
//!
//! ```sh
//! cargo run -p syncguard-examples --example leader --features leader             # in-memory
//! cargo run -p syncguard-examples --example leader --features leader -- postgres://user@host/db
//! cargo run -p syncguard-examples --example leader --features leader -- redis://127.0.0.1:6379
//! ```
//!
//! Without a URL the backend is in memory; PostgreSQL gets its tables created. The replicas
//! here share one backend instance, as three processes would share PostgreSQL or Redis.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use syncguard::LockError;
use syncguard::backend::LockBackend;
use syncguard::leader::{Election, Leader};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const ELECTION: &str = "example-nightly-report";
/// How long a crashed leader keeps the election before the others take over; an aborted
/// leader (as here) releases its lock on the way out, so it is replaced at once.
const TTL: Duration = Duration::from_secs(5);

async fn backend(url: Option<&str>) -> Result<Arc<dyn LockBackend>, LockError> {
    Ok(match url {
        None => Arc::new(syncguard::MemoryBackend::new()),
        Some(url) if url.starts_with("postgres") => {
            let backend = syncguard::PostgresBackend::connect(url).await?;
            syncguard::postgres::setup_schema(backend.pool(), backend.config()).await?;
            Arc::new(backend)
        }
        Some(url) if url.starts_with("redis") => {
            Arc::new(syncguard::RedisBackend::connect(url).await?)
        }
        Some(other) => {
            return Err(LockError::invalid_argument(format!(
                "unsupported URL {other:?}: give a postgres:// or redis:// URL, or nothing for in-memory"
            )));
        }
    })
}

/// One replica: runs the nightly report only while it leads, until `shutdown`.
fn replica(
    backend: &Arc<dyn LockBackend>,
    identity: &str,
    shutdown: CancellationToken,
) -> Result<JoinHandle<Result<(), LockError>>, LockError> {
    let election = Election::builder(backend, ELECTION)
        .identity(identity)
        .ttl(TTL)
        .build()?;
    Ok(tokio::spawn(async move {
        election
            .run_while_leader(shutdown, async move |leadership| {
                for tick in 1.. {
                    // The term goes with every write, so a deposed leader would be refused.
                    println!(
                        "    {}: report step {tick} (term {})",
                        leadership.identity(),
                        leadership.term()
                    );
                    tokio::time::sleep(Duration::from_millis(400)).await;
                }
            })
            .await?;
        println!("    {}: stopped", election.identity());
        Ok(())
    }))
}

fn describe(leader: Option<&Leader>) -> String {
    match leader {
        Some(leader) => format!("{} leads, term {}", leader.identity, leader.term),
        None => "nobody leads".to_owned(),
    }
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // syncguard reports what needs attention (a lost lock, a failed release) as `tracing`
    // events: without a subscriber nobody sees them.
    tracing_subscriber::fmt::init();
    let url = std::env::args().nth(1);
    let backend = backend(url.as_deref()).await?;

    // An observer, without campaigning: prints every change of leader. A resignation is
    // announced and seen at once; a new leader after a vacancy is seen at the next read.
    let observer = Election::builder(&backend, ELECTION)
        .identity("observer")
        .ttl(TTL)
        .observe_every(Duration::from_millis(250))
        .build()?;
    let mut watch = observer.observe().await?;
    let mut changes = watch.clone();
    tokio::spawn(async move {
        while let Ok(leader) = changes.changed().await {
            println!("observer: {}", describe(leader.as_ref()));
        }
    });

    let shutdown = CancellationToken::new();
    let mut replicas = HashMap::new();
    for n in 1..=3 {
        let identity = format!("replica-{n}");
        let task = replica(&backend, &identity, shutdown.clone())?;
        replicas.insert(identity, task);
    }

    let first = watch
        .wait_for(|leader| leader.is_some())
        .await?
        .expect("a leader");
    tokio::time::sleep(Duration::from_secs(2)).await;

    println!("killing {} (its task is aborted)", first.identity);
    let killed = Instant::now();
    replicas
        .remove(&first.identity)
        .expect("the leader is one of ours")
        .abort();
    let next = watch
        .wait_for(|leader| leader.is_some_and(|leader| leader.term != first.term))
        .await?
        .expect("a new leader");
    println!(
        "{} took over {:?} after the kill, term {} > {}",
        next.identity,
        killed.elapsed(),
        next.term,
        first.term
    );
    assert!(next.term > first.term);
    tokio::time::sleep(Duration::from_secs(2)).await;

    println!("shutting down: the leader stops its report and resigns");
    shutdown.cancel();
    for (_, task) in replicas {
        task.await.expect("a replica panicked")?;
    }
    println!(
        "at the end: {}",
        describe(observer.leader().await?.as_ref())
    );
    // Release what is still held (the dropped guards' pending releases too) before exiting.
    syncguard::shutdown(std::time::Duration::from_secs(5)).await;
    Ok(())
}
