//! Redis backend throughput: acquire+release cycles per second and cycle latency, at 1, 16 and
//! 64 concurrent workers, on distinct keys and on one hot key, for each connection mode and
//! layout on one server and on a Redis Cluster; and in the same run the raw ceiling of the
//! servers: pipelined EVALSHA of a trivial script at the same concurrency over one multiplexed
//! connection (a cycle is two operations, which the backend batches with those of other
//! workers; on a cluster, only with those of the same lock key). Each row also gives the
//! servers' CPU time per cycle (`INFO cpu`) and how many operations went into one script call
//! (`INFO commandstats`); on a cluster both are summed over its primaries, which serve the
//! calls, and its replicas' CPU is given apart; and this process's CPU per cycle (the client,
//! `/proc/self/stat`), so that what bounds a row on a small machine shows. Every error is
//! counted by kind, on the client (by operation, error code and the server's reply code) and
//! on the servers (`INFO errorstats`, over every node); the bench exits with an error status
//! if any operation failed or a server answered CROSSSLOT or NOSCRIPT.
//!
//! ```text
//! bash scripts/with-services.sh cargo bench -p syncguard --features redis-cluster --bench redis
//! ```
//!
//! Rows, by name (`SYNCGUARD_BENCH_ONLY` is a comma-separated filter on these, each matching
//! the rows whose name contains it, such as `raw/64,multi/64/distinct,cluster/`):
//!
//! | name | what |
//! |---|---|
//! | `raw/<workers>` | one server's ceiling: EVALSHA of `return 1`, no keys |
//! | `multi/<workers>/<distinct or hot>` | one server, reference layout, multiplexed connection |
//! | `multi-cl/<workers>/<distinct or hot>` | one server, cluster layout, multiplexed connection |
//! | `pool/<workers>/<distinct or hot>` | one server, reference layout, deadpool-redis pool |
//! | `cluster/<workers>/raw` | the cluster's ceiling: EVALSHA of `return 1` with the worker's key, sent to its node |
//! | `cluster/<workers>/<distinct or hot>` | the cluster (`redis-cluster://` URL, cluster layout) |
//!
//! Reads one server from `SYNCGUARD_TEST_REDIS_URL` and the cluster from
//! `SYNCGUARD_TEST_REDIS_CLUSTER_URL` and `SYNCGUARD_TEST_REDIS_CLUSTER_NODES` (every node,
//! `host:port` separated by commas, for the statistics); a row whose server is not given fails
//! the run before anything is measured. `SYNCGUARD_BENCH_SECS` sets the measured time per row
//! (default 3), `SYNCGUARD_BENCH_MIN_CYCLES` a number of measured cycles each row goes on to
//! (default 0; a row stops anyway 600 s after its measured time), `SYNCGUARD_BENCH_THREADS` the
//! runtime's worker threads (default 1, a current-thread runtime). At least 10^6 cycles on the
//! cluster without an error:
//!
//! ```text
//! SYNCGUARD_BENCH_ONLY=cluster/64/distinct SYNCGUARD_BENCH_MIN_CYCLES=1000000 \
//!   bash scripts/with-services.sh cargo bench -p syncguard --features redis-cluster --bench redis
//! ```

mod support;

use std::collections::BTreeMap;
use std::error::Error;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use support::settings;
use syncguard::backend::{AcquireOutcome, LockBackend};
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig, RedisLayout};
use syncguard::{LockError, LockId};
use tokio::time::Instant;

const WORKERS: [usize; 3] = [1, 16, 64];
const WARMUP: Duration = Duration::from_millis(500);
/// How long a row may go on past its measured time to reach `SYNCGUARD_BENCH_MIN_CYCLES`.
const MAX_OVERTIME: Duration = Duration::from_secs(600);
/// The pause of a worker after an error, so that a failing server is not hammered.
const AFTER_ERROR: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, PartialEq)]
enum Keys {
    Distinct,
    Hot,
}

impl Keys {
    /// The part of a row's name.
    fn short(self) -> &'static str {
        match self {
            Keys::Distinct => "distinct",
            Keys::Hot => "hot",
        }
    }

    /// The table's wording.
    fn long(self) -> &'static str {
        match self {
            Keys::Distinct => "distinct",
            Keys::Hot => "one hot key",
        }
    }
}

