//! Operations endpoints, outside `/v1` and so never authenticated (LSC's `permitAll`):
//!
//! | route | answer |
//! |---|---|
//! | `GET /health` | liveness: 200 `{"status":"UP"}` while the process serves |
//! | `GET /ready` | readiness: 200 `{"status":"UP"}` when the backend answers a cheap `is_locked`, else 503 `{"status":"DOWN"}`; 503 `{"status":"DOWN","reason":"connection limit reached: ..."}` while the connection limit is reached |
//! | `GET /actuator/health` | LSC's Spring Boot actuator endpoint: as `/ready` (Spring reports a database it depends on) |

use axum::Json;
use axum::Router;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use std::sync::Arc;

use crate::connections::ConnectionLoad;
use crate::locks::Locks;

/// The operations routes.
pub(crate) fn ops_routes(locks: Locks) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/actuator/health", get(ready))
        .with_state(locks)
}

async fn health() -> Response {
    Json(json!({ "status": "UP" })).into_response()
}

/// Under [`serve`](crate::serve), each request carries the connections' load.
async fn ready(
    State(locks): State<Locks>,
    load: Option<Extension<Arc<ConnectionLoad>>>,
) -> Response {
    if let Some(Extension(load)) = load
        && load.is_full()
    {
        // A replica that refuses connections should get no more traffic until some close.
        let reason = format!(
            "connection limit reached: {} of {} connections open",
            load.open(),
            load.limit()
        );
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "DOWN", "reason": reason })),
        )
            .into_response();
    }
    match locks.ping().await {
        Ok(()) => Json(json!({ "status": "UP" })).into_response(),
        Err(error) => {
            tracing::warn!(error = %error, "readiness check: the lock backend failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "status": "DOWN" })),
            )
                .into_response()
        }
    }
}
