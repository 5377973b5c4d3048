//! The lock answers of the HTTP API, field for field as LockServiceCentral gives them
//! (absent fields are absent, never `null`), plus the `Fencing-Token` header on every answer
//! that shows a held lock.

use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use syncguard::Fence;

use crate::locks::{Grant, Holding};
use crate::validation::LockPath;

/// The header that carries a held lock's fencing token: its 15-digit decimal form
/// (`000000000000042`), strictly increasing per lock across holders (and across restarts, on
/// a persistent backend).
pub const FENCING_TOKEN: HeaderName = HeaderName::from_static("fencing-token");

/// LSC's `Lock` / `LockStatus` / `LockConflict` JSON, in its field order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LockBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    success: Option<bool>,
    namespace: &'a str,
    lock_name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    instance_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_duration: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expiry: Option<u64>,
}

impl<'a> LockBody<'a> {
    fn new(path: &'a LockPath) -> Self {
        Self {
            success: None,
            namespace: &path.namespace,
            lock_name: &path.lock_name,
            owner: None,
            instance_id: None,
            lease_duration: None,
            expiry: None,
        }
    }
}

fn fenced(status: StatusCode, body: &LockBody<'_>, fence: Option<Fence>) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    if let Some(fence) = fence
        && let Ok(value) = HeaderValue::from_str(&fence.to_string())
    {
        response.headers_mut().insert(FENCING_TOKEN, value);
    }
    response
}

/// GET: `{"namespace","lockName"}` when free; with `owner` (when known) and `expiry` and the
/// fencing token when held.
pub(crate) fn status(path: &LockPath, holding: Option<&Holding>) -> Response {
    let mut body = LockBody::new(path);
    if let Some(holding) = holding {
        body.owner = holding.owner.as_deref();
        body.expiry = Some(holding.expiry);
    }
    fenced(StatusCode::OK, &body, holding.map(|holding| holding.fence))
}

/// A successful acquire or renew: the whole record, with the caller's instanceId echoed, and
/// the fencing token.
pub(crate) fn granted(path: &LockPath, owner: &str, instance_id: &str, grant: &Grant) -> Response {
    let body = LockBody {
        success: Some(true),
        owner: Some(owner),
        instance_id: Some(instance_id),
        lease_duration: Some(grant.lease_duration),
        expiry: Some(grant.expiry),
        ..LockBody::new(path)
    };
    fenced(StatusCode::OK, &body, Some(grant.fence))
}

/// A release that succeeded (or found nothing to release): `{"success":true,...}`.
pub(crate) fn cleared(path: &LockPath) -> Response {
    let body = LockBody {
        success: Some(true),
        ..LockBody::new(path)
    };
    fenced(StatusCode::OK, &body, None)
}

/// A refused acquire, renew or release: 423 `{"success":false,...}`, no fencing token.
pub(crate) fn refused(path: &LockPath) -> Response {
    let body = LockBody {
        success: Some(false),
        ..LockBody::new(path)
    };
    fenced(StatusCode::LOCKED, &body, None)
}