/// How long each row runs.
#[derive(Clone, Copy)]
struct Limits {
    /// The measured time, at least.
    measure: Duration,
    /// Measured cycles the row goes on to past its measured time (within [`MAX_OVERTIME`]).
    min_cycles: u64,
}

struct Row {
    /// The name `SYNCGUARD_BENCH_ONLY` filters on, such as `multi-cl/64/distinct`.
    name: String,
    what: String,
    workers: usize,
    keys: &'static str,
    /// Measured cycles (raw rows: calls) and the time they took.
    cycles: u64,
    secs: f64,
    per_sec: f64,
    contended_per_sec: f64,
    p50_us: u32,
    p99_us: u32,
    /// Server CPU (user + system) per cycle, from `INFO cpu` over the measured time; on a
    /// cluster, of its primaries.
    server_us: f64,
    /// A cluster's replicas' CPU per cycle (replication); `None` on one server.
    replicas_us: Option<f64>,
    /// This process's CPU (user + system) per cycle, all its threads, from `/proc/self/stat`;
    /// `None` where there is no such file.
    client_us: Option<f64>,
    /// Operations (acquire, release) per script call, from `INFO commandstats`.
    per_call: f64,
    /// Failed operations by kind: (count, the first one's message).
    client_errors: BTreeMap<String, (u64, String)>,
    /// The servers' error replies by code (`INFO errorstats`, every node), over the whole row.
    server_errors: BTreeMap<String, u64>,
}

// --- The servers' statistics -------------------------------------------------------------

/// Script calls in `INFO commandstats`: FCALL of the batch function, or EVALSHA + EVAL where
/// the batch goes by script.
const SCRIPT_CALLS: [&str; 3] = [
    "cmdstat_fcall:calls=",
    "cmdstat_evalsha:calls=",
    "cmdstat_eval:calls=",
];

/// The servers' counters at one moment: CPU seconds so far and script calls, summed over the
/// primaries (one server is a primary), the replicas' CPU seconds, and every node's error
/// replies by code.
#[derive(Default)]
struct Sample {
    primaries_cpu: f64,
    replicas_cpu: f64,
    calls: u64,
    errors: BTreeMap<String, u64>,
}

/// One statistics connection per node of a row's servers (one server, or every node of a
/// cluster, primaries and replicas), reconnecting when dropped (a killed client, a restarted
/// node).
struct Servers {
    nodes: Vec<redis::aio::ConnectionManager>,
}

impl Servers {
    async fn open(urls: &[String]) -> Self {
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            let client = redis::Client::open(url.as_str()).expect("node url");
            let node = redis::aio::ConnectionManager::new(client)
                .await
                .unwrap_or_else(|error| panic!("statistics connection to {url}: {error}"));
            nodes.push(node);
        }
        Self { nodes }
    }

    /// Reads every node's counters; a node's role is read each time, so a failover between
    /// two samples counts each node where it was at the end.
    async fn sample(&mut self) -> Sample {
        let mut sample = Sample::default();
        let mut info = redis::cmd("INFO");
        info.arg("cpu")
            .arg("commandstats")
            .arg("errorstats")
            .arg("replication");
        for node in &mut self.nodes {
            // A dropped connection fails the one request, then reconnects.
            let answer = match info.query_async::<String>(node).await {
                Ok(answer) => answer,
                Err(_) => info.query_async(node).await.expect("INFO"),
            };
            add_node(&mut sample, &answer);
        }
        sample
    }
}

/// Adds one node's `INFO` to `sample`.
fn add_node(sample: &mut Sample, info: &str) {
    let mut cpu = 0.0;
    let mut calls = 0;
    let mut primary = false;
    for line in info.lines() {
        if let Some(v) = line
            .strip_prefix("used_cpu_sys:")
            .or_else(|| line.strip_prefix("used_cpu_user:"))
        {
            cpu += v.trim().parse::<f64>().unwrap_or(0.0);
        }
        if let Some(rest) = SCRIPT_CALLS
            .iter()
            .find_map(|prefix| line.strip_prefix(prefix))
        {
            calls += leading_number(rest);
        }
        if let Some(rest) = line.strip_prefix("errorstat_")
            && let Some((code, count)) = rest.split_once(":count=")
        {
            *sample.errors.entry(code.to_owned()).or_default() += leading_number(count);
        }
        if line.trim() == "role:master" {
            primary = true;
        }
    }
    if primary {
        sample.primaries_cpu += cpu;
        sample.calls += calls;
    } else {
        sample.replicas_cpu += cpu;
    }
}

