//! Requests/s through `LockLayer` against the same axum router without it, on `MemoryBackend`,
//! over real HTTP/1.1 on loopback (server and client in this process).
//!
//! ```sh
//! cargo bench -p syncguard-tower --bench overhead                 # the table
//! # Instructions per request, deterministic (sequential requests on one connection):
//! valgrind --tool=callgrind target/release/deps/overhead-* count plain 2000
//! # A fixed number of requests on the bench's 2-worker runtime, for `perf stat` (futex
//! # calls, context switches): kind, requests, connections.
//! perf stat -e task-clock,context-switches,syscalls:sys_enter_futex \
//!     target/release/deps/overhead-* requests locked 20000 16
//! # The server alone, for a load generator in another process (kind, port, worker threads);
//! # wrk with benches/wrk-idempotency.lua, a fresh Idempotency-Key per request (as
//! # scripts/bench-tower-wrk.sh runs it; BENCHMARKS.md has its figures):
//! target/release/deps/overhead-* serve locked 18002 1
//! ```
//!
//! The kinds: `plain` (the router alone), `locked` (`Router::layer(LockLayer::for_axum(..))`),
//! `wrapped` (`Router::layer(LockLayer::new(..))`), `around` (`LockLayer::for_axum(..)` around
//! the whole router, served with `into_make_service`, the handlers turned into routes once).
//!
//! Every request carries a fresh `Idempotency-Key`, with or without the layer, so both
//! routers see the same bytes; with the layer each one takes, holds and releases its lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::ServiceExt;
use axum::body::Body;
use axum::extract::Request as AxumRequest;
use axum::routing::post;
use http::Request;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use syncguard::MemoryBackend;
use syncguard_tower::{LockLayer, key};
use tower::Layer as _;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Plain,
    /// `LockLayer::for_axum`, as the README shows for axum routers.
    Locked,
    /// `LockLayer::new`: responses carry a `LockBody`, which axum boxes again.
    LockedWrapped,
    /// `LockLayer::for_axum` around the whole router (`Layer::layer`), as axum does for
    /// middleware that runs before routing.
    Around,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Plain, Kind::Locked, Kind::LockedWrapped, Kind::Around];

    /// The router a command-line argument names (`plain` by default).
    fn from_arg(arg: Option<&String>) -> Self {
        match arg.map(String::as_str) {
            Some("locked") => Kind::Locked,
            Some("wrapped") => Kind::LockedWrapped,
            Some("around") => Kind::Around,
            _ => Kind::Plain,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain router",
            Kind::Locked => "router + `LockLayer::for_axum`",
            Kind::LockedWrapped => "router + `LockLayer::new`",
            Kind::Around => "`LockLayer::for_axum` around the router",
        }
    }
}

/// Serves the router `kind` names on `listener`, until the process ends.
async fn run(listener: tokio::net::TcpListener, kind: Kind) {
    let router = Router::new().route("/jobs", post(|| async { "ok" }));
    let key = key::header("idempotency-key");
    let backend = MemoryBackend::new();
    let served = match kind {
        Kind::Plain => axum::serve(listener, router).await,
        Kind::Locked => {
            let app = router.layer(LockLayer::for_axum(backend, key));
            axum::serve(listener, app).await
        }
        Kind::LockedWrapped => {
            axum::serve(listener, router.layer(LockLayer::new(backend, key))).await
        }
        Kind::Around => {
            let app = LockLayer::for_axum(backend, key).layer(router.with_state(()));
            axum::serve(listener, ServiceExt::<AxumRequest>::into_make_service(app)).await
        }
    };
    served.unwrap();
}

async fn serve(kind: Kind) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/jobs", listener.local_addr().unwrap());
    tokio::spawn(run(listener, kind));
    base
}

async fn one(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Body>,
    url: &str,
    n: u64,
) {
    let request = Request::post(url)
        .header("idempotency-key", format!("bench-{n}"))
        .body(Body::empty())
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
}

/// When a load run stops: after a while, or after a number of requests.
#[derive(Clone, Copy)]
enum Until {
    Elapsed(Duration),
    Requests(u64),
}

