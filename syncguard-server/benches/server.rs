//! What the server costs per lock cycle: acquire (D = 60 s) + release cycles per second, and
//! their p50/p99 latency, through the HTTP API (`POST .../acquire`, `POST .../release`) at 1, 16
//! and 64 concurrent clients, each on its own lock, beside the library called directly on the
//! same backend object in the same run, on memory, Redis and PostgreSQL.
//!
//! The server is this crate's [`router`] on the backend [`open_backend`] opens (as the binary
//! does), authentication disabled, served by [`serve`] (as the binary serves it) on 127.0.0.1:0 in this
//! process.
//! Each HTTP client is one keep-alive HTTP/1.1 connection (a bare hyper client connection, no
//! pool) that sends a request and waits for its answer. The library runs, on the same backend
//! and with the same number of concurrent tasks:
//!
//! - `acquire_as + release`: `backend.acquire_as(key, 60 s, holder)` then
//!   `backend.release(lock_id)`, the backend calls of the server's acquire and release;
//! - `+ lookup`: the same with the server's lookup before its release (`get_by_key`: the
//!   release route looks the lock up to check the holder and find its lock id), i.e. exactly
//!   the backend calls the server makes per cycle;
//! - `syncguard::acquire`: `syncguard::acquire` (a guard, with its heartbeat task) then
//!   `guard.release()`.
//!
//! Clients and server share the process's runtime (and, on a small machine, its cores with the
//! backend's server), so the server's figure includes the client's HTTP work.
//!
//! ```sh
//! bash scripts/with-services.sh cargo bench -p syncguard-server --all-features --bench server
//! ```
//!
//! Settings (environment): `SERVER_BENCH_SECS` (measured seconds per scenario, default 3),
//! `SERVER_BENCH_ROUNDS` (the scenarios of one client count take turns in this many rounds, so
//! that a change in the machine's load falls on all of them alike; default 3),
//! `SERVER_BENCH_WARMUP_SECS` (before each round of each scenario, default 0.5),
//! `SERVER_BENCH_CLIENTS` (default `1,16,64`), `SERVER_BENCH_BACKENDS` (default
//! `memory,redis,postgres`), `SERVER_BENCH_LOGS=1` (format the server's info-level request
//! logs, as the binary does by default, into a sink; without it no tracing subscriber is
//! installed). Each progress line also gives the process's CPU time per cycle over the
//! measured time (Linux), which other load on the machine moves less than the rate. Redis and
//! PostgreSQL come from `SYNCGUARD_TEST_REDIS_URL` and
//! `SYNCGUARD_TEST_POSTGRES_URL`, which `scripts/with-services.sh` exports.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use syncguard::backend::LockBackend;
use syncguard::{LockOptions, RetryPolicy};
use syncguard_server::{Auth, BackendSettings, ServeSettings, open_backend, router, serve};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// The lease every cycle asks for.
const LEASE: Duration = Duration::from_secs(60);
/// The namespace of the benchmark's locks.
const NAMESPACE: &str = "bench";

struct Settings {
    duration: Duration,
    rounds: u32,
    warmup: Duration,
    clients: Vec<usize>,
    backends: Vec<String>,
    logs: bool,
}

fn env_secs(name: &str, default: f64) -> Duration {
    let secs = match std::env::var(name) {
        Ok(value) => value
            .trim()
            .parse::<f64>()
            .unwrap_or_else(|_| fail(&format!("{name}={value:?} is not a number of seconds"))),
        Err(_) => default,
    };
    Duration::from_secs_f64(secs)
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|item| item.trim().to_owned())
        .filter(|item| !item.is_empty())
        .collect()
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(2)
}