/// The number `text` starts with, up to a comma.
fn leading_number(text: &str) -> u64 {
    text.split(',')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The error replies counted between two samples, by code (only those that grew).
fn errors_between(before: &Sample, after: &Sample) -> BTreeMap<String, u64> {
    after
        .errors
        .iter()
        .filter_map(|(code, &count)| {
            let grown = count - before.errors.get(code).copied().unwrap_or(0).min(count);
            (grown > 0).then(|| (code.clone(), grown))
        })
        .collect()
}

// --- Running a row -----------------------------------------------------------------------

/// What every worker of a row shares: when the measured time starts, whether to stop, the
/// measured cycles so far and the errors by kind.
struct Run {
    start: Instant,
    stopped: AtomicBool,
    measured: AtomicU64,
    errors: Mutex<BTreeMap<String, (u64, String)>>,
}

impl Run {
    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Records one cycle that `began` then and just ended: its latency when it is measured.
    fn done(&self, began: Instant, latencies: &mut Vec<u32>) {
        if began >= self.start {
            let micros = began.elapsed().as_micros();
            latencies.push(u32::try_from(micros).unwrap_or(u32::MAX));
            self.measured.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one failed operation of `kind`, keeping the first one's message.
    async fn failed(&self, kind: String, message: impl FnOnce() -> String) {
        self.errors
            .lock()
            .expect("errors")
            .entry(kind)
            .or_insert_with(|| (0, message()))
            .0 += 1;
        tokio::time::sleep(AFTER_ERROR).await;
    }
}

/// What one worker measured.
struct Tally {
    latencies: Vec<u32>,
    contended: u64,
}

impl Tally {
    /// An empty tally with room for `latencies` measured cycles.
    fn with_room(latencies: usize) -> Self {
        Self {
            latencies: Vec::with_capacity(latencies),
            contended: 0,
        }
    }
}

/// What a row measured, before it is turned into a [`Row`].
struct Measured {
    /// Sorted.
    latencies: Vec<u32>,
    contended: u64,
    secs: f64,
    primaries_cpu: f64,
    replicas_cpu: f64,
    calls: u64,
    client_cpu: Option<f64>,
    client_errors: BTreeMap<String, (u64, String)>,
    server_errors: BTreeMap<String, u64>,
}

/// Runs `workers` copies of `worker` until the measured time (after a warm-up) has passed and
/// `min_cycles` cycles were measured, sampling `servers` around the measured time (CPU, calls)
/// and around the whole row (errors).
async fn measure<F, Fut>(servers: &[String], workers: usize, limits: Limits, worker: F) -> Measured
where
    F: Fn(usize, Arc<Run>) -> Fut,
    Fut: Future<Output = Tally> + Send + 'static,
{
    let mut stats = Servers::open(servers).await;
    let before = stats.sample().await;
    let run = Arc::new(Run {
        start: Instant::now() + WARMUP,
        stopped: AtomicBool::new(false),
        measured: AtomicU64::new(0),
        errors: Mutex::default(),
    });
    let tasks: Vec<_> = (0..workers)
        .map(|index| tokio::spawn(worker(index, Arc::clone(&run))))
        .collect();
    tokio::time::sleep_until(run.start).await;
    let at_start = stats.sample().await;
    let client_at_start = client_cpu();
    tokio::time::sleep_until(run.start + limits.measure).await;
    let cap = run.start + limits.measure + MAX_OVERTIME;
    while run.measured.load(Ordering::Relaxed) < limits.min_cycles && Instant::now() < cap {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run.stopped.store(true, Ordering::Relaxed);
    let secs = run.start.elapsed().as_secs_f64();
    let client_at_end = client_cpu();
    let at_end = stats.sample().await;
    let mut latencies = Vec::new();
    let mut contended = 0;
    for task in tasks {
        let tally = task.await.expect("worker");
        latencies.extend(tally.latencies);
        contended += tally.contended;
    }
    latencies.sort_unstable();
    let after = stats.sample().await;
    let client_errors = std::mem::take(&mut *run.errors.lock().expect("errors"));
    Measured {
        latencies,
        contended,
        secs,
        primaries_cpu: at_end.primaries_cpu - at_start.primaries_cpu,
        replicas_cpu: at_end.replicas_cpu - at_start.replicas_cpu,
        calls: at_end.calls - at_start.calls,
        client_cpu: client_at_end
            .zip(client_at_start)
            .map(|(end, start)| end - start),
        client_errors,
        server_errors: errors_between(&before, &after),
    }
}

/// This process's CPU seconds so far (user + system, every thread), from `/proc/self/stat`.
fn client_cpu() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces, and ends at the last `)`):
    // state is the first, utime the 12th and stime the 13th, in clock ticks.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    // USER_HZ, 100 on every Linux architecture Rust runs on.
    Some((utime + stime) / 100.0)
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank]
}

/// How a row reports a failed operation: the operation, the error's code and, where the
/// error came from a server's reply, its code (`CROSSSLOT`, `NOSCRIPT`, `MOVED`...).
fn error_kind(operation: &str, error: &LockError) -> String {
    let mut next: Option<&(dyn Error + 'static)> = Some(error);
    while let Some(cause) = next {
        let reply = match (
            cause.downcast_ref::<redis::ServerError>(),
            cause.downcast_ref::<redis::RedisError>(),
        ) {
            (Some(server), _) => Some(server.code().to_owned()),
            (None, Some(redis)) => redis.code().map(str::to_owned),
            (None, None) => None,
        };
        if let Some(reply) = reply {
            return format!("{operation}: {} ({reply})", error.code().as_str());
        }
        next = cause.source();
    }
    format!("{operation}: {}", error.code().as_str())
}

/// An error's message with its sources.
fn full_message(error: &dyn Error) -> String {
    let mut message = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        next = cause.source();
    }
    message
}

/// Where a row runs, and what it is called in the table.
struct Target<'a> {
    name: String,
    what: &'a str,
    /// The nodes whose statistics the row reads (`redis://` URLs).
    servers: &'a [String],
    /// Whether `servers` are a cluster's (the replicas' CPU is then given).
    cluster: bool,
}