/// Requests/s with `connections` clients looping until `until`.
async fn throughput(kind: Kind, connections: usize, until: Until) -> f64 {
    let url = Arc::new(serve(kind).await);
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    // Warm up the connections.
    for i in 0..connections as u64 {
        one(&client, &url, u64::MAX - i).await;
    }
    let limit = match until {
        Until::Requests(n) => n,
        Until::Elapsed(_) => u64::MAX,
    };
    let started = Instant::now();
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let (client, url, stop, done, next) = (
                client.clone(),
                Arc::clone(&url),
                Arc::clone(&stop),
                Arc::clone(&done),
                Arc::clone(&next),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= limit {
                        break;
                    }
                    one(&client, &url, n).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    if let Until::Elapsed(duration) = until {
        tokio::time::sleep(duration).await;
        stop.store(true, Ordering::Relaxed);
    }
    // Timed runs end at the stop signal, counted runs when the last request is answered.
    let mut elapsed = started.elapsed();
    for worker in workers {
        worker.await.unwrap();
    }
    if let Until::Requests(_) = until {
        elapsed = started.elapsed();
    }
    done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("count") {
        // Sequential requests on one connection, on one thread: for callgrind.
        let kind = Kind::from_arg(args.get(1));
        let n: u64 = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(1000);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let url = serve(kind).await;
            let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
            for i in 0..n {
                one(&client, &url, i).await;
            }
        });
        return;
    }
    if args.first().map(String::as_str) == Some("serve") {
        // For a load generator in another process (wrk): kind, port, worker threads.
        let kind = Kind::from_arg(args.get(1));
        let port: u16 = args.get(2).and_then(|p| p.parse().ok()).unwrap_or(0);
        let threads: usize = args.get(3).and_then(|t| t.parse().ok()).unwrap_or(1);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .unwrap();
            println!(
                "{}: http://{}/jobs",
                kind.name(),
                listener.local_addr().unwrap()
            );
            run(listener, kind).await;
        });
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if args.first().map(String::as_str) == Some("requests") {
        let kind = Kind::from_arg(args.get(1));
        let n: u64 = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(20_000);
        let connections: usize = args.get(3).and_then(|c| c.parse().ok()).unwrap_or(1);
        let rate = runtime.block_on(throughput(kind, connections, Until::Requests(n)));
        println!(
            "{}: {n} requests on {connections} connections, {rate:.0} req/s",
            kind.name()
        );
        return;
    }
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let seconds: f64 = std::env::var("SECONDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2.0);
    println!(
        "| router | connections | rounds | median req/s | min | max | overhead (median of paired rounds, quartiles) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for connections in [1, 16] {
        let mut results = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        // Each round runs every router back to back; the overhead is taken per round, so the
        // machine's drifts in speed between rounds cancel out.
        let mut overheads = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        for round in 0..rounds {
            // Rotate which goes first, so drifts within a round hit all alike.
            let mut order = Kind::ALL;
            order.rotate_left(round % Kind::ALL.len());
            let mut rates = [0.0; Kind::ALL.len()];
            for kind in order {
                rates[kind as usize] = runtime.block_on(throughput(
                    kind,
                    connections,
                    Until::Elapsed(Duration::from_secs_f64(seconds)),
                ));
            }
            for kind in Kind::ALL {
                let i = kind as usize;
                results[i].push(rates[i]);
                overheads[i].push((rates[0] / rates[i] - 1.0) * 100.0);
            }
            if std::env::var_os("VERBOSE").is_some() {
                eprintln!("round {round}, {connections} connections: {rates:.0?} req/s");
            }
        }
        for kind in Kind::ALL {
            let i = kind as usize;
            let values = &mut results[i];
            let middle = median(values);
            let overhead = if kind == Kind::Plain {
                String::new()
            } else {
                let values = &mut overheads[i];
                let middle = median(values);
                let (low, high) = (values[rounds / 4], values[rounds - 1 - rounds / 4]);
                format!("{middle:+.1} % ({low:+.1} %, {high:+.1} %)")
            };
            println!(
                "| {} | {connections} | {rounds} | {middle:.0} | {:.0} | {:.0} | {overhead} |",
                kind.name(),
                values[0],
                values[values.len() - 1]
            );
        }
    }
}