impl Settings {
    fn from_env() -> Self {
        let clients = env_list("SERVER_BENCH_CLIENTS", "1,16,64")
            .iter()
            .map(|count| match count.parse::<usize>() {
                Ok(count) if count > 0 => count,
                _ => fail(&format!(
                    "SERVER_BENCH_CLIENTS: {count:?} is not a client count"
                )),
            })
            .collect();
        let backends = env_list("SERVER_BENCH_BACKENDS", "memory,redis,postgres");
        for backend in &backends {
            if !["memory", "redis", "postgres"].contains(&backend.as_str()) {
                fail(&format!(
                    "SERVER_BENCH_BACKENDS: unknown backend {backend:?} (memory, redis, postgres)"
                ));
            }
        }
        Self {
            duration: env_secs("SERVER_BENCH_SECS", 3.0),
            rounds: match std::env::var("SERVER_BENCH_ROUNDS") {
                Ok(value) => match value.trim().parse::<u32>() {
                    Ok(rounds) if rounds > 0 => rounds,
                    _ => fail(&format!("SERVER_BENCH_ROUNDS={value:?} is not a count")),
                },
                Err(_) => 3,
            },
            warmup: env_secs("SERVER_BENCH_WARMUP_SECS", 0.5),
            clients,
            backends,
            logs: std::env::var("SERVER_BENCH_LOGS").is_ok_and(|value| value == "1"),
        }
    }
}

/// The `SYNCGUARD_BACKEND_URL` of a backend, from the variables `scripts/services.sh` exports.
fn backend_url(backend: &str) -> String {
    let variable = match backend {
        "memory" => return "memory:".to_owned(),
        "redis" => "SYNCGUARD_TEST_REDIS_URL",
        _ => "SYNCGUARD_TEST_POSTGRES_URL",
    };
    std::env::var(variable).unwrap_or_else(|_| {
        fail(&format!(
            "{variable} is not set: run this through `bash scripts/with-services.sh cargo bench \
             -p syncguard-server --all-features --bench server`, which starts Redis and \
             PostgreSQL and exports their URLs (or leave {backend} out with \
             SERVER_BENCH_BACKENDS=memory)"
        ))
    })
}

/// The machine's load, as `uptime` prints it (or /proc/loadavg).
fn load() -> String {
    std::process::Command::new("uptime")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .or_else(|| {
            std::fs::read_to_string("/proc/loadavg")
                .ok()
                .map(|text| format!("loadavg {}", text.trim()))
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// How a scenario runs its cycles.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// HTTP acquire + release through the server.
    Server,
    /// `acquire_as` + `release` on the backend.
    AcquireAs,
    /// `acquire_as` + `get_by_key` + `release`: the server's backend calls.
    ServerCalls,
    /// `syncguard::acquire` + `LockGuard::release`.
    Guard,
}

impl Mode {
    const fn tag(self) -> &'static str {
        match self {
            Self::Server => "h",
            Self::AcquireAs => "a",
            Self::ServerCalls => "l",
            Self::Guard => "g",
        }
    }

    const fn label(self) -> &'static str {
        match self {
            Self::Server => "server (HTTP)",
            Self::AcquireAs => "library acquire_as+release",
            Self::ServerCalls => "library + server's lookup",
            Self::Guard => "syncguard::acquire+release",
        }
    }
}

/// The modes, in the order each round runs them.
const MODES: [Mode; 4] = [
    Mode::Server,
    Mode::AcquireAs,
    Mode::ServerCalls,
    Mode::Guard,
];

/// One client: its lock, and its HTTP connection or the backend.
struct Client {
    mode: Mode,
    backend: Arc<dyn LockBackend>,
    options: LockOptions,
    /// `namespace:lockName`, the key the server uses.
    key: String,
    /// The holder the server stores for owner `anonymous` and this client's instanceId.
    holder: String,
    http: Option<Http>,
}

struct Http {
    sender: SendRequest<Full<Bytes>>,
    host: String,
    acquire_path: String,
    release_path: String,
    acquire_body: Bytes,
    release_body: Bytes,
}

