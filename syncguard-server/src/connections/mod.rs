//! Serving an application on a listener, so that no client can hold the server: each
//! connection is HTTP/1.1 with deadlines (`clock.rs`: the request head, the wait between
//! requests, and the answer's write; `body.rs`: the request body, answered 408), at most
//! so many connections are open at once (`limit.rs`: the rest answered 503 at once), and a
//! shutdown closes what has no request in progress at once and gives requests in progress a
//! bounded drain.
//!
//! **The protocol is HTTP/1.1 (and 1.0), in every build**, whatever features unify into hyper
//! and axum: connections are served by hyper's HTTP/1 server directly, never by its
//! auto-detecting one, so a client speaking HTTP/2 (prior knowledge, `h2c` upgrade) gets
//! HTTP/1.1 answers. LockServiceCentral (Spring Boot) speaks HTTP/1.1 by default, its
//! requests are small and independent, and one protocol keeps one set of timeouts and limits
//! to reason about; a proxy in front may speak HTTP/2 or HTTP/3 to clients.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use syncguard_server::{Auth, ServeSettings, router, serve, shutdown_signal};
//! # #[tokio::main] async fn main() -> Result<(), syncguard_server::StartupError> {
//! let app = router(Arc::new(syncguard::MemoryBackend::new()), Auth::disabled())?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
//! serve(listener, app, shutdown_signal(), ServeSettings::new()).await
//! # }
//! ```

mod body;
mod clock;
mod limit;
mod settings;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Service;

use body::DeadlineBody;
pub(crate) use body::is_body_timeout;
use clock::{ConnectionClock, DeadlineIo, Stage};
pub(crate) use limit::{ConnectionLoad, connection_limit};
use limit::{Refusals, refuse};
pub use settings::{
    DEFAULT_BODY_READ_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_SHUTDOWN_TIMEOUT, ServeSettings,
};

/// How long to wait before accepting again after an error of the listener (such as no file
/// descriptor left), as `axum::serve` does.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// What every connection's task shares.
#[derive(Debug, Clone)]
struct Shared {
    app: Router,
    settings: ServeSettings,
    load: Arc<ConnectionLoad>,
    /// Cancelled when the shutdown starts.
    shutdown: CancellationToken,
    /// Cancelled when the shutdown timeout has passed: connections still open are closed.
    abandon: CancellationToken,
}

/// Serves `app` on `listener` until `signal` completes, then shuts down as
/// [`ServeSettings`] says.
pub(crate) async fn serve_connections(
    listener: TcpListener,
    app: Router,
    signal: impl Future<Output = ()> + Send + 'static,
    settings: ServeSettings,
) -> Result<(), String> {
    settings.check()?;
    let limit = connection_limit(settings.max_connections())?;
    let shared = Shared {
        app,
        settings,
        load: Arc::new(ConnectionLoad::new(limit)),
        shutdown: CancellationToken::new(),
        abandon: CancellationToken::new(),
    };
    let connections = TaskTracker::new();
    let mut refusals = Refusals::default();
    tokio::pin!(signal);
    loop {
        let stream = tokio::select! {
            biased;
            () = &mut signal => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    accept_failed(&error).await;
                    continue;
                }
            },
        };
        match shared.load.try_admit() {
            Some(permit) => {
                refusals.accepted();
                connections.spawn(serve_connection(stream, permit, shared.clone()));
            }
            None => {
                refusals.refused(&shared.load);
                refuse(stream);
            }
        }
    }
    // No new connections from here on.
    drop(listener);
    shared.shutdown.cancel();
    connections.close();
    let drain = shared.settings.shutdown_timeout();
    if tokio::time::timeout(drain, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            ?drain,
            "requests still in progress after the shutdown timeout; closing their connections"
        );
        shared.abandon.cancel();
        connections.wait().await;
    }
    Ok(())
}

/// After an error of `accept`: a connection that failed before it was accepted is nobody's
/// concern; anything else (such as no file descriptor left) is logged and waited out.
async fn accept_failed(error: &std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "accepting a connection failed; trying again in a second");
    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
}

/// Serves one connection until it closes, times out, or the shutdown ends it.
async fn serve_connection(stream: TcpStream, permit: OwnedSemaphorePermit, shared: Shared) {
    let _permit = permit;
    // Answers are written whole; Nagle's algorithm would only delay them.
    let _ = stream.set_nodelay(true);
    let settings = shared.settings;
    let clock = Arc::new(ConnectionClock::new(
        settings.header_read_timeout(),
        settings.idle_timeout(),
    ));
    let io = TokioIo::new(DeadlineIo::new(stream, Arc::clone(&clock)));
    let service = {
        let clock = Arc::clone(&clock);
        let load = Arc::clone(&shared.load);
        let app = shared.app.clone();
        service_fn(move |mut request: http::Request<Incoming>| {
            clock.request_started();
            request.extensions_mut().insert(Arc::clone(&load));
            let request = request
                .map(|body| Body::new(DeadlineBody::new(body, settings.body_read_timeout())));
            let mut app = app.clone();
            let clock = Arc::clone(&clock);
            async move {
                let response = app.call(request).await;
                clock.request_answered();
                response
            }
        })
    };
    let mut http = http1::Builder::new();
    // hyper's own head timeout, as a backstop: it runs from when hyper starts waiting for a
    // head, so on a kept-alive connection it spans the idle wait too.
    http.timer(TokioTimer::new()).header_read_timeout(
        settings
            .idle_timeout()
            .saturating_add(settings.header_read_timeout()),
    );
    let connection = http.serve_connection(io, service);
    tokio::pin!(connection);
    tokio::select! {
        served = connection.as_mut() => return closed(served),
        () = shared.shutdown.cancelled() => {}
    }
    // A connection whose request head has not (all) arrived has nothing in progress: closed
    // at once, so that a slow client cannot hold the shutdown.
    if clock.stage() == Stage::Head {
        return;
    }
    // Idle connections close now; a request in progress is answered first.
    connection.as_mut().graceful_shutdown();
    tokio::select! {
        served = connection => closed(served),
        () = shared.abandon.cancelled() => {}
    }
}

/// Logs why a connection ended, at debug: clients that time out or go away are routine, and
/// a flood of them must not flood the log.
fn closed(served: Result<(), hyper::Error>) {
    if let Err(error) = served {
        tracing::debug!(%error, "connection closed");
    }
}
