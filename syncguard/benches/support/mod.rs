//! Shared pieces of the backend benchmarks: a closed-loop load runner with latency
//! percentiles, and a TCP proxy that counts round trips.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

pub mod settings;

/// How long each scenario runs: `SYNCGUARD_BENCH_SECS` (default 5).
pub fn scenario_duration() -> Duration {
    settings::measured_time(5.0)
}

/// What one scenario measured.
pub struct Measured {
    pub cycles: u64,
    pub contended: u64,
    pub elapsed: Duration,
    /// Latency of each completed cycle, in microseconds, sorted.
    pub latencies_us: Vec<u32>,
}

impl Measured {
    pub fn per_second(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64()
    }

    pub fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let rank = ((self.latencies_us.len() - 1) as f64 * p).round() as usize;
        f64::from(self.latencies_us[rank]) / 1000.0
    }
}

/// What one iteration of a worker did.
pub enum Cycle {
    /// A full cycle completed (counted, and its latency recorded).
    Done,
    /// The lock was held elsewhere; nothing to count but the attempt.
    Contended,
}

/// Runs `workers` closed loops of `cycle(worker, iteration)` for `duration` (after a short
/// warm-up) and measures completed cycles per second and their latency.
pub async fn run<F, Fut>(workers: usize, duration: Duration, cycle: F) -> Measured
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Cycle> + Send,
{
    let cycle = Arc::new(cycle);
    let warmup = Duration::from_millis(300);
    let start = Instant::now() + warmup;
    let end = start + duration;
    let handles: Vec<_> = (0..workers)
        .map(|worker| {
            let cycle = Arc::clone(&cycle);
            tokio::spawn(async move {
                let (mut latencies, mut contended) = (Vec::with_capacity(4096), 0_u64);
                let mut iteration = 0_u64;
                loop {
                    let began = Instant::now();
                    if began >= end {
                        break;
                    }
                    let outcome = cycle(worker, iteration).await;
                    iteration += 1;
                    if began < start {
                        continue;
                    }
                    match outcome {
                        Cycle::Done => latencies
                            .push(u32::try_from(began.elapsed().as_micros()).unwrap_or(u32::MAX)),
                        Cycle::Contended => contended += 1,
                    }
                }
                (latencies, contended)
            })
        })
        .collect();
    let mut latencies_us = Vec::new();
    let mut contended = 0;
    for handle in handles {
        let (mut worker_latencies, worker_contended) = handle.await.expect("bench worker");
        latencies_us.append(&mut worker_latencies);
        contended += worker_contended;
    }
    latencies_us.sort_unstable();
    Measured {
        cycles: latencies_us.len() as u64,
        contended,
        elapsed: duration,
        latencies_us,
    }
}

/// Prints the table header.
pub fn print_header() {
    println!(
        "| {:<34} | {:>7} | {:>9} | {:>12} | {:>8} | {:>8} |",
        "scenario", "workers", "keys", "cycles/s", "p50 ms", "p99 ms"
    );
    println!(
        "|{:-<36}|{:->9}|{:->11}|{:->14}|{:->10}|{:->10}|",
        "", "", "", "", "", ""
    );
}

/// Prints one row of the table.
pub fn print_row(scenario: &str, workers: usize, keys: &str, measured: &Measured) {
    let contention = if measured.contended > 0 {
        format!(" ({} contended attempts)", measured.contended)
    } else {
        String::new()
    };
    println!(
        "| {:<34} | {:>7} | {:>9} | {:>12.0} | {:>8.2} | {:>8.2} |{contention}",
        scenario,
        workers,
        keys,
        measured.per_second(),
        measured.percentile_ms(0.50),
        measured.percentile_ms(0.99),
    );
}

/// A loopback TCP proxy in front of a PostgreSQL server that counts round trips exactly: the
/// server ends every request cycle with one ReadyForQuery (`Z`) message, which the client
/// waits for. (Connect through it with `sslmode=disable`, so the stream is framed from the
/// first byte.)
pub struct RoundTripProxy {
    pub addr: SocketAddr,
    round_trips: Arc<AtomicU64>,
}

impl RoundTripProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let round_trips = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&round_trips);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let requests = async move {
                        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                        let _ = server_write.shutdown().await;
                    };
                    let responses = async move {
                        let mut frames = Frames::default();
                        let mut buf = vec![0_u8; 64 * 1024];
                        loop {
                            let n = match server_read.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let ready = frames.count_ready_for_query(&buf[..n]);
                            counter.fetch_add(ready, Ordering::SeqCst);
                            if client_write.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = client_write.shutdown().await;
                    };
                    tokio::join!(requests, responses);
                });
            }
        });
        Self { addr, round_trips }
    }

    /// Round trips completed since the proxy started.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::SeqCst)
    }
}

/// Splits the server's stream into messages: a type byte, a 4-byte big-endian length that
/// counts itself, then the body.
#[derive(Default)]
struct Frames {
    header: Vec<u8>,
    body_left: usize,
}

impl Frames {
    fn count_ready_for_query(&mut self, mut bytes: &[u8]) -> u64 {
        let mut ready = 0;
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let skip = self.body_left.min(bytes.len());
                self.body_left -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            let take = (5 - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.header.len() == 5 {
                if self.header[0] == b'Z' {
                    ready += 1;
                }
                let len = u32::from_be_bytes(self.header[1..5].try_into().expect("4 bytes"));
                self.body_left = (len as usize).saturating_sub(4);
                self.header.clear();
            }
        }
        ready
    }
}

/// Resolves `host:port` of a URL such as `postgres://user@127.0.0.1:5432/db`.
pub fn socket_addr_of(url: &str) -> SocketAddr {
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = after_scheme.split('/').next().unwrap_or(after_scheme);
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    std::net::ToSocketAddrs::to_socket_addrs(host_port)
        .expect("resolve host:port")
        .next()
        .expect("an address")
}

/// The Redis server's CPU seconds so far (user + system, from `INFO cpu`).
#[cfg(feature = "redis")]
pub async fn redis_cpu_seconds(conn: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .filter_map(|line| {
            line.strip_prefix("used_cpu_sys:")
                .or_else(|| line.strip_prefix("used_cpu_user:"))
        })
        .filter_map(|value| value.trim().parse::<f64>().ok())
        .sum()
}