impl<'a> Target<'a> {
    fn new(name: String, what: &'a str, servers: &'a [String], cluster: bool) -> Self {
        Self {
            name,
            what,
            servers,
            cluster,
        }
    }
}

/// Runs `workers` loops of acquire+release for the measured time, after a warm-up.
async fn cycles(
    backend: &RedisBackend,
    target: Target<'_>,
    workers: usize,
    keys: Keys,
    limits: Limits,
) -> Row {
    let run_id = LockId::generate();
    let measured = measure(target.servers, workers, limits, |worker, run| {
        let backend = backend.clone();
        let key = match keys {
            Keys::Distinct => format!("bench:{run_id}:{worker}"),
            Keys::Hot => format!("bench:{run_id}:hot"),
        };
        async move {
            let mut tally = Tally::with_room(1 << 16);
            while !run.stopped() {
                let began = Instant::now();
                let lease = match backend.acquire(&key, Duration::from_secs(30)).await {
                    Ok(AcquireOutcome::Acquired(lease)) => lease,
                    Ok(_) => {
                        if began >= run.start {
                            tally.contended += 1;
                        }
                        tokio::task::yield_now().await;
                        continue;
                    }
                    Err(error) => {
                        run.failed(error_kind("acquire", &error), || full_message(&error))
                            .await;
                        continue;
                    }
                };
                match backend.release(&lease.lock_id).await {
                    Ok(released) if released.is_released() => run.done(began, &mut tally.latencies),
                    Ok(other) => {
                        let message = || format!("{other:?}");
                        run.failed("release: answered not released".to_owned(), message)
                            .await;
                    }
                    Err(error) => {
                        run.failed(error_kind("release", &error), || full_message(&error))
                            .await;
                    }
                }
            }
            tally
        }
    })
    .await;
    let cycles = measured.latencies.len() as f64;
    let operations = cycles * 2.0 + measured.contended as f64;
    Row {
        per_call: operations / measured.calls.max(1) as f64,
        contended_per_sec: measured.contended as f64 / measured.secs,
        keys: keys.long(),
        ..row(target, workers, measured)
    }
}

