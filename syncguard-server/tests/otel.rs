//! The binary's OpenTelemetry export (feature `opentelemetry`): the spans and metrics of the
//! backend calls reach an OTLP/HTTP collector the test serves on loopback, flushed when the
//! server stops on SIGTERM; nothing is sent unless asked for; a bad `OTEL_*` value stops the
//! start with a message naming the variable.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use http::{HeaderMap, StatusCode, Uri, header};
use support::TestServer;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// The slow machine's margin for every wait; nothing is timed.
const PATIENCE: Duration = Duration::from_secs(60);

/// One export request the collector received.
#[derive(Debug)]
struct Export {
    path: String,
    content_type: String,
    body: Bytes,
}

type Exports = Arc<Mutex<Vec<Export>>>;

/// An OTLP/HTTP collector on 127.0.0.1 that keeps every export it is sent.
struct Collector {
    endpoint: String,
    exports: Exports,
}

impl Collector {
    async fn start() -> Self {
        let exports = Exports::default();
        let app = Router::new()
            .route("/v1/traces", post(record))
            .route("/v1/metrics", post(record))
            .with_state(Arc::clone(&exports));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { endpoint, exports }
    }

    /// The bodies sent to `path`, after checking they are OTLP protobuf.
    fn bodies(&self, path: &str) -> Vec<Bytes> {
        let exports = self.exports.lock().unwrap();
        exports
            .iter()
            .filter(|export| export.path == path)
            .map(|export| {
                assert_eq!(export.content_type, "application/x-protobuf", "{export:?}");
                export.body.clone()
            })
            .collect()
    }

    fn paths(&self) -> Vec<String> {
        let exports = self.exports.lock().unwrap();
        exports.iter().map(|export| export.path.clone()).collect()
    }
}

/// Keeps the export and answers as a collector does: an empty (all accepted) response.
async fn record(
    State(exports): State<Exports>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> ([(header::HeaderName, &'static str); 1], Bytes) {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    exports.lock().unwrap().push(Export {
        path: uri.path().to_owned(),
        content_type,
        body,
    });
    (
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        Bytes::new(),
    )
}

/// Whether `needle` occurs in `haystack`: strings travel verbatim in protobuf, so a span
/// name, a metric name or an attribute value shows in the bytes of the export that carries it.
fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

/// The built binary, authentication disabled, on a free loopback port, with `env` (and no
/// other variable: the test's own environment never leaks in).
fn command(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_syncguard-server"));
    command
        .env_clear()
        .env("RUST_LOG", "info")
        .env("AUTHENTICATION_DISABLED", "true")
        .envs(env.iter().copied())
        .args(["--address", "127.0.0.1", "--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A running server process: its stdout lines as they come, and all its output, printed when
/// a test fails.
struct ServerProcess {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    output: Arc<Mutex<Vec<String>>>,
}

impl ServerProcess {
    fn start(env: &[(&str, &str)]) -> Self {
        let mut child = command(env).spawn().expect("the server binary starts");
        let output = Arc::new(Mutex::new(Vec::new()));
        let (sender, lines) = mpsc::unbounded_channel();
        read_lines(child.stdout.take().unwrap(), &output, Some(sender));
        read_lines(child.stderr.take().unwrap(), &output, None);
        Self {
            child,
            lines,
            output,
        }
    }

    /// The next stdout line containing `needle`.
    async fn wait_for(&mut self, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) if line.contains(needle) => return line,
                Ok(Some(_)) => {}
                Ok(None) => panic!("the server's output ended without `{needle}`"),
                Err(_) => panic!("no line with `{needle}` within {PATIENCE:?}"),
            }
        }
    }

    /// A client of the server, once it listens.
    async fn client(&mut self) -> TestServer {
        let line = self.wait_for("syncguard-server listening").await;
        let port: u16 = line
            .split("127.0.0.1:")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("a port in {line}"));
        TestServer::client_for(([127, 0, 0, 1], port).into())
    }

    /// SIGTERM, as an orchestrator stops the server; it must exit cleanly. Returns all it
    /// printed, for messages.
    async fn stop(mut self) -> String {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM {}", self.child.id());
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(status.success(), "a clean exit on SIGTERM: {status}");
        // Let the readers catch up with the last lines.
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.output.lock().unwrap().join("\n")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- server output ---\n{}",
                self.output.lock().unwrap().join("\n")
            );
        }
    }
}

