//! What a client can do to a connection, over real sockets: the deadlines of
//! [`serve`](syncguard_server::serve) (a head sent a byte at a time, half a request line, a
//! partial body, a connection that sends nothing, an idle kept-alive one), the connection
//! limit (a flood of idle connections, on the binary with a low open-file limit), a SIGTERM
//! with a slow client connected, the one protocol every build speaks, `--help`, and the
//! request log line. Timeouts are set to a second or two here so that the file runs in
//! seconds; the margins are generous for a loaded machine.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::process::{ServerProcess, failed_start, failed_start_with_file_limit};
use syncguard::MemoryBackend;
use syncguard_server::{Auth, ServeSettings, StartupError, router, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a test waits for what should happen within a second or two.
const MARGIN: Duration = Duration::from_secs(15);

/// [`serve`] on a memory backend, on 127.0.0.1, until dropped or stopped.
struct Served {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), StartupError>>,
}

impl Served {
    async fn start(settings: ServeSettings) -> Self {
        let app = router(Arc::new(MemoryBackend::new()), Auth::disabled()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(
            listener,
            app,
            async move {
                let _ = stopped.await;
            },
            settings,
        ));
        Self {
            address,
            stop: Some(stop),
            task,
        }
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.address).await.unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Short timeouts: heads within 1 s, bodies within 1 s, idle connections closed after 5 s.
fn short() -> ServeSettings {
    ServeSettings::new()
        .with_header_read_timeout(Duration::from_secs(1))
        .with_body_read_timeout(Duration::from_secs(1))
        .with_idle_timeout(Duration::from_secs(5))
        .with_shutdown_timeout(Duration::from_secs(10))
}

/// Reads until the server closes the connection (end of stream or reset), within `limit`.
/// Returns what was read and how long it took.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut read = Vec::new();
    let mut buffer = [0; 4096];
    loop {
        match tokio::time::timeout_at(
            tokio::time::Instant::from_std(started + limit),
            stream.read(&mut buffer),
        )
        .await
        {
            Err(_) => panic!(
                "the connection is still open after {limit:?}; read {:?}",
                String::from_utf8_lossy(&read)
            ),
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(count)) => read.extend_from_slice(&buffer[..count]),
        }
    }
    (
        String::from_utf8_lossy(&read).into_owned(),
        started.elapsed(),
    )
}

/// Reads one answer (head and a `content-length` body) from a connection that stays open.
async fn read_answer(stream: &mut TcpStream) -> String {
    let mut read = Vec::new();
    let mut byte = [0; 1];
    let head_end = loop {
        let count = tokio::time::timeout(MARGIN, stream.read(&mut byte))
            .await
            .expect("an answer in time")
            .unwrap();
        assert_eq!(count, 1, "the connection closed mid-answer: {read:?}");
        read.push(byte[0]);
        if read.ends_with(b"\r\n\r\n") {
            break read.len();
        }
    };
    let head = String::from_utf8_lossy(&read).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length: "))
        .map_or(0, |length| length.trim().parse().unwrap());
    read.resize(head_end + length, 0);
    tokio::time::timeout(MARGIN, stream.read_exact(&mut read[head_end..]))
        .await
        .expect("the body in time")
        .unwrap();
    String::from_utf8(read).unwrap()
}

const GET_HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nhost: test\r\n\r\n";