/// The row of `measured`, with one operation per call and nothing contended.
fn row(target: Target<'_>, workers: usize, measured: Measured) -> Row {
    let cycles = measured.latencies.len() as u64;
    let per_cycle = |cpu: f64| cpu * 1e6 / cycles.max(1) as f64;
    Row {
        name: target.name,
        what: target.what.to_owned(),
        workers,
        keys: "-",
        cycles,
        secs: measured.secs,
        per_sec: cycles as f64 / measured.secs,
        contended_per_sec: 0.0,
        p50_us: percentile(&measured.latencies, 0.50),
        p99_us: percentile(&measured.latencies, 0.99),
        server_us: per_cycle(measured.primaries_cpu),
        replicas_us: target.cluster.then(|| per_cycle(measured.replicas_cpu)),
        client_us: measured.client_cpu.map(per_cycle),
        per_call: 1.0,
        client_errors: measured.client_errors,
        server_errors: measured.server_errors,
    }
}

/// `workers` loops of EVALSHA of `return 1` on one multiplexed connection: with no key on one
/// server, with the worker's own key on a cluster (which sends it to that key's node).
async fn raw_ceiling<C>(conn: C, target: Target<'_>, workers: usize, limits: Limits) -> Row
where
    C: ConnectionLike + Clone + Send + 'static,
{
    let sha = Arc::new(redis::Script::new(RAW_SCRIPT).get_hash().to_owned());
    let run_id = LockId::generate();
    let keyed = target.cluster;
    let measured = measure(target.servers, workers, limits, |worker, run| {
        let mut conn = conn.clone();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha.as_str());
        if keyed {
            cmd.arg(1).arg(format!("bench:{run_id}:{worker}"));
        } else {
            cmd.arg(0);
        }
        async move {
            let mut tally = Tally::with_room(1 << 17);
            while !run.stopped() {
                let began = Instant::now();
                match cmd.query_async::<i64>(&mut conn).await {
                    Ok(1) => run.done(began, &mut tally.latencies),
                    Ok(other) => {
                        let message = || format!("answered {other}");
                        run.failed("raw EVALSHA: wrong answer".to_owned(), message)
                            .await;
                    }
                    Err(error) => {
                        let kind = format!("raw EVALSHA ({})", error.code().unwrap_or("-"));
                        run.failed(kind, || full_message(&error)).await;
                    }
                }
            }
            tally
        }
    })
    .await;
    row(target, workers, measured)
}

/// The raw ceiling's script.
const RAW_SCRIPT: &str = "return 1";

// --- The servers ---------------------------------------------------------------------------

/// The cluster: its URL, and every node's `redis://` URL for the statistics.
struct ClusterSetup {
    url: String,
    nodes: Vec<String>,
}

/// How to get a cluster, for the messages of a run that needs one and has none.
const CLUSTER_HOWTO: &str = "run through `bash scripts/with-services.sh`, which starts a \
    3-primary, 3-replica cluster on loopback and sets SYNCGUARD_TEST_REDIS_CLUSTER_URL and \
    SYNCGUARD_TEST_REDIS_CLUSTER_NODES; or start one yourself (6 `redis-server \
    --cluster-enabled yes`, then `redis-cli --cluster create <the 6 host:port> \
    --cluster-replicas 1`) and set SYNCGUARD_TEST_REDIS_CLUSTER_URL=redis-cluster://<host:port,...> \
    and SYNCGUARD_TEST_REDIS_CLUSTER_NODES=<every node's host:port, comma-separated>; or leave \
    the cluster rows out with SYNCGUARD_BENCH_ONLY (e.g. raw/,multi/,multi-cl/,pool/)";

