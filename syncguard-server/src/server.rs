//! Running the server: configuration to backend, router, listener, the connections' limits,
//! and a graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use crate::auth::{Auth, install_crypto_provider};
use crate::backend::open_backend;
use crate::config::ServerConfig;
use crate::connections::{ServeSettings, connection_limit, serve_connections};
use crate::router::router_with_request_log;
use crate::shutdown::shutdown_signal;
use crate::startup::StartupError;

/// How long `syncguard::shutdown` may take after the last request.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the server as `config` says until Ctrl-C or SIGTERM, then shuts down as [`serve`]
/// does and calls `syncguard::shutdown`.
///
/// # Errors
/// Whatever stops it from starting ([`StartupError`]).
pub async fn run(config: ServerConfig) -> Result<(), StartupError> {
    // Before any backend client may sign a token of its own (the Firestore client does).
    install_crypto_provider();
    let serving = config.serve_settings();
    // Checked before the backend is opened, so that a bad setting is reported at once.
    let max_connections = serving
        .check()
        .and_then(|()| connection_limit(serving.max_connections()))
        .map_err(StartupError::Connections)?;
    let serving = serving.with_max_connections(Some(max_connections));
    let auth = Auth::from_settings(&config.auth_settings())?;
    let backend = open_backend(&config.backend_settings()).await?;
    let backend_name = backend.capabilities().backend;
    let app = router_with_request_log(backend, auth.clone(), config.request_log_level)?;
    let address = SocketAddr::new(config.address, config.port);
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| StartupError::Serve {
            address: address.to_string(),
            source,
        })?;
    tracing::info!(
        address = %listener.local_addr().unwrap_or(address),
        backend = backend_name,
        auth = auth.mode_name(),
        max_connections,
        "syncguard-server listening"
    );
    serve(listener, app, shutdown_signal(), serving).await?;
    let report = syncguard::shutdown(RELEASE_TIMEOUT).await;
    tracing::info!(?report, "syncguard-server stopped");
    Ok(())
}

/// Serves `app` on `listener` over HTTP/1.1 with the timeouts and the connection limit of
/// `settings`, until `signal` completes; then stops accepting connections, closes those with
/// no request in progress (idle ones, and those whose request head has not all arrived), and
/// waits for the requests in progress for up to the shutdown timeout.
///
/// See [`ServeSettings`] for what each setting does. `/ready` answers 503 while the
/// connection limit is reached.
///
/// # Errors
/// [`StartupError::Connections`] when a timeout is zero or the connection limit is more than
/// the open-file limit can hold.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    signal: impl Future<Output = ()> + Send + 'static,
    settings: ServeSettings,
) -> Result<(), StartupError> {
    serve_connections(listener, app, signal, settings)
        .await
        .map_err(StartupError::Connections)
}
