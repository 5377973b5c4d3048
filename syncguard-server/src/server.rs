//! Running the server: configuration to backend, router, listener, and a graceful shutdown.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use crate::auth::{Auth, install_crypto_provider};
use crate::backend::open_backend;
use crate::config::ServerConfig;
use crate::router::router;
use crate::shutdown::shutdown_signal;
use crate::startup::StartupError;

/// How long `syncguard::shutdown` may take after the last request.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the server as `config` says until Ctrl-C or SIGTERM, then finishes the requests in
/// flight (for up to `shutdown_timeout_seconds`) and calls `syncguard::shutdown`.
///
/// # Errors
/// Whatever stops it from starting ([`StartupError`]), or an I/O error of the listener.
pub async fn run(config: ServerConfig) -> Result<(), StartupError> {
    // Before any backend client may sign a token of its own (the Firestore client does).
    install_crypto_provider();
    let auth = Auth::from_settings(&config.auth_settings())?;
    let backend = open_backend(&config.backend_settings()).await?;
    let backend_name = backend.capabilities().backend;
    let app = router(backend, auth.clone())?;
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
        "syncguard-server listening"
    );
    serve(
        listener,
        app,
        shutdown_signal(),
        Duration::from_secs(config.shutdown_timeout_seconds),
    )
    .await?;
    let report = syncguard::shutdown(RELEASE_TIMEOUT).await;
    tracing::info!(?report, "syncguard-server stopped");
    Ok(())
}

/// Serves `app` on `listener` until `signal` completes, then stops accepting connections and
/// waits for the requests in flight, for up to `drain_timeout`.
///
/// # Errors
/// An I/O error of the listener.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    signal: impl Future<Output = ()> + Send + 'static,
    drain_timeout: Duration,
) -> Result<(), StartupError> {
    let address = listener
        .local_addr()
        .map_or_else(|_| "the listener".to_owned(), |address| address.to_string());
    let (signalled, on_signal) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        signal.await;
        let _ = signalled.send(());
    };
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(signal)
        .into_future();
    tokio::pin!(server);
    let drain_deadline = async {
        if on_signal.await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(drain_timeout).await;
    };
    tokio::select! {
        served = &mut server => served.map_err(|source| StartupError::Serve { address, source }),
        () = drain_deadline => {
            tracing::warn!(?drain_timeout, "requests still in flight after the shutdown timeout; stopping anyway");
            Ok(())
        }
    }
}
