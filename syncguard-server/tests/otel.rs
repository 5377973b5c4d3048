//! The binary's OpenTelemetry export (feature `opentelemetry`): the spans and metrics of the
//! backend calls reach an OTLP/HTTP collector the test serves on loopback, flushed when the
//! server stops on SIGTERM; nothing is sent unless asked for; a bad `OTEL_*` value stops the
//! start with a message naming the variable.

mod support;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use http::{HeaderMap, StatusCode, Uri, header};
use support::TestServer;
use support::process::{PATIENCE, ServerProcess, failed_start};
use tokio::net::TcpListener;

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

/// A server with `RUST_LOG=info` (the OpenTelemetry lines) and `env`, once it listens.
fn start(env: &[(&str, &str)]) -> ServerProcess {
    ServerProcess::start_with_env("otel", &[&[("RUST_LOG", "info")], env].concat())
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

// Multi-threaded: the collector answers while the test waits for the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_and_metrics_reach_the_collector() {
    let collector = Collector::start().await;
    let server = start(&[("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str())]);
    let announced = server.startup_line("OpenTelemetry export");
    assert!(
        announced.contains(&format!("{}/v1/traces", collector.endpoint))
            && announced.contains(&format!("{}/v1/metrics", collector.endpoint))
            && announced.contains("syncguard-server"),
        "says what goes where: {announced}"
    );
    let client = TestServer::client_for(server.address);
    acquire_and_release(&client).await;
    // The exports of the last requests are flushed at shutdown, after the server stops.
    let output = server.stop_within(PATIENCE);
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
    let server = start(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
        ("OTEL_TRACES_EXPORTER", "none"),
        ("OTEL_METRICS_EXPORTER", "none"),
    ]);
    server.startup_line("OpenTelemetry export off");
    let client = TestServer::client_for(server.address);
    acquire_and_release(&client).await;
    server.stop_within(PATIENCE);
    assert_eq!(collector.paths(), Vec::<String>::new(), "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_otel_variables_nothing_is_exported() {
    let server = start(&[]);
    server.startup_line("OpenTelemetry export off");
    let client = TestServer::client_for(server.address);
    acquire_and_release(&client).await;
    server.stop_within(PATIENCE);
}

#[test]
fn a_bad_otel_value_stops_the_start_naming_the_variable() {
    for (variable, value) in [
        ("OTEL_TRACES_EXPORTER", "bogus"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ] {
        let output = failed_start(
            &[
                ("RUST_LOG", "info"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
                (variable, value),
            ],
            &[],
        );
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