fn cluster_setup() -> ClusterSetup {
    let url = std::env::var("SYNCGUARD_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        panic!("SYNCGUARD_TEST_REDIS_CLUSTER_URL is not set, and the cluster rows need it: {CLUSTER_HOWTO}")
    });
    let nodes = std::env::var("SYNCGUARD_TEST_REDIS_CLUSTER_NODES").unwrap_or_else(|_| {
        panic!(
            "SYNCGUARD_TEST_REDIS_CLUSTER_NODES is not set, and the cluster rows read every \
             node's statistics from it: {CLUSTER_HOWTO}"
        )
    });
    let nodes: Vec<String> = nodes
        .split(',')
        .map(str::trim)
        .filter(|node| !node.is_empty())
        .map(|node| format!("redis://{node}"))
        .collect();
    assert!(
        !nodes.is_empty(),
        "SYNCGUARD_TEST_REDIS_CLUSTER_NODES names no node: {CLUSTER_HOWTO}"
    );
    ClusterSetup { url, nodes }
}

/// A cluster connection with [`RAW_SCRIPT`] loaded on every primary.
async fn raw_cluster_connection(nodes: &[String]) -> redis::cluster_async::ClusterConnection {
    let mut conn = ClusterClient::new(nodes.iter().map(String::as_str))
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("connect to the cluster");
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(RAW_SCRIPT);
    let primaries = RoutingInfo::MultiNode((
        MultipleNodeRoutingInfo::AllMasters,
        Some(ResponsePolicy::AllSucceeded),
    ));
    conn.route_command(load, primaries)
        .await
        .expect("load the raw script on every primary");
    conn
}

// --- The run -------------------------------------------------------------------------------

fn main() {
    let url = std::env::var("SYNCGUARD_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!(
            "SYNCGUARD_TEST_REDIS_URL is not set: run `bash scripts/with-services.sh cargo bench \
             -p syncguard --features redis-cluster --bench redis` (it installs and starts \
             redis-server)"
        )
    });
    let limits = Limits {
        measure: settings::measured_time(3.0),
        min_cycles: settings::number_or("SYNCGUARD_BENCH_MIN_CYCLES", 0),
    };
    // One runtime thread by default: on a small machine the Redis server needs the other
    // cores, and a single-threaded client avoids cross-thread wake-ups on every reply.
    let threads = settings::runtime_threads(1);
    let runtime = settings::runtime(threads);
    let only = std::env::var("SYNCGUARD_BENCH_ONLY").unwrap_or_default();
    let wanted = |what: &str| only.is_empty() || only.split(',').any(|o| what.contains(o));
    let cluster_wanted = WORKERS.iter().any(|workers| {
        ["raw", "distinct", "hot"]
            .iter()
            .any(|kind| wanted(&format!("cluster/{workers}/{kind}")))
    });
    // Checked before anything runs: a run that cannot do its cluster rows fails at once.
    let cluster = cluster_wanted.then(cluster_setup);
    let one_server = [url.clone()];

    let rows = runtime.block_on(async {
        let multiplexed = RedisBackend::connect(&url).await.expect("connect");
        let multiplexed_cl =
            RedisBackend::connect_with(&url, RedisConfig::new().with_layout(RedisLayout::Cluster))
                .await
                .expect("connect (cluster layout)");
        let pool = RedisBackend::connect_with(
            &url,
            RedisConfig::new().with_connection_mode(ConnectionMode::Pool { max_size: 64 }),
        )
        .await
        .expect("connect (pool)");
        let raw_one =
            redis::aio::ConnectionManager::new(redis::Client::open(url.as_str()).expect("url"))
                .await
                .expect("connect");
        redis::Script::new(RAW_SCRIPT)
            .load_async(&mut raw_one.clone())
            .await
            .expect("load");
        let on_cluster = match &cluster {
            Some(cluster) => Some((
                RedisBackend::connect(&cluster.url)
                    .await
                    .expect("connect to the cluster"),
                raw_cluster_connection(&cluster.nodes).await,
                cluster.nodes.as_slice(),
            )),
            None => None,
        };
        let mut rows = Vec::new();
        for workers in WORKERS {
            let name = format!("raw/{workers}");
            if wanted(&name) {
                let what = "raw EVALSHA `return 1` (ops/s)";
                let target = Target::new(name, what, &one_server, false);
                rows.push(raw_ceiling(raw_one.clone(), target, workers, limits).await);
            }
            for (short, what, backend) in [
                ("multi", "multiplexed (ConnectionManager)", &multiplexed),
                ("multi-cl", "multiplexed, cluster layout", &multiplexed_cl),
                ("pool", "pool (deadpool-redis, 64)", &pool),
            ] {
                for keys in [Keys::Distinct, Keys::Hot] {
                    let name = format!("{short}/{workers}/{}", keys.short());
                    if wanted(&name) {
                        let target = Target::new(name, what, &one_server, false);
                        rows.push(cycles(backend, target, workers, keys, limits).await);
                    }
                }
            }
            let Some((backend, raw, nodes)) = &on_cluster else {
                continue;
            };
            let name = format!("cluster/{workers}/raw");
            if wanted(&name) {
                let what = "cluster: raw EVALSHA `return 1` by key (ops/s)";
                let target = Target::new(name, what, nodes, true);
                rows.push(raw_ceiling(raw.clone(), target, workers, limits).await);
            }
            for keys in [Keys::Distinct, Keys::Hot] {
                let name = format!("cluster/{workers}/{}", keys.short());
                if wanted(&name) {
                    let what = "cluster 3+3 (redis-cluster://)";
                    let target = Target::new(name, what, nodes, true);
                    rows.push(cycles(backend, target, workers, keys, limits).await);
                }
            }
        }
        rows
    });

    print_table(&rows, threads, limits);
    print_errors(&rows);
    print_targets(&rows);
    if let Some(failure) = failure(&rows) {
        eprintln!("\n{failure}");
        std::process::exit(1);
    }
}

