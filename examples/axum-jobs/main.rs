//! An axum service whose `POST /jobs` runs one request at a time per `Idempotency-Key`
//! across replicas: while a request with a key runs, the others with that key are answered
//! `423 Locked` with `Retry-After`, and the handler hands the lock's fence to the store it
//! writes to.
//!
//! This is mutual exclusion per key, not idempotency: a request whose key was used by a
//! request that has completed runs again (the last request below shows it). Replaying the
//! stored response of a completed request is the application's to build.
//!
//! ```sh
//! cargo run -p syncguard-examples --example axum-jobs --features axum-jobs            # in-memory
//! cargo run -p syncguard-examples --example axum-jobs --features axum-jobs -- postgres://user@host/db
//! cargo run -p syncguard-examples --example axum-jobs --features axum-jobs -- redis://127.0.0.1:6379
//! ```
//!
//! With a URL it uses PostgreSQL (creating its tables) or Redis. It serves on a loopback port,
//! sends itself a few requests, prints what came back, and exits.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::Request;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use syncguard::{LockBackend, LockOptions, RetryPolicy};
use syncguard_tower::{HeldLock, LockLayer, key};

/// Creates the job. Runs under the lock of its Idempotency-Key, kept by the heartbeat for as
/// long as it takes; no other request with that key runs meanwhile.
async fn create_job(lock: HeldLock, body: String) -> String {
    tokio::time::sleep(Duration::from_millis(700)).await; // the work
    format!("created job {body:?} with fence {}", lock.fence())
}

async fn backend(url: Option<String>) -> Result<Arc<dyn LockBackend>, syncguard::LockError> {
    Ok(match url {
        None => Arc::new(syncguard::MemoryBackend::new()),
        Some(url) if url.starts_with("postgres") => {
            use syncguard::postgres::{PostgresBackend, setup_schema};
            let backend = PostgresBackend::connect(&url).await?;
            setup_schema(backend.pool(), backend.config()).await?;
            Arc::new(backend)
        }
        Some(url) => Arc::new(syncguard::RedisBackend::connect(&url).await?),
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // syncguard reports what needs attention (a lost lock, a failed release) as `tracing`
    // events: without a subscriber nobody sees them.
    tracing_subscriber::fmt::init();
    let backend = backend(std::env::args().nth(1)).await?;
    // A short ttl frees the key soon after a replica crashes (the heartbeat keeps it while the
    // handler runs); a held key is answered 423 at once; no handler holds a key past a minute.
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(2))
        .retry(RetryPolicy::single_attempt())
        .max_hold(Duration::from_secs(60))
        .build()?;
    let app = Router::new()
        .route("/jobs", post(create_job))
        .layer(LockLayer::for_axum(backend, key::header("idempotency-key")).with_options(options));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    println!("serving on {base}");

    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let send = |idempotency_key: &'static str, body: &'static str| {
        let client = client.clone();
        let request = Request::post(format!("{base}/jobs"))
            .header("idempotency-key", idempotency_key)
            .body(Body::from(body));
        async move {
            let response = client.request(request?).await?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get("retry-after")
                .map(|v| format!(" (Retry-After: {})", v.to_str().unwrap_or("?")));
            let body = response.into_body().collect().await?.to_bytes();
            println!(
                "{idempotency_key}: {status}{} {}",
                retry_after.unwrap_or_default(),
                String::from_utf8_lossy(&body)
            );
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }
    };

    println!("-- a client retries the same request twice while the first still runs:");
    let (a, b, c) = tokio::join!(
        send("order-17", "invoice 17"),
        send("order-17", "invoice 17"),
        send("order-18", "invoice 18"),
    );
    a?;
    b?;
    c?;
    println!("-- once it is done, the same key runs again (a lock, not a replay; the fence grew):");
    send("order-17", "invoice 17").await?;
    // Release what is still held (the dropped guards' pending releases too) before exiting.
    syncguard::shutdown(std::time::Duration::from_secs(5)).await;
    Ok(())
}