#[tokio::test]
async fn a_head_sent_a_byte_a_second_is_cut_off_at_the_header_read_timeout() {
    let server = Served::start(short()).await;
    let mut stream = server.connect().await;
    let started = Instant::now();
    let slow = async {
        for byte in GET_HEALTH {
            if stream.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    let _ = tokio::time::timeout(MARGIN, slow).await;
    let (answer, _) = read_until_closed(&mut stream, MARGIN).await;
    let took = started.elapsed();
    assert!(
        answer.is_empty(),
        "no answer to a head that never ended: {answer}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "closed at the 1 s header read timeout, not before and not after all {} bytes: {took:?}",
        GET_HEALTH.len()
    );
}

#[tokio::test]
async fn half_a_request_line_or_nothing_at_all_is_closed_at_the_header_read_timeout() {
    let server = Served::start(short()).await;
    let mut half = server.connect().await;
    half.write_all(b"GET /hea").await.unwrap();
    let mut silent = server.connect().await;
    for stream in [&mut half, &mut silent] {
        let (answer, took) = read_until_closed(stream, MARGIN).await;
        assert!(answer.is_empty(), "{answer}");
        assert!(took < Duration::from_secs(10), "{took:?}");
    }
}

#[tokio::test]
async fn a_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let server = Served::start(short()).await;
    let mut stream = server.connect().await;
    stream.write_all(GET_HEALTH).await.unwrap();
    let answer = read_answer(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let answered = Instant::now();
    // Still open past the 1 s header read timeout: waiting for a request is the idle timeout's.
    let early = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut [0; 16])).await;
    assert!(early.is_err(), "open at 2 s: {early:?}");
    // And the connection still serves.
    stream.write_all(GET_HEALTH).await.unwrap();
    assert!(read_answer(&mut stream).await.starts_with("HTTP/1.1 200"));
    let (rest, _) = read_until_closed(&mut stream, MARGIN).await;
    assert!(rest.is_empty(), "{rest}");
    assert!(
        answered.elapsed() >= Duration::from_millis(4500),
        "closed by the 5 s idle timeout: {:?}",
        answered.elapsed()
    );
}

#[tokio::test]
async fn a_body_that_stops_coming_is_answered_408_and_the_connection_closed() {
    let server = Served::start(short()).await;
    let mut stream = server.connect().await;
    stream
        .write_all(
            b"POST /v1/connections/lock/partial/acquire HTTP/1.1\r\nhost: test\r\n\
              content-type: application/json\r\ncontent-length: 45\r\n\r\n{\"instanceId\":",
        )
        .await
        .unwrap();
    let (answer, took) = read_until_closed(&mut stream, MARGIN).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("Request body not received in time"),
        "{answer}"
    );
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");

    // Nothing was acquired.
    let mut stream = server.connect().await;
    stream
        .write_all(b"GET /v1/connections/lock/partial HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    let answer = read_answer(&mut stream).await;
    assert!(!answer.contains("owner"), "the lock is free: {answer}");
}

#[tokio::test]
async fn a_shutdown_closes_half_sent_requests_at_once_and_finishes_the_others() {
    let settings = ServeSettings::new().with_shutdown_timeout(Duration::from_secs(30));
    let mut server = Served::start(settings).await;
    let mut half = server.connect().await;
    half.write_all(b"GET /health HTTP/1.1\r\nhost: te")
        .await
        .unwrap();
    let mut idle = server.connect().await;
    idle.write_all(GET_HEALTH).await.unwrap();
    assert!(read_answer(&mut idle).await.starts_with("HTTP/1.1 200"));
    let mut silent = server.connect().await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    server.stop.take().unwrap().send(()).unwrap();
    let served = tokio::time::timeout(MARGIN, &mut server.task)
        .await
        .expect("serve returns well before the 30 s shutdown timeout and the 10 s header timeout");
    served.unwrap().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    for stream in [&mut half, &mut idle, &mut silent] {
        let (answer, _) = read_until_closed(stream, MARGIN).await;
        assert!(answer.is_empty(), "{answer}");
    }
}

