//! The answers the layer gives instead of running the handler.

use std::time::Duration;

use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use syncguard::{ErrorCode, LockError, LostReason};

use crate::body::LockBody;
use crate::config::{Answers, Config};
use crate::key::NoKey;
use crate::retry_after;

/// Why the handler did not run, or did not finish.
#[derive(Debug)]
pub(crate) enum Rejection {
    /// The key is held elsewhere; retry after this long (at least a second).
    Contended { retry_after: Duration },
    /// The key function made no key; the handler was not run.
    NoKey(NoKey),
    /// The key is invalid (a client error).
    InvalidKey,
    /// The backend failed; the handler was not run.
    Unavailable,
    /// The lock was lost while the handler ran; it was cancelled.
    Lost(LostReason),
}

impl Rejection {
    /// Classifies the failure to acquire the lock on `key`. A contended answer's hint comes
    /// from the error alone (the holder's lease as the refusal reported it): no lookup.
    pub(crate) fn from_acquire_error(error: &LockError, key: &str, config: &Config) -> Self {
        if error.is_contended() {
            return Self::Contended {
                retry_after: retry_after::hint(
                    error.holder_lease_left(),
                    config.options.ttl(),
                    config.holds.mean(),
                    config.max_retry_after,
                ),
            };
        }
        if error.code() == ErrorCode::InvalidArgument {
            tracing::debug!(%error, lock = %config.lock_name(key), "syncguard_tower: invalid lock key");
            return Self::InvalidKey;
        }
        tracing::warn!(%error, lock = %config.lock_name(key), "syncguard_tower: lock backend failed; answering without running the handler");
        Self::Unavailable
    }

    /// The response to send.
    pub(crate) fn into_response<B>(self, config: &Config) -> Response<LockBody<B>> {
        match config.answers {
            Answers::Http { contended } => self.into_http_response(contended),
            #[cfg(feature = "grpc")]
            Answers::Grpc { contended } => self.into_grpc_response(contended),
        }
    }

    fn into_http_response<B>(self, contended: StatusCode) -> Response<LockBody<B>> {
        let (status, retry_after, detail) = match &self {
            Self::Contended { retry_after } => (
                contended,
                retry_after::whole_seconds(*retry_after),
                "Another request with the same lock key is in progress. Retry after the number of seconds in Retry-After.".to_owned(),
            ),
            Self::NoKey(no_key) => (
                no_key_status(no_key),
                0,
                format!("No lock key could be made for this request, so it was not processed: {no_key}."),
            ),
            Self::InvalidKey => (
                StatusCode::BAD_REQUEST,
                0,
                "The lock key derived from this request is invalid: it must be non-empty and at most 512 UTF-8 bytes.".to_owned(),
            ),
            Self::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                1,
                "The lock service is unavailable, so the request was not processed. Retry later.".to_owned(),
            ),
            Self::Lost(reason) => (
                StatusCode::SERVICE_UNAVAILABLE,
                1,
                format!("The request's lock was lost before it finished ({reason}), so its processing was stopped; it may have been partly applied. Retry later."),
            ),
        };
        let body = problem_json(status, &detail, retry_after);
        let mut response = Response::new(LockBody::full(body.into()));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if retry_after > 0 {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry_after));
        }
        response
    }

    #[cfg(feature = "grpc")]
    fn into_grpc_response<B>(self, contended: tonic::Code) -> Response<LockBody<B>> {
        use tonic::{Code, Status};

        let (status, pushback_ms) = match self {
            Self::Contended { retry_after } => (
                Status::new(
                    contended,
                    format!(
                        "another call with the same lock key is in progress; retry in {} ms",
                        retry_after.as_millis()
                    ),
                ),
                Some(u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX)),
            ),
            Self::NoKey(no_key) => (
                Status::new(
                    if no_key.is_misconfigured() {
                        Code::Internal
                    } else {
                        Code::InvalidArgument
                    },
                    format!(
                        "no lock key could be made for this call, so it was not processed: {no_key}"
                    ),
                ),
                None,
            ),
            Self::InvalidKey => (
                Status::new(
                    Code::InvalidArgument,
                    "the lock key derived from this call is invalid: it must be non-empty and at most 512 UTF-8 bytes",
                ),
                None,
            ),
            Self::Unavailable => (
                Status::new(
                    Code::Unavailable,
                    "the lock service is unavailable, so the call was not processed; retry later",
                ),
                None,
            ),
            Self::Lost(reason) => (
                Status::new(
                    Code::Unavailable,
                    format!(
                        "the call's lock was lost before it finished ({reason}), so its processing was stopped; it may have been partly applied"
                    ),
                ),
                None,
            ),
        };
        let mut response = status.into_http::<LockBody<B>>();
        if let Some(ms) = pushback_ms {
            response
                .headers_mut()
                .insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
        }
        response
    }
}

/// The status for a request without a key: the client's error, or the server's.
fn no_key_status(no_key: &NoKey) -> StatusCode {
    if no_key.is_misconfigured() {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::BAD_REQUEST
    }
}

/// An RFC 9457 problem document. The detail holds no request data, but may hold the server's
/// names (routes, parameters, headers), which the JSON encoder escapes.
fn problem_json(status: StatusCode, detail: &str, retry_after: u64) -> String {
    let mut json = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    if retry_after > 0 {
        json["retryAfter"] = retry_after.into();
    }
    json.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_documents_are_json() {
        let parsed = |json: String| serde_json::from_str::<serde_json::Value>(&json).unwrap();
        assert_eq!(
            parsed(problem_json(StatusCode::LOCKED, "held", 3)),
            serde_json::json!({"type": "about:blank", "title": "Locked", "status": 423, "detail": "held", "retryAfter": 3})
        );
        // The server's names may hold quotes and backslashes: escaped, not breaking the JSON.
        let detail = r#"the route `/a"b\c` has no parameter"#;
        let quoted = parsed(problem_json(StatusCode::INTERNAL_SERVER_ERROR, detail, 0));
        assert_eq!(quoted["detail"], detail);
        assert_eq!(quoted.get("retryAfter"), None);
    }
}
