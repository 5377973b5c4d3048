//! The fault suite: PostgreSQL and Redis servers of the suite's own are killed, restarted,
//! paused, cut off by a partition, and have their connections terminated, while two backend
//! instances (as two processes would have) with eight workers each contend for one key.
//!
//! Every hold is recorded and checked with [`syncguard::conformance::history`]: no two
//! holders at once, fences increasing in the order holders acted, no fence repeated (across
//! restarts too). Every backend call is timed and must return within the backend's configured
//! timeouts; no task may panic; after each fault heals, a fresh acquire and release must
//! succeed on each instance. The figures (holds, losses, how long after a fault holders
//! noticed a loss, recovery time, slowest calls) are printed: run with `--nocapture`.
//!
//! Needs redis-server and PostgreSQL's binaries: `bash scripts/test-all.sh` installs them and
//! exports where they are.

#[path = "../support/forward.rs"]
mod forward;
#[path = "../support/proxy.rs"]
mod proxy;
#[path = "../support/servers.rs"]
mod servers;
mod timed;
mod workload;

use std::sync::Arc;
use std::time::Duration;

use proxy::Proxy;
use servers::{PostgresServer, RedisServer};
use sqlx::{Connection, PgConnection};
use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig};
use timed::{CallTimes, timed};
use tokio::time::sleep;
use workload::{TTL, count_panics, report};

/// The fail-fast timeouts every instance runs with.
const TIMEOUT: Duration = Duration::from_millis(500);
/// Slack on a loaded machine beyond the timeouts' sum.
const MARGIN: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_under_faults() {
    count_panics();
    let mut server = RedisServer::start("always").await;
    let proxy = Proxy::start(&server.addr()).await;
    let url = format!("redis://{}", proxy.addr());
    let times = Arc::new(CallTimes::default());
    let mut instances = Vec::new();
    for mode in [
        ConnectionMode::Multiplexed,
        ConnectionMode::Pool { max_size: 8 },
    ] {
        let backend = RedisBackend::connect_with(
            &url,
            RedisConfig::new()
                .with_connection_mode(mode)
                .with_operation_timeout(TIMEOUT)
                .with_connect_timeout(TIMEOUT),
        )
        .await
        .expect("connect to the suite's redis-server");
        instances.push(timed(backend, &times));
    }

    let mut figures = Vec::new();
    figures.push(
        workload::run("redis kill -9 and restart (AOF)", &instances, async {
            server.kill();
            sleep(Duration::from_millis(1500)).await;
            server.launch().await;
        })
        .await,
    );
    figures.push(
        workload::run("redis SIGSTOP past the ttl", &instances, async {
            server.pause();
            sleep(TTL + Duration::from_millis(1500)).await;
            server.resume();
        })
        .await,
    );
    figures.push(
        workload::run("redis partition", &instances, async {
            proxy.stall();
            sleep(Duration::from_secs(2)).await;
            proxy.resume();
        })
        .await,
    );
    // The pool's worst case: waiting for a connection, creating one, checking it, and the
    // response (each bounded by one of the two timeouts).
    report(&figures, &times, TIMEOUT * 4 + MARGIN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_under_faults() {
    count_panics();
    let server = PostgresServer::start().await;
    let mut admin = PgConnection::connect(&server.url()).await.unwrap();
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    setup_schema(&pool, &PostgresConfig::new()).await.unwrap();
    pool.close().await;
    let proxy = Proxy::start(&server.addr()).await;
    let url = server
        .url()
        .replace(&server.addr(), &proxy.addr().to_string());
    let config = PostgresConfig::new()
        .with_connect_timeout(TIMEOUT)
        .with_operation_timeout(TIMEOUT);
    let times = Arc::new(CallTimes::default());
    let mut instances = Vec::new();
    for _ in 0..2 {
        let backend = PostgresBackend::connect_with(&url, config.clone())
            .await
            .expect("connect to the suite's PostgreSQL");
        instances.push(timed(backend, &times));
    }

    let mut figures = Vec::new();
    figures.push(
        workload::run(
            "postgres pg_terminate_backend of every client",
            &instances,
            async {
                // Twice: the second round finds the connections opened after the first.
                let mut terminated = 0;
                for _ in 0..2 {
                    let round: Vec<bool> = sqlx::query_scalar(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                    )
                    .fetch_all(&mut admin)
                    .await
                    .unwrap();
                    terminated += round.len();
                    sleep(Duration::from_millis(300)).await;
                }
                assert!(terminated > 0, "no client connection to terminate");
            },
        )
        .await,
    );
    figures.push(
        workload::run("postgres restart (immediate)", &instances, async {
            // pg_ctl blocks; the workers run on the runtime's other threads meanwhile.
            tokio::task::block_in_place(|| server.restart());
        })
        .await,
    );
    figures.push(
        workload::run("postgres partition", &instances, async {
            proxy.stall();
            sleep(Duration::from_secs(2)).await;
            proxy.resume();
        })
        .await,
    );
    // Waiting for a connection and a statement, then a retry: connecting and a statement.
    report(&figures, &times, TIMEOUT * 4 + MARGIN);
}