#[tokio::test]
async fn a_request_in_progress_gets_the_shutdown_timeout_and_no_more() {
    let backend = support::flaky_backend();
    let app = router(Arc::new(backend.clone()), Auth::disabled()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let settings = ServeSettings::new().with_shutdown_timeout(Duration::from_secs(1));
    let server = tokio::spawn(serve(
        listener,
        app,
        async move {
            let _ = stopped.await;
        },
        settings,
    ));
    let client = support::TestServer::client_for(address);
    let acquired = client.acquire("connections", "drain", "abc", 60).await;
    assert_eq!(acquired.status, http::StatusCode::OK, "{}", acquired.text);
    // A renew whose backend call never ends.
    backend.stall_extends(true);
    let mut renew = TcpStream::connect(address).await.unwrap();
    let body = r#"{"instanceId":"abc","leaseDuration":60}"#;
    renew
        .write_all(
            format!(
                "POST /v1/connections/lock/drain/renew HTTP/1.1\r\nhost: x\r\n\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    stop.send(()).unwrap();
    tokio::time::timeout(MARGIN, server)
        .await
        .expect("serve returns once the shutdown timeout has passed")
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "the request in progress had the 1 s shutdown timeout: {took:?}"
    );
    let (answer, _) = read_until_closed(&mut renew, MARGIN).await;
    assert!(answer.is_empty(), "its connection was closed: {answer}");
    backend.stall_extends(false);
}

#[test]
fn sigterm_with_a_slow_client_connected_exits_at_once() {
    // The defaults: a 10 s header read timeout, a 30 s shutdown timeout.
    let server = ServerProcess::start_with_env("slowloris", &[]);
    let mut slow = std::net::TcpStream::connect(server.address).unwrap();
    std::io::Write::write_all(&mut slow, b"POST /v1/a/lock/b/acquire HTTP/1.1\r\nhost: x").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    server.terminate();
    server.exits_cleanly(Duration::from_secs(8));
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
}

/// A raw HTTP/1.1 exchange on a new connection: what the server sent before closing or
/// within `MARGIN`.
fn exchange(address: SocketAddr, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut read = Vec::new();
    let mut buffer = [0; 4096];
    while let Ok(count) = stream.read(&mut buffer) {
        if count == 0 {
            break;
        }
        read.extend_from_slice(&buffer[..count]);
        if read.windows(4).any(|window| window == b"\r\n\r\n") && read.len() > 12 {
            // One answer's head is enough to tell the protocol and status.
            break;
        }
    }
    String::from_utf8_lossy(&read).into_owned()
}

#[test]
fn every_build_speaks_http_1_1_only() {
    let server = ServerProcess::start_with_env("protocol", &[]);
    // HTTP/2 with prior knowledge: an HTTP/2 server answers with a SETTINGS frame.
    let answer = exchange(
        server.address,
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    );
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 "),
        "no HTTP/2 answer: {answer:?}"
    );
    // An upgrade to cleartext HTTP/2 is not taken: the request is answered in HTTP/1.1.
    let answer = exchange(
        server.address,
        b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings\r\n\
          upgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    // HTTP/1.0 is served.
    let answer = exchange(server.address, b"GET /health HTTP/1.0\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer:?}");
    server.stop();
}

#[test]
fn a_flood_of_idle_connections_is_refused_not_left_unanswered() {
    // 256 open files: the server keeps 128 connections (the rest of the files for itself).
    let server = ServerProcess::start_with_file_limit(
        "flood",
        &[
            ("SERVER_HEADER_READ_TIMEOUT_SECONDS", "4"),
            (
                "RUST_LOG",
                "warn,syncguard_server::server=info,syncguard_server::connections=info",
            ),
        ],
        256,
    );
    assert!(
        server
            .startup_line("syncguard-server listening")
            .contains("max_connections=128"),
        "{}",
        server.startup_line("listening")
    );
    // One kept-alive connection to ask /ready on, then a flood of connections that send
    // nothing, beyond both the limit and the open-file limit.
    let mut watcher = std::net::TcpStream::connect(server.address).unwrap();
    watcher
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let ready = |watcher: &mut std::net::TcpStream| {
        use std::io::{Read, Write};
        watcher
            .write_all(b"GET /ready HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let mut buffer = [0; 1024];
        let count = watcher.read(&mut buffer).unwrap();
        String::from_utf8_lossy(&buffer[..count]).into_owned()
    };
    assert!(ready(&mut watcher).starts_with("HTTP/1.1 200"));
    let flood: Vec<std::net::TcpStream> = (0..300)
        .map(|_| std::net::TcpStream::connect(server.address).unwrap())
        .collect();
    let started = Instant::now();
    let answer = exchange(server.address, GET_HEALTH);
    assert!(
        answer.starts_with("HTTP/1.1 503"),
        "a new connection is refused at once: {answer:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let ready_now = ready(&mut watcher);
    assert!(
        ready_now.starts_with("HTTP/1.1 503") && ready_now.contains("connection limit reached"),
        "{ready_now}"
    );
    server.wait_for("connection limit reached");

    // Once the flood times out, requests are served again.
    let deadline = Instant::now() + MARGIN;
    loop {
        let answer = exchange(server.address, GET_HEALTH);
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {answer:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
    server.wait_for("below the connection limit again");
    drop(flood);
    server.stop();
}

#[test]
fn a_connection_limit_the_open_files_cannot_hold_stops_the_start() {
    let output = failed_start_with_file_limit(&[], &["--max-connections", "1000"], 256);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("at most 128 connections") && stderr.contains("LimitNOFILE"),
        "{stderr}"
    );
    let output = failed_start(&[("SERVER_HEADER_READ_TIMEOUT_SECONDS", "0")], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("SERVER_HEADER_READ_TIMEOUT_SECONDS")
            || stderr.contains("header-read-timeout"),
        "{stderr}"
    );
}

#[test]
fn help_shows_help_text_and_no_value_from_the_environment() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_syncguard-server"))
        .arg("--help")
        .env_clear()
        .env("SYNCGUARD_BACKEND_URL", "postgres://locks:hunter2@db/locks")
        .env("JWT_JWKS", "https://idp.example/jwks?key=s3cret-in-url")
        .env("JWT_ISSUER", "https://issuer-secret.example/")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for secret in ["hunter2", "s3cret-in-url", "issuer-secret"] {
        assert!(!help.contains(secret), "`{secret}` printed:\n{help}");
    }
    for doc_only in ["```", "try_parse_from", "assert_eq"] {
        assert!(!help.contains(doc_only), "`{doc_only}` printed:\n{help}");
    }
    for setting in [
        "SERVER_HEADER_READ_TIMEOUT_SECONDS",
        "SERVER_BODY_READ_TIMEOUT_SECONDS",
        "SERVER_IDLE_TIMEOUT_SECONDS",
        "SERVER_MAX_CONNECTIONS",
        "SERVER_REQUEST_LOG_LEVEL",
    ] {
        assert!(help.contains(setting), "{setting} listed:\n{help}");
    }
}

#[test]
fn the_request_log_line_is_one_short_line_even_for_an_attacker_sized_request_id() {
    let server = ServerProcess::start_with_env("request-log", &[("RUST_LOG", "info")]);
    let request_id = format!("start-{}", "x".repeat(60 * 1024));
    let request = format!("GET /health HTTP/1.1\r\nhost: x\r\nx-request-id: {request_id}\r\n\r\n");
    assert!(exchange(server.address, request.as_bytes()).starts_with("HTTP/1.1 200"));
    let line = server.wait_for("http_route=\"/health\"");
    assert_eq!(line.matches("start-").count(), 1, "the id once: {line}");
    assert!(line.len() < 1024, "{} bytes: {line}", line.len());
    assert!(line.contains("http_status_code=200"), "{line}");
    server.stop();

    // At `debug` under an `info` filter, no request line is written.
    let server = ServerProcess::start_with_env(
        "request-log-debug",
        &[("RUST_LOG", "info"), ("SERVER_REQUEST_LOG_LEVEL", "debug")],
    );
    assert!(exchange(server.address, GET_HEALTH).starts_with("HTTP/1.1 200"));
    let output = server.stop();
    assert!(!output.contains("http_route"), "{output}");
}
