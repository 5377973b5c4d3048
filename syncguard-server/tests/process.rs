//! The server as a whole: the binary (starts with nothing configured but auth, serves,
//! stops on SIGTERM), its startup refusals, and the graceful shutdown that finishes the
//! requests in flight.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use http::StatusCode;
use support::{FlakyBackend, TestServer};
use syncguard::MemoryBackend;
use syncguard::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockInfo, Lookup,
    ReleaseOutcome, TimeAuthority,
};
use syncguard::{LockError, LockId};
use syncguard_server::{Auth, StartupError, router, serve};
use tokio::net::TcpListener;

/// The binary, with only the given environment.
fn server_command(env: &[(&str, &str)], args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_syncguard-server"));
    command
        .env_clear()
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// The lines the child prints on stdout, as they come.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().unwrap();
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

fn wait_for_line(lines: &mpsc::Receiver<String>, needle: &str) -> String {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no line with `{needle}` within 20 s"));
        if line.contains(needle) {
            return line;
        }
    }
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn the_binary_serves_and_stops_on_sigterm() {
    let mut child = server_command(
        &[("AUTHENTICATION_DISABLED", "true")],
        &["--address", "127.0.0.1", "--port", "0"],
    )
    .spawn()
    .unwrap();
    let lines = lines(&mut child);
    let listening = wait_for_line(&lines, "syncguard-server listening");
    assert!(
        listening.contains("backend=\"memory\""),
        "memory by default: {listening}"
    );
    let port: u16 = listening
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("a port in {listening}"));

    let client = TestServer::client_for(([127, 0, 0, 1], port).into());
    let reply = client.acquire("process", "binary", "abc", 30).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.fence().as_deref(), Some("000000000000001"));
    wait_for_line(&lines, "lock_service_outcome=\"ACQUIRED\"");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_for_line(&lines, "SIGTERM received");
    let status = wait_with_timeout(&mut child, Duration::from_secs(10));
    assert!(status.success(), "{status}");
}

#[test]
fn the_binary_refuses_an_unknown_backend() {
    let output = server_command(
        &[("AUTHENTICATION_DISABLED", "true")],
        &[
            "--port",
            "0",
            "--backend-url",
            "mysql://app:hunter2@db/locks",
        ],
    )
    .output()
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("names no known backend"), "{stderr}");
    assert!(
        !stderr.contains("hunter2"),
        "passwords are never printed: {stderr}"
    );
}

#[test]
fn the_binary_says_why_a_backend_cannot_be_used() {
    let output = server_command(
        &[
            ("AUTHENTICATION_DISABLED", "true"),
            ("SYNCGUARD_BACKEND_URL", "postgres://app@127.0.0.1:9/locks"),
        ],
        &["--port", "0"],
    )
    .output()
    .unwrap();
    assert!(!output.status.success());
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
    let output = server_command(&[("AUTHENTICATION_DISABLED", "maybe")], &["--port", "0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
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
    let backend = FlakyBackend::default();
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
        Duration::from_secs(10),
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