fn read_lines(
    stream: impl Read + Send + 'static,
    output: &Arc<Mutex<Vec<String>>>,
    sender: Option<mpsc::UnboundedSender<String>>,
) {
    let output = Arc::clone(output);
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            output.lock().unwrap().push(line.clone());
            if let Some(sender) = &sender {
                let _ = sender.send(line);
            }
        }
    });
}

/// Acquires and releases a lock over HTTP.
async fn acquire_and_release(client: &TestServer) {
    let reply = client
        .acquire("otel", "nightly-export", "worker-1", 60)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let reply = client.release("otel", "nightly-export", "worker-1").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
}

fn failed_start(env: &[(&str, &str)]) -> Output {
    let output = command(env).output().unwrap();
    assert!(
        !output.status.success(),
        "{env:?} stops the start: {output:?}"
    );
    output
}

// Multi-threaded: the collector answers while the test waits for the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_and_metrics_reach_the_collector() {
    let collector = Collector::start().await;
    let mut server =
        ServerProcess::start(&[("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str())]);
    let announced = server.wait_for("OpenTelemetry export").await;
    assert!(
        announced.contains(&format!("{}/v1/traces", collector.endpoint))
            && announced.contains(&format!("{}/v1/metrics", collector.endpoint))
            && announced.contains("syncguard-server"),
        "says what goes where: {announced}"
    );
    let client = server.client().await;
    acquire_and_release(&client).await;
    // The exports of the last requests are flushed at shutdown, after the server stops.
    let output = server.stop().await;
    let received = collector.paths();

    let traces = collector.bodies("/v1/traces").concat();
    for span in ["syncguard.acquire", "syncguard.lookup", "syncguard.release"] {
        assert!(
            contains(&traces, span),
            "a `{span}` span was exported (received {received:?})\n{output}"
        );
    }
    assert!(
        contains(&traces, "syncguard-server"),
        "the default service.name\n{output}"
    );
    let metrics = collector.bodies("/v1/metrics").concat();
    for metric in ["syncguard.operations", "syncguard.operation.duration"] {
        assert!(
            contains(&metrics, metric),
            "`{metric}` was exported (received {received:?})\n{output}"
        );
    }
    assert!(
        contains(&metrics, "syncguard-server"),
        "the service.name\n{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn none_turns_each_signal_off() {
    let collector = Collector::start().await;
    let mut server = ServerProcess::start(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
        ("OTEL_TRACES_EXPORTER", "none"),
        ("OTEL_METRICS_EXPORTER", "none"),
    ]);
    server.wait_for("OpenTelemetry export off").await;
    let client = server.client().await;
    acquire_and_release(&client).await;
    server.stop().await;
    assert_eq!(collector.paths(), Vec::<String>::new(), "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_otel_variables_nothing_is_exported() {
    let mut server = ServerProcess::start(&[]);
    server.wait_for("OpenTelemetry export off").await;
    let client = server.client().await;
    acquire_and_release(&client).await;
    server.stop().await;
}

#[test]
fn a_bad_otel_value_stops_the_start_naming_the_variable() {
    for (variable, value) in [
        ("OTEL_TRACES_EXPORTER", "bogus"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ] {
        let output = failed_start(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
            (variable, value),
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("{variable}=\"{value}\"")),
            "names {variable}: {stderr}"
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            !stdout.contains("syncguard-server listening"),
            "never listens: {stdout}"
        );
    }
}
