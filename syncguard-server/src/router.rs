//! The whole HTTP application: the lock routes, the operations and documentation routes,
//! LSC's 404 and 405 answers, authentication before routing, and the request span and log
//! around everything.

use std::sync::Arc;

use axum::Router;
use axum::middleware::from_fn_with_state;
use syncguard::backend::LockBackend;

use crate::auth::{Auth, authenticate};
use crate::backend::require_holders;
use crate::locks::Locks;
use crate::startup::StartupError;
use crate::trace::{RequestLogLevel, trace_requests};
use crate::{openapi, ops, routes};

/// The server's [`Router`] on `backend`, authenticating as `auth` says, logging each request
/// at `info`: serve it with [`serve`](crate::serve) (which sets the timeouts and limits of
/// its connections), or nest it in an application of your own.
///
/// ```
/// use std::sync::Arc;
/// use syncguard::MemoryBackend;
/// use syncguard_server::{Auth, router};
///
/// let app = router(Arc::new(MemoryBackend::new()), Auth::disabled())?;
/// # let _ = app;
/// # Ok::<(), syncguard_server::StartupError>(())
/// ```
///
/// # Errors
/// [`StartupError::NoHolders`] when the backend does not store lock holders.
pub fn router(backend: Arc<dyn LockBackend>, auth: Auth) -> Result<Router, StartupError> {
    router_with_request_log(backend, auth, RequestLogLevel::default())
}

/// As [`router`], with each request logged at `request_log` (its span and its log line)
/// rather than at `info`.
///
/// ```
/// use std::sync::Arc;
/// use syncguard::MemoryBackend;
/// use syncguard_server::{Auth, RequestLogLevel, router_with_request_log};
///
/// let app = router_with_request_log(
///     Arc::new(MemoryBackend::new()),
///     Auth::disabled(),
///     RequestLogLevel::OFF,
/// )?;
/// # let _ = app;
/// # Ok::<(), syncguard_server::StartupError>(())
/// ```
///
/// # Errors
/// [`StartupError::NoHolders`] when the backend does not store lock holders.
pub fn router_with_request_log(
    backend: Arc<dyn LockBackend>,
    auth: Auth,
    request_log: RequestLogLevel,
) -> Result<Router, StartupError> {
    require_holders(&*backend)?;
    let locks = Locks::new(backend);
    Ok(Router::new()
        .merge(routes::lock_routes(locks.clone()))
        .merge(ops::ops_routes(locks))
        .merge(openapi::doc_routes())
        // After the merges: it applies to the routes present.
        .method_not_allowed_fallback(routes::method_not_allowed)
        .fallback(routes::not_found)
        // Layers wrap each route, its 405 and the 404 fallback: authentication runs before
        // them, as Spring Security's filters run before Spring MVC's routing.
        .layer(from_fn_with_state(auth, authenticate))
        .layer(from_fn_with_state(request_log, trace_requests)))
}
