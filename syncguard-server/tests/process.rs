//! The server as a whole: the binary (starts with nothing configured but auth, serves,
//! stops on SIGTERM), its startup refusals, and the graceful shutdown that finishes the
//! requests in flight.

mod support;

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use support::process::{ServerProcess, failed_start};
use support::{TestServer, flaky_backend};
use syncguard::MemoryBackend;
use syncguard::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockInfo, Lookup,
    ReleaseOutcome, TimeAuthority,
};
use syncguard::{LockError, LockId};
use syncguard_server::{Auth, ServeSettings, StartupError, router, serve};
use tokio::net::TcpListener;

#[tokio::test]
async fn the_binary_serves_and_stops_on_sigterm() {
    let server = ServerProcess::start_with_env("process", &[("RUST_LOG", "info")]);
    let listening = server.startup_line("syncguard-server listening");
    assert!(
        listening.contains("backend=\"memory\""),
        "memory by default: {listening}"
    );

    let client = TestServer::client_for(server.address);
    let reply = client.acquire("process", "binary", "abc", 30).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.fence().as_deref(), Some("000000000000001"));
    server.wait_for("lock_service_outcome=\"ACQUIRED\"");

    server.terminate();
    server.wait_for("SIGTERM received");
    server.exits_cleanly(Duration::from_secs(10));
}

#[test]
fn the_binary_refuses_an_unknown_backend() {
    let output = failed_start(
        &[("RUST_LOG", "info")],
        &["--backend-url", "mysql://app:hunter2@db/locks"],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("names no known backend"), "{stderr}");
    assert!(
        !stderr.contains("hunter2"),
        "passwords are never printed: {stderr}"
    );
}

#[test]
fn the_binary_says_why_a_backend_cannot_be_used() {
    let output = failed_start(
        &[
            ("RUST_LOG", "info"),
            ("SYNCGUARD_BACKEND_URL", "postgres://app@127.0.0.1:9/locks"),
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    if cfg!(feature = "postgres") {
        assert!(
            stderr.contains("could not open the postgres lock backend"),
            "{stderr}"
        );
    } else {
        assert!(
            stderr.contains("built without its feature") && stderr.contains("--features postgres"),
            "{stderr}"
        );
    }
}

#[test]
fn the_binary_refuses_a_bad_setting() {
    let output = failed_start(
        &[("RUST_LOG", "info"), ("AUTHENTICATION_DISABLED", "maybe")],
        &[],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("maybe"), "{stderr}");
}

/// A memory backend that says it stores no holders, as a backend of a user's own may.
struct NoHolders(MemoryBackend);

impl LockBackend for NoHolders {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        self.0.acquire(key, ttl)
    }
    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        self.0.release(lock_id)
    }
    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        self.0.extend(lock_id, ttl)
    }
    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        self.0.is_locked(key)
    }
    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        self.0.lookup(query)
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::new("postgres", TimeAuthority::Server)
    }
}

#[test]
fn backends_without_holders_are_refused() {
    let error = router(Arc::new(NoHolders(MemoryBackend::new())), Auth::disabled()).unwrap_err();
    assert!(
        matches!(
            error,
            StartupError::NoHolders {
                backend: "postgres"
            }
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("postgres backend does not store lock holders"),
        "{message}"
    );
}

#[tokio::test]
async fn graceful_shutdown_finishes_requests_in_flight() {
    let backend = flaky_backend();
    let app = router(Arc::new(backend.clone()), Auth::disabled()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        app,
        async move {
            let _ = stopped.await;
        },
        ServeSettings::new().with_shutdown_timeout(Duration::from_secs(10)),
    ));
    let client = TestServer::client_for(address);
    backend.slow(true);
    let in_flight =
        tokio::spawn(async move { client.acquire("process", "inflight", "abc", 30).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.send(()).unwrap();
    let reply = in_flight.await.unwrap();
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "the request in flight was answered"
    );
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the server stops once the request is done")
        .unwrap()
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(address).await.is_err(),
        "no new connections after the shutdown"
    );
}