impl Http {
    /// POSTs the acquire (answered with a fence) or the release, and checks the 200.
    async fn post(&mut self, acquire: bool) {
        let (path, body) = if acquire {
            (&self.acquire_path, &self.acquire_body)
        } else {
            (&self.release_path, &self.release_body)
        };
        let request = Request::post(path.as_str())
            .header(header::HOST, &self.host)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body.clone()))
            .expect("a request");
        self.sender
            .ready()
            .await
            .expect("the connection stays open");
        let response = self
            .sender
            .send_request(request)
            .await
            .expect("the server answers");
        let status = response.status();
        let has_fence = response.headers().contains_key("fencing-token");
        let body = response
            .into_body()
            .collect()
            .await
            .expect("the body")
            .to_bytes();
        assert!(
            status == StatusCode::OK && has_fence == acquire,
            "POST {path}: {status} (fence {has_fence}) {}",
            String::from_utf8_lossy(&body)
        );
    }
}

impl Client {
    async fn new(
        mode: Mode,
        backend: Arc<dyn LockBackend>,
        server: SocketAddr,
        run: &str,
        clients: usize,
        index: usize,
    ) -> Self {
        let lock_name = format!("{}{run}-{clients}-{index}", mode.tag());
        let instance = format!("worker-{index}");
        let http = if mode == Mode::Server {
            let stream = TcpStream::connect(server).await.expect("connect");
            stream.set_nodelay(true).expect("nodelay");
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("HTTP/1 handshake");
            tokio::spawn(connection);
            let path = format!("/v1/{NAMESPACE}/lock/{lock_name}");
            Some(Http {
                sender,
                host: server.to_string(),
                acquire_path: format!("{path}/acquire"),
                release_path: format!("{path}/release"),
                acquire_body: Bytes::from(format!(
                    r#"{{"instanceId":"{instance}","leaseDuration":{}}}"#,
                    LEASE.as_secs()
                )),
                release_body: Bytes::from(format!(r#"{{"instanceId":"{instance}"}}"#)),
            })
        } else {
            None
        };
        let options = LockOptions::builder()
            .ttl(LEASE)
            .retry(RetryPolicy::single_attempt())
            .build()
            .expect("options");
        Self {
            mode,
            backend,
            options,
            key: format!("{NAMESPACE}:{lock_name}"),
            holder: format!(r#"{{"owner":"anonymous","instanceId":"{instance}"}}"#),
            http,
        }
    }

    async fn cycle(&mut self) {
        match self.mode {
            Mode::Server => {
                let http = self.http.as_mut().expect("a connection");
                http.post(true).await;
                http.post(false).await;
            }
            Mode::AcquireAs | Mode::ServerCalls => {
                let lease = self
                    .backend
                    .acquire_as(&self.key, LEASE, &self.holder)
                    .await
                    .expect("acquire_as")
                    .lease()
                    .expect("the client's own lock is free");
                let lock_id = if self.mode == Mode::ServerCalls {
                    let raw = syncguard::get_by_key(&*self.backend, &self.key)
                        .await
                        .map(|found| found.map(syncguard::LockInfo::reveal))
                        .expect("lookup")
                        .expect("the lock is held");
                    assert_eq!(raw.holder.as_deref(), Some(self.holder.as_str()));
                    raw.lock_id
                } else {
                    lease.lock_id
                };
                let released = self.backend.release(&lock_id).await.expect("release");
                assert!(released.is_released(), "released");
            }
            Mode::Guard => {
                let guard = syncguard::acquire(&self.backend, &self.key, &self.options)
                    .await
                    .expect("syncguard::acquire");
                assert!(guard.release().await.expect("release"), "released");
            }
        }
    }
}

/// What one scenario measured.
struct Measured {
    cycles: u64,
    elapsed: Duration,
    /// Cycle latencies in nanoseconds, sorted.
    latencies_ns: Vec<u64>,
    /// The process's CPU time over the measured time (`None` where it cannot be read).
    cpu: Option<Duration>,
}

impl Measured {
    fn per_second(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies_ns.is_empty() {
            return f64::NAN;
        }
        let rank = ((self.latencies_ns.len() - 1) as f64 * p).round() as usize;
        self.latencies_ns[rank] as f64 / 1e6
    }
}

/// Runs `clients` closed loops of `mode`'s cycle: a warm-up, then `duration` measured.
async fn measure(
    mode: Mode,
    backend: &Arc<dyn LockBackend>,
    server: SocketAddr,
    run: &str,
    clients: usize,
    warmup: Duration,
    duration: Duration,
) -> Measured {
    let mut prepared = Vec::with_capacity(clients);
    for index in 0..clients {
        prepared.push(Client::new(mode, Arc::clone(backend), server, run, clients, index).await);
    }
    let start = Instant::now() + warmup;
    let end = start + duration;
    // The process's CPU time over the measured window: the server's and its HTTP clients'
    // work per cycle, which other load on the machine changes less than the rate.
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(start).await;
        let before = process_cpu();
        tokio::time::sleep_until(end).await;
        Some(process_cpu()?.saturating_sub(before?))
    });
    let tasks: Vec<_> = prepared
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(8192);
                loop {
                    let began = Instant::now();
                    if began >= end {
                        break;
                    }
                    client.cycle().await;
                    if began >= start {
                        latencies
                            .push(u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX));
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies_ns = Vec::new();
    for task in tasks {
        latencies_ns.append(&mut task.await.expect("a client"));
    }
    latencies_ns.sort_unstable();
    Measured {
        cycles: latencies_ns.len() as u64,
        elapsed: duration,
        latencies_ns,
        cpu: cpu.await.expect("the CPU sampler"),
    }
}

/// The process's CPU time (user + system) so far, from `/proc/self/stat` (Linux; `None`
/// elsewhere), in clock ticks of 10 ms.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // utime and stime are fields 14 and 15 of proc(5); the 12th and 13th after the command.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

impl Measured {
    /// Both measurements as one.
    fn merge(mut self, other: Self) -> Self {
        self.cycles += other.cycles;
        self.elapsed += other.elapsed;
        self.latencies_ns.extend(other.latencies_ns);
        self.latencies_ns.sort_unstable();
        self.cpu = self.cpu.zip(other.cpu).map(|(mine, theirs)| mine + theirs);
        self
    }

    /// CPU time of the process per cycle, in microseconds.
    fn cpu_per_cycle_us(&self) -> f64 {
        self.cpu.map_or(f64::NAN, |cpu| {
            cpu.as_secs_f64() * 1e6 / self.cycles.max(1) as f64
        })
    }
}

/// One line of the final table.
struct Row {
    backend: String,
    clients: usize,
    server: Measured,
    acquire_as: Measured,
    server_calls: Measured,
    guard: Measured,
}

fn print_progress(backend: &str, clients: usize, mode: Mode, measured: &Measured) {
    println!(
        "{backend:<8} {clients:>3} clients  {:<27} {:>9.0} cycles/s  p50 {:>8.3} ms  p99 {:>8.3} ms  CPU {:>7.1} µs/cycle",
        mode.label(),
        measured.per_second(),
        measured.percentile_ms(0.50),
        measured.percentile_ms(0.99),
        measured.cpu_per_cycle_us(),
    );
}

fn print_table(rows: &[Row]) {
    println!(
        "\n| backend | clients | server cycles/s | p50 ms | p99 ms | library cycles/s | p50 ms | p99 ms | server ÷ library | added per cycle, per client | added per cycle, machine |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let (server, library) = (row.server.per_second(), row.acquire_as.per_second());
        // The machine's time per cycle is 1 / rate; each client's, running cycles back to back,
        // is clients / rate.
        let added_us = (1.0 / server - 1.0 / library) * 1e6;
        println!(
            "| {} | {} | {:.0} | {:.3} | {:.3} | {:.0} | {:.3} | {:.3} | {:.1} % | {:.3} ms | {:.1} µs |",
            row.backend,
            row.clients,
            server,
            row.server.percentile_ms(0.50),
            row.server.percentile_ms(0.99),
            library,
            row.acquire_as.percentile_ms(0.50),
            row.acquire_as.percentile_ms(0.99),
            100.0 * server / library,
            added_us * row.clients as f64 / 1000.0,
            added_us,
        );
    }
    println!(
        "\n| backend | clients | acquire_as+release cycles/s | + the server's lookup cycles/s | p50 ms | p99 ms | syncguard::acquire+release cycles/s | p50 ms | p99 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.3} | {:.3} | {:.0} | {:.3} | {:.3} |",
            row.backend,
            row.clients,
            row.acquire_as.per_second(),
            row.server_calls.per_second(),
            row.server_calls.percentile_ms(0.50),
            row.server_calls.percentile_ms(0.99),
            row.guard.per_second(),
            row.guard.percentile_ms(0.50),
            row.guard.percentile_ms(0.99),
        );
    }
}

#[tokio::main]
async fn main() {
    let settings = Settings::from_env();
    // Every URL before any work, so that a missing one fails at once.
    let urls: Vec<(String, String)> = settings
        .backends
        .iter()
        .map(|backend| (backend.clone(), backend_url(backend)))
        .collect();
    if settings.logs {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_writer(std::io::sink)
            .with_ansi(false)
            .init();
    }
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    println!("load at start: {}", load());
    println!(
        "{threads} cores; server, HTTP clients and library calls share one tokio runtime \
         ({threads} worker threads); {:.1} s measured per scenario, in {} rounds that take turns \
         with the other modes, each after {:.1} s of warm-up; request logs {}\n",
        settings.duration.as_secs_f64(),
        settings.rounds,
        settings.warmup.as_secs_f64(),
        if settings.logs {
            "formatted at info into a sink"
        } else {
            "off (no tracing subscriber)"
        }
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos();
    let run = format!("{}-{}", std::process::id(), nanos % 1_000_000_000);

    let mut rows = Vec::new();
    for (name, url) in &urls {
        let backend = open_backend(&BackendSettings::new(url))
            .await
            .unwrap_or_else(|error| fail(&format!("opening {name} failed: {error}")));
        let app = router(Arc::clone(&backend), Auth::disabled()).expect("a backend with holders");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("an address");
        let server = tokio::spawn(serve(
            listener,
            app,
            std::future::pending(),
            ServeSettings::new(),
        ));
        println!("{name}: server on {address}; load {}", load());
        for &clients in &settings.clients {
            // The modes take turns, round after round, so that a change in the machine's
            // load falls on all of them alike.
            let mut measured: Vec<Option<Measured>> = MODES.iter().map(|_| None).collect();
            for _ in 0..settings.rounds {
                for (mode, total) in MODES.into_iter().zip(&mut measured) {
                    let result = measure(
                        mode,
                        &backend,
                        address,
                        &run,
                        clients,
                        settings.warmup,
                        settings.duration / settings.rounds,
                    )
                    .await;
                    *total = Some(match total.take() {
                        Some(before) => before.merge(result),
                        None => result,
                    });
                }
            }
            let measured: Vec<Measured> = measured.into_iter().flatten().collect();
            for (mode, result) in MODES.into_iter().zip(&measured) {
                print_progress(name, clients, mode, result);
            }
            let mut measured = measured.into_iter();
            let mut next = || measured.next().expect("four scenarios");
            rows.push(Row {
                backend: name.clone(),
                clients,
                server: next(),
                acquire_as: next(),
                server_calls: next(),
                guard: next(),
            });
        }
        server.abort();
        println!();
    }
    print_table(&rows);
    println!("\nload at end: {}", load());
}