// --- The report ----------------------------------------------------------------------------

fn print_table(rows: &[Row], threads: usize, limits: Limits) {
    println!(
        "\nRedis backend, {threads} runtime threads, {}s per row{} (cycle = acquire + release; \
         on the cluster, server µs are its primaries', replica µs its replicas')\n",
        limits.measure.as_secs_f64(),
        match limits.min_cycles {
            0 => String::new(),
            n => format!(" and at least {n} cycles"),
        }
    );
    println!(
        "| row | mode | workers | keys | cycles/s | p50 µs | p99 µs | contended acquires/s | \
         server µs/cycle | replica µs/cycle | client µs/cycle | operations/script call |"
    );
    println!("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        println!(
            "| {} | {} | {} | {} | {:.0} | {} | {} | {:.0} | {:.1} | {} | {} | {:.1} |",
            row.name,
            row.what,
            row.workers,
            row.keys,
            row.per_sec,
            row.p50_us,
            row.p99_us,
            row.contended_per_sec,
            row.server_us,
            one_decimal(row.replicas_us, "-"),
            one_decimal(row.client_us, "-"),
            row.per_call
        );
    }
}

/// `value` with one decimal, or `none`.
fn one_decimal(value: Option<f64>, none: &str) -> String {
    value.map_or(none.to_owned(), |value| format!("{value:.1}"))
}

/// Every row's measured cycles and errors: the client's by kind, the servers' by reply code.
fn print_errors(rows: &[Row]) {
    println!(
        "\nErrors (client: every failed operation, by kind; servers: `INFO errorstats` of every \
         node over the whole row, warm-up included)\n"
    );
    println!("| row | measured cycles (raw: calls) | seconds | client errors | server errors |");
    println!("|---|---:|---:|---|---|");
    for row in rows {
        let client = row
            .client_errors
            .iter()
            .map(|(kind, (count, _))| format!("{kind}: {count}"))
            .collect::<Vec<_>>();
        let server = row
            .server_errors
            .iter()
            .map(|(code, count)| format!("{code}: {count}"))
            .collect::<Vec<_>>();
        let listed = |list: Vec<String>| match list.is_empty() {
            true => "0".to_owned(),
            false => list.join(", "),
        };
        println!(
            "| {} | {} | {:.1} | {} | {} |",
            row.name,
            row.cycles,
            row.secs,
            listed(client),
            listed(server)
        );
    }
    for row in rows {
        for (kind, (count, first)) in &row.client_errors {
            println!("{}: {kind} ×{count}, the first: {first}", row.name);
        }
    }
}

