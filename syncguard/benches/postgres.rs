//! PostgreSQL backend benchmark: round trips per operation, then acquire+release cycles/s and
//! latency at 1, 16 and 64 workers on distinct keys and one hot key, against a raw
//! two-statement baseline (upsert ... RETURNING, then DELETE), run both through the pool
//! (sqlx pings every connection returned to its pool, so each statement costs the server two
//! exchanges; the backend keeps its connections between statements instead) and on a
//! dedicated connection per worker (one exchange), and against the reference implementation's own transactions (its acquire and
//! release, statement by statement) in the same run.
//!
//! Needs a PostgreSQL server; `scripts/with-services.sh` starts one:
//!
//! ```sh
//! bash scripts/with-services.sh cargo bench -p syncguard --features postgres --bench postgres
//! ```

#[path = "../tests/support/pg_reference.rs"]
mod pg_reference;
mod support;

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use support::{Cycle, RoundTripProxy, print_header, print_row, run, scenario_duration};
use syncguard::LockId;
use syncguard::backend::{LockBackend, Lookup};
use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};

const TTL: Duration = Duration::from_secs(30);

fn url() -> String {
    std::env::var("SYNCGUARD_TEST_POSTGRES_URL").expect(
        "SYNCGUARD_TEST_POSTGRES_URL is not set: run this through `bash scripts/with-services.sh`",
    )
}

async fn pool(url: &str, connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(connections)
        .min_connections(connections)
        // As PostgresBackend::connect configures it: no ping round trip per checkout. (sqlx
        // still pings every connection returned to the pool, after the caller has its answer.)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(60))
        .connect(url)
        .await
        .expect("connect")
}

#[tokio::main]
async fn main() {
    let url = url();
    let admin = pool(&url, 2).await;
    setup_schema(&admin, &PostgresConfig::new()).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS syncguard_bench_raw (key TEXT PRIMARY KEY, lock_id TEXT NOT NULL, expires_at_ms BIGINT NOT NULL)",
    )
    .execute(&admin)
    .await
    .unwrap();
    let durability: (String, String) =
        sqlx::query_as("SELECT current_setting('synchronous_commit'), current_setting('fsync')")
            .fetch_one(&admin)
            .await
            .unwrap();
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&admin)
        .await
        .unwrap();
    println!(
        "PostgreSQL {version}, synchronous_commit={}, fsync={} (durable commits)\n",
        durability.0, durability.1
    );

    round_trips(&url).await;

    let duration = scenario_duration();
    println!(
        "\nacquire+release cycles, {}s per scenario:\n",
        duration.as_secs_f64()
    );
    print_header();
    for workers in [1, 16, 64] {
        let pool = pool(&url, 2 * workers as u32 + 1).await;
        let backend = PostgresBackend::new(pool.clone(), PostgresConfig::new()).unwrap();
        let run_id = LockId::generate();
        for hot in [false, true] {
            let keys = if hot { "one hot" } else { "distinct" };
            let backend = backend.clone();
            let prefix = format!("bench:{run_id}:{hot}");
            let measured = run(workers, duration, move |worker, _| {
                let backend = backend.clone();
                let key = worker_key(&prefix, hot, worker);
                async move {
                    let outcome = backend.acquire(&key, TTL).await.expect("acquire");
                    let Some(lease) = outcome.lease() else {
                        return Cycle::Contended;
                    };
                    let released = backend.release(&lease.lock_id).await.expect("release");
                    assert!(released.is_released());
                    Cycle::Done
                }
            })
            .await;
            print_row("syncguard acquire+release", workers, keys, &measured);

            // The same two statements as the raw baseline below, each on a connection taken
            // from the pool and returned to it, as the backend takes them: what the pool's
            // ping on return costs, apart from the backend's own work.
            let pooled = pool.clone();
            let pooled_prefix = format!("rawpool:{run_id}:{hot}");
            let measured = run(workers, duration, move |worker, _| {
                let pool = pooled.clone();
                let key = worker_key(&pooled_prefix, hot, worker);
                async move {
                    raw_cycle_pooled(&pool, &key).await;
                    Cycle::Done
                }
            })
            .await;
            print_row("raw upsert+delete, pooled", workers, keys, &measured);

            // Each raw worker keeps one connection for the whole run: no pool traffic at all,
            // the best a hand-written two-statement cycle can do.
            let mut held = Vec::with_capacity(workers);
            for _ in 0..workers {
                held.push(tokio::sync::Mutex::new(
                    pool.acquire().await.expect("connection"),
                ));
            }
            let held = std::sync::Arc::new(held);
            let held_again = std::sync::Arc::clone(&held);
            let raw_prefix = format!("raw:{run_id}:{hot}");
            let measured = run(workers, duration, move |worker, _| {
                let held = std::sync::Arc::clone(&held);
                let key = worker_key(&raw_prefix, hot, worker);
                async move {
                    let mut conn = held[worker].lock().await;
                    raw_cycle(&mut conn, &key).await;
                    Cycle::Done
                }
            })
            .await;
            print_row("raw upsert+delete, held conn", workers, keys, &measured);

            // The reference implementation's transactions, on the same held connections.
            let ref_held = std::sync::Arc::clone(&held_again);
            let ref_prefix = format!("ref:{run_id}:{hot}");
            let measured = run(workers, duration, move |worker, _| {
                let held = std::sync::Arc::clone(&ref_held);
                let key = worker_key(&ref_prefix, hot, worker);
                async move {
                    let mut conn = held[worker].lock().await;
                    match pg_reference::reference_acquire_with_id(&mut conn, &key, 30_000).await {
                        Some((_, lock_id)) => {
                            assert!(pg_reference::reference_release(&mut conn, &lock_id).await);
                            Cycle::Done
                        }
                        None => Cycle::Contended,
                    }
                }
            })
            .await;
            print_row(
                "reference transactions (8 + 5 trips)",
                workers,
                keys,
                &measured,
            );
        }
        pool.close().await;
    }
}

