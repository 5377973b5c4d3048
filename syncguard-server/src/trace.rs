//! One `tracing` span per request (`syncguard_server.request`) and one structured log line
//! when it ends (target `syncguard_server::request`), modelled on LSC's canonical request log.
//!
//! The span carries `method`, `route`, `namespace`, `lock_name`, `operation`, `outcome`,
//! `status` and `request_id`; the lock handlers fill in what only they know through a
//! [`RequestFacts`] response extension. Never logged: the instanceId (only its SHA-256, as
//! LSC logs it), tokens, holders.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use tracing::Instrument;
use tracing::field::Empty;

/// What a lock handler tells the request log.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestFacts {
    /// `get`, `acquire`, `renew` or `release`.
    pub(crate) operation: &'static str,
    pub(crate) namespace: Option<String>,
    pub(crate) lock_name: Option<String>,
    /// LSC's `lock_service_outcome` (`ACQUIRED`, `RELEASE_CONFLICT`, ...).
    pub(crate) outcome: Option<&'static str>,
    /// LSC's `lock_result`: `success`, `conflict`, `not_found`.
    pub(crate) result: Option<&'static str>,
    /// SHA-256 (hex) of the instanceId.
    pub(crate) instance_id_hash: Option<String>,
    pub(crate) lease_seconds: Option<u32>,
    pub(crate) expiry: Option<u64>,
}

impl RequestFacts {
    pub(crate) fn new(operation: &'static str) -> Self {
        Self {
            operation,
            ..Self::default()
        }
    }
}

/// The hash under which an instanceId is logged.
pub(crate) fn hash_instance_id(instance_id: &str) -> String {
    Sha256::digest(instance_id.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// LSC's `outcome`: `success` (2xx), `rejected` (423), `timeout` (408, 504), `failure`.
fn outcome_of(status: u16) -> &'static str {
    match status {
        200..=299 => "success",
        423 => "rejected",
        408 | 504 => "timeout",
        _ => "failure",
    }
}

/// The middleware: the span around the request, the log line after it.
pub(crate) async fn trace_requests(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let target = request.uri().path().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned());
    let request_id = request
        .headers()
        .get("x-request-id")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| format!("req_{}", uuid::Uuid::new_v4()));
    let span = tracing::info_span!(
        "syncguard_server.request",
        method = %method,
        route = route.as_deref().unwrap_or(""),
        namespace = Empty,
        lock_name = Empty,
        operation = Empty,
        outcome = Empty,
        status = Empty,
        request_id = %request_id,
    );
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    let facts = response.extensions().get::<RequestFacts>();
    span.record("status", status);
    if let Some(facts) = facts {
        span.record("operation", facts.operation);
        if let Some(namespace) = &facts.namespace {
            span.record("namespace", namespace.as_str());
        }
        if let Some(lock_name) = &facts.lock_name {
            span.record("lock_name", lock_name.as_str());
        }
        if let Some(outcome) = facts.outcome {
            span.record("outcome", outcome);
        }
    }
    #[allow(clippy::cast_possible_truncation)] // A request does not last 584 million years.
    let duration_ms = started.elapsed().as_millis() as u64;
    tracing::info!(
        target: "syncguard_server::request",
        parent: &span,
        kind = "http",
        request_id = %request_id,
        http_method = %method,
        http_target = %target,
        http_route = route.as_deref(),
        http_status_code = status,
        outcome = outcome_of(status),
        duration_ms,
        lock_operation = facts.map(|facts| facts.operation),
        lock_namespace = facts.and_then(|facts| facts.namespace.as_deref()),
        lock_name = facts.and_then(|facts| facts.lock_name.as_deref()),
        lock_service_outcome = facts.and_then(|facts| facts.outcome),
        lock_result = facts.and_then(|facts| facts.result),
        instance_id_hash = facts.and_then(|facts| facts.instance_id_hash.as_deref()),
        requested_lease_duration_sec = facts.and_then(|facts| facts.lease_seconds),
        computed_expiry_epoch_sec = facts.and_then(|facts| facts.expiry),
        "request"
    );
    response
}