/// Issue 33's targets, from the 64-worker rows on distinct keys.
fn print_targets(rows: &[Row]) {
    let find = |name: &str| rows.iter().find(|row| row.name == name);
    let percent = |part: Option<&Row>, whole: Option<f64>| match (part, whole) {
        (Some(part), Some(whole)) if whole > 0.0 => {
            format!("{:.0} %", 100.0 * part.per_sec / whole)
        }
        _ => "n/a (row not run)".to_owned(),
    };
    let reference = find("multi/64/distinct");
    let layout = find("multi-cl/64/distinct");
    let cluster = find("cluster/64/distinct");
    let half_ceiling = find("raw/64").map(|raw| raw.per_sec / 2.0);
    let half_cluster_ceiling = find("cluster/64/raw").map(|raw| raw.per_sec / 2.0);
    let cycles =
        |row: Option<&Row>| row.map_or("n/a".to_owned(), |row| format!("{:.0}", row.per_sec));
    let cpu = |row: Option<&Row>| one_decimal(row.map(|row| row.server_us), "n/a");
    let client = |row: Option<&Row>| one_decimal(row.and_then(|row| row.client_us), "n/a");
    println!("\nAt 64 workers on distinct keys (issue 33's targets):");
    println!(
        "- the cluster: {} cycles/s, {} of one server's in the reference layout ({}) [target \
         ≥ 80 %], {} of one server's in the cluster layout ({}); {} of half the cluster's raw \
         ceiling",
        cycles(cluster),
        percent(cluster, reference.map(|row| row.per_sec)),
        cycles(reference),
        percent(cluster, layout.map(|row| row.per_sec)),
        cycles(layout),
        percent(cluster, half_cluster_ceiling),
    );
    println!(
        "- one server: half the raw ceiling {}; the cluster layout {} cycles/s, {} of it \
         [target ≥ 70 %]; the reference layout {} cycles/s, {} of it",
        half_ceiling.map_or("n/a".to_owned(), |half| format!("{half:.0}")),
        cycles(layout),
        percent(layout, half_ceiling),
        cycles(reference),
        percent(reference, half_ceiling),
    );
    println!(
        "- server CPU per cycle: reference layout {} µs, cluster layout {} µs, the cluster {} µs \
         (primaries) + {} µs (replicas); two bare script calls {} µs",
        cpu(reference),
        cpu(layout),
        cpu(cluster),
        one_decimal(cluster.and_then(|row| row.replicas_us), "n/a"),
        one_decimal(find("raw/64").map(|raw| 2.0 * raw.server_us), "n/a"),
    );
    println!(
        "- client CPU per cycle (this process): reference layout {} µs, cluster layout {} µs, \
         the cluster {} µs; two bare script calls {} µs",
        client(reference),
        client(layout),
        client(cluster),
        one_decimal(
            find("raw/64")
                .and_then(|raw| raw.client_us)
                .map(|us| 2.0 * us),
            "n/a"
        ),
    );
    let best = rows
        .iter()
        .filter(|row| {
            row.workers == 64 && row.keys == "distinct" && !row.name.starts_with("cluster/")
        })
        .max_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
    if let Some(best) = best {
        println!(
            "- best on one server: {:.0} cycles/s ({}); against the 32000 cycles/s the reference \
             publishes (measured on its own machine, not in this run): {:.2}x",
            best.per_sec,
            best.what,
            best.per_sec / 32_000.0
        );
    }
}

/// Why the run failed, if it did: an operation failed, or a server answered CROSSSLOT or
/// NOSCRIPT (which the backend may have got past, at a cost, but must never cause).
fn failure(rows: &[Row]) -> Option<String> {
    let client: u64 = rows
        .iter()
        .flat_map(|row| row.client_errors.values())
        .map(|(count, _)| count)
        .sum();
    let server: u64 = rows
        .iter()
        .flat_map(|row| row.server_errors.iter())
        .filter(|(code, _)| matches!(code.as_str(), "CROSSSLOT" | "NOSCRIPT"))
        .map(|(_, count)| count)
        .sum();
    (client + server > 0).then(|| {
        format!(
            "FAILED: {client} operations failed and the servers answered {server} CROSSSLOT or \
             NOSCRIPT errors (see the errors above)"
        )
    })
}