/// The key a worker locks: one shared key, or one per worker.
fn worker_key(prefix: &str, hot: bool, worker: usize) -> String {
    if hot {
        prefix.to_owned()
    } else {
        format!("{prefix}:{worker}")
    }
}

const RAW_UPSERT: &str = "INSERT INTO syncguard_bench_raw (key, lock_id, expires_at_ms) \
     VALUES ($1, $2, floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT + 30000) \
     ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, expires_at_ms = EXCLUDED.expires_at_ms \
     RETURNING expires_at_ms";
const RAW_DELETE: &str = "DELETE FROM syncguard_bench_raw WHERE key = $1";

async fn raw_cycle(conn: &mut sqlx::PgConnection, key: &str) {
    let lock_id = LockId::generate();
    let _expires: i64 = sqlx::query_scalar(RAW_UPSERT)
        .bind(key)
        .bind(lock_id.as_str())
        .fetch_one(&mut *conn)
        .await
        .expect("raw upsert");
    sqlx::query(RAW_DELETE)
        .bind(key)
        .execute(&mut *conn)
        .await
        .expect("raw delete");
}

/// [`raw_cycle`] with each statement on a connection checked out of `pool` and returned.
async fn raw_cycle_pooled(pool: &PgPool, key: &str) {
    let lock_id = LockId::generate();
    let _expires: i64 = sqlx::query_scalar(RAW_UPSERT)
        .bind(key)
        .bind(lock_id.as_str())
        .fetch_one(pool)
        .await
        .expect("raw upsert");
    sqlx::query(RAW_DELETE)
        .bind(key)
        .execute(pool)
        .await
        .expect("raw delete");
}

/// Counts round trips per operation through a proxy, on one warmed-up connection.
async fn round_trips(url: &str) {
    let proxy = RoundTripProxy::start(support::socket_addr_of(url)).await;
    let separator = if url.contains('?') { '&' } else { '?' };
    let proxied = format!(
        "{}{separator}sslmode=disable",
        url.replacen(
            &support::socket_addr_of(url).to_string(),
            &proxy.addr.to_string(),
            1
        )
    );
    let pool = pool(&proxied, 1).await;
    let backend = PostgresBackend::new(pool.clone(), PostgresConfig::new()).unwrap();
    let key = format!("bench:rtt:{}", LockId::generate());
    const N: u64 = 200;

    // Warm up: the first use of each statement on a connection also prepares it.
    for _ in 0..2 {
        let lease = backend.acquire(&key, TTL).await.unwrap().lease().unwrap();
        let _ = backend.extend(&lease.lock_id, TTL).await.unwrap();
        let _ = backend.is_locked(&key).await.unwrap();
        let _ = backend.lookup(Lookup::Key(&key)).await.unwrap();
        let _ = backend
            .lookup(Lookup::LockId(&lease.lock_id))
            .await
            .unwrap();
        let _ = backend.release(&lease.lock_id).await.unwrap();
    }

    let mut counts = [0_u64; 6];
    for _ in 0..N {
        let before = proxy.round_trips();
        let lease = backend.acquire(&key, TTL).await.unwrap().lease().unwrap();
        let after_acquire = proxy.round_trips();
        let _ = backend.extend(&lease.lock_id, TTL).await.unwrap();
        let after_extend = proxy.round_trips();
        let _ = backend.is_locked(&key).await.unwrap();
        let after_is_locked = proxy.round_trips();
        let _ = backend.lookup(Lookup::Key(&key)).await.unwrap();
        let after_by_key = proxy.round_trips();
        let _ = backend
            .lookup(Lookup::LockId(&lease.lock_id))
            .await
            .unwrap();
        let after_by_id = proxy.round_trips();
        let _ = backend.release(&lease.lock_id).await.unwrap();
        let after_release = proxy.round_trips();
        let marks = [
            before,
            after_acquire,
            after_extend,
            after_is_locked,
            after_by_key,
            after_by_id,
            after_release,
        ];
        for (count, pair) in counts.iter_mut().zip(marks.windows(2)) {
            *count += pair[1] - pair[0];
        }
    }
    println!("round trips per operation (measured over {N} operations each, after warm-up):\n");
    println!(
        "(every ReadyForQuery on the wire; this includes the ping sqlx sends on each connection \
         it takes back into its pool, after the operation has answered)\n"
    );
    println!("| operation | round trips |");
    println!("|---|---:|");
    let names = [
        "acquire",
        "extend",
        "is_locked",
        "lookup by key",
        "lookup by lock id",
        "release",
    ];
    for (name, count) in names.iter().zip(counts) {
        println!("| {name} | {:.2} |", count as f64 / N as f64);
    }
    let cycle = (counts[0] + counts[5]) as f64 / N as f64;
    println!("| acquire+release cycle | {cycle:.2} |");

    // The raw baseline's two statements through the same pool, for comparison.
    raw_cycle_pooled(&pool, &key).await;
    let before = proxy.round_trips();
    for _ in 0..N {
        raw_cycle_pooled(&pool, &key).await;
    }
    // The last return's ping may still be on its way: wait until the count settles.
    let mut settled = proxy.round_trips();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = proxy.round_trips();
        if now == settled {
            break;
        }
        settled = now;
    }
    let raw = (settled - before) as f64 / N as f64;
    println!("| raw upsert+delete, pooled (for comparison) | {raw:.2} |");
}
