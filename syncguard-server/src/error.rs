//! The error answers of the HTTP API: LockServiceCentral's shapes (`Validation failed`, `JSON
//! validation failed`, `Resource not found`, `Method not allowed`, `Internal server error`) and
//! ours where LSC's behaviour is a bug (`Lock backend unavailable`) or Spring's (401, 403).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use syncguard::{ErrorCode, LockError};

/// An answer that is not a lock: what went wrong with a request.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// A path parameter failed validation: 400 `Validation failed`.
    PathValidation(Vec<String>),
    /// The body is not JSON or fails the request's JSON Schema: 400 `JSON validation failed`.
    BodyValidation(Vec<String>),
    /// The body is larger than the server reads: 413.
    BodyTooLarge,
    /// The body did not arrive within the body read timeout: 408, and the connection closes.
    BodyTimeout,
    /// No route: 404 `Resource not found`.
    NotFound,
    /// A route without this method: 405 `Method not allowed`.
    MethodNotAllowed,
    /// No bearer token, or one that does not verify: 401 with `WWW-Authenticate`, no body
    /// (Spring Security's answer, which LSC clients see).
    Unauthorized {
        /// Why the token was refused (`None`: there was no token).
        reason: Option<String>,
    },
    /// No authentication is configured, so every API call is refused: 403.
    Forbidden,
    /// The token's signing keys could not be fetched: 503.
    KeysUnavailable(String),
    /// The lock backend failed: 503 `Lock backend unavailable`.
    Backend(LockError),
    /// A failure of this server: 500 `Internal server error`.
    Internal(String),
}

impl ApiError {
    /// The status code of this answer.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::PathValidation(_) | Self::BodyValidation(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::KeysUnavailable(_) | Self::Backend(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<LockError> for ApiError {
    /// Backend failures are 503; an argument the backend refused after this server's own
    /// validation passed is a bug of this server (500).
    fn from(error: LockError) -> Self {
        if error.code() == ErrorCode::InvalidArgument {
            Self::Internal(error.to_string())
        } else {
            Self::Backend(error)
        }
    }
}

/// A fresh `errorId` (random UUID v4), logged with the failure it names.
fn error_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// `{"message":...,"errorId":...}`, LSC's shape for 404, 405 and 500 (in its field order).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Identified<'a> {
    message: &'a str,
    error_id: &'a str,
}

/// `{"message":...,"details":[...]}`, LSC's shape for validation failures.
#[derive(Serialize)]
struct Detailed<'a> {
    message: &'a str,
    details: &'a [String],
}

fn identified(status: StatusCode, message: &str, error_id: &str) -> Response {
    (status, axum::Json(Identified { message, error_id })).into_response()
}

fn detailed(status: StatusCode, message: &str, details: &[String]) -> Response {
    (status, axum::Json(Detailed { message, details })).into_response()
}

/// The `WWW-Authenticate` value of a 401 (RFC 6750 section 3, as Spring Security sends it).
fn bearer_challenge(reason: Option<&str>) -> HeaderValue {
    let value = match reason {
        None => "Bearer".to_owned(),
        Some(reason) => {
            // A quoted-string may not hold `"` or `\` unescaped; keep the description plain.
            let reason: String = reason
                .chars()
                .map(|c| match c {
                    '"' | '\\' => '\'',
                    c if c.is_ascii_graphic() || c == ' ' => c,
                    _ => '?',
                })
                .collect();
            format!(
                "Bearer error=\"invalid_token\", error_description=\"{reason}\", error_uri=\"https://tools.ietf.org/html/rfc6750#section-3.1\""
            )
        }
    };
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        match self {
            Self::PathValidation(details) => detailed(status, "Validation failed", &details),
            Self::BodyValidation(details) => detailed(status, "JSON validation failed", &details),
            Self::BodyTooLarge => identified(status, "Request body too large", &error_id()),
            // The rest of the body may still come: the connection cannot be used again.
            Self::BodyTimeout => (
                [(header::CONNECTION, HeaderValue::from_static("close"))],
                identified(status, "Request body not received in time", &error_id()),
            )
                .into_response(),
            Self::NotFound => identified(status, "Resource not found", &error_id()),
            Self::MethodNotAllowed => identified(status, "Method not allowed", &error_id()),
            Self::Unauthorized { reason } => (
                status,
                [(
                    header::WWW_AUTHENTICATE,
                    bearer_challenge(reason.as_deref()),
                )],
            )
                .into_response(),
            Self::Forbidden => identified(
                status,
                "Access denied: authentication is not configured (set AUTHENTICATION_DISABLED=true, or JWT_JWKS / JWT_ISSUER)",
                &error_id(),
            ),
            Self::KeysUnavailable(reason) => {
                let error_id = error_id();
                tracing::error!(error_id, reason, "token signing keys unavailable");
                identified(status, "Token signing keys unavailable", &error_id)
            }
            Self::Backend(error) => {
                let error_id = error_id();
                tracing::error!(error_id, error = %error, code = ?error.code(), "lock backend failed");
                identified(status, "Lock backend unavailable", &error_id)
            }
            Self::Internal(reason) => {
                let error_id = error_id();
                tracing::error!(error_id, reason, "internal server error");
                identified(status, "Internal server error", &error_id)
            }
        }
    }
}
