//! The answers the layer gives instead of running the handler.

use std::time::Duration;

use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use syncguard::{LockError, LostReason};

use crate::body::LockBody;
use crate::config::Config;

/// Why the handler did not run, or did not finish.
#[derive(Debug)]
pub(crate) enum Rejection {
    /// The key is held elsewhere; retry after this many seconds.
    Contended { retry_after_secs: u64 },
    /// The key is invalid (a client error).
    InvalidKey,
    /// The backend failed; the handler was not run.
    Unavailable,
    /// The lock was lost while the handler ran; it was cancelled.
    Lost(LostReason),
}

impl Rejection {
    /// Classifies the failure to acquire the lock on `key`, looking up the holder's expiry
    /// for contention.
    pub(crate) async fn from_acquire_error(error: LockError, key: &str, config: &Config) -> Self {
        if error.is_contended() {
            let holder = syncguard::get_by_key(config.backend.as_ref(), key).await;
            let expires_at_ms = match holder {
                Ok(info) => info.map(|info| info.expires_at_ms),
                Err(lookup) => {
                    tracing::debug!(error = %lookup, lock = %config.lock_name(key), "syncguard_tower: looking up the holder's expiry failed; answering Retry-After: 1");
                    None
                }
            };
            return Self::Contended {
                retry_after_secs: retry_after_secs(
                    expires_at_ms,
                    syncguard::time::now_ms(),
                    config.options.ttl(),
                ),
            };
        }
        if matches!(error, LockError::InvalidArgument { .. }) {
            tracing::debug!(%error, lock = %config.lock_name(key), "syncguard_tower: invalid lock key");
            return Self::InvalidKey;
        }
        tracing::warn!(%error, lock = %config.lock_name(key), "syncguard_tower: lock backend failed; answering without running the handler");
        Self::Unavailable
    }

    /// The response to send.
    pub(crate) fn into_response<B>(self, config: &Config) -> Response<LockBody<B>> {
        #[cfg(feature = "grpc")]
        if let Some(contended) = config.grpc_contended {
            return self.into_grpc_response(contended);
        }
        self.into_http_response(config.contended_status)
    }

    fn into_http_response<B>(self, contended: StatusCode) -> Response<LockBody<B>> {
        let (status, retry_after, detail) = match &self {
            Self::Contended { retry_after_secs } => (
                contended,
                *retry_after_secs,
                "Another request with the same lock key is in progress. Retry after the number of seconds in Retry-After.".to_owned(),
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
            Self::Contended { retry_after_secs } => (
                Status::new(
                    contended,
                    format!(
                        "another call with the same lock key is in progress; retry in {retry_after_secs} s"
                    ),
                ),
                Some(retry_after_secs.saturating_mul(1000)),
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

/// Seconds until a holder whose lease ends at `expires_at_ms` stops counting as live (the
/// expiry plus the 1 s tolerance), rounded up, at least 1 and at most `ttl` + 1 s: a
/// time-authority clock ahead of ours must not produce an absurd wait.
pub(crate) fn retry_after_secs(expires_at_ms: Option<u64>, now_ms: u64, ttl: Duration) -> u64 {
    let Some(expires_at_ms) = expires_at_ms else {
        return 1;
    };
    let live_until = expires_at_ms.saturating_add(syncguard::time::TIME_TOLERANCE_MS);
    let left_ms = live_until.saturating_sub(now_ms);
    let max = ttl
        .as_millis()
        .saturating_add(u128::from(syncguard::time::TIME_TOLERANCE_MS))
        .div_ceil(1000);
    let max = u64::try_from(max).unwrap_or(u64::MAX);
    left_ms.div_ceil(1000).clamp(1, max.max(1))
}

/// An RFC 9457 problem document. Every text in it is ours (no request data), so no escaping
/// is needed beyond what the constants already satisfy.
fn problem_json(status: StatusCode, detail: &str, retry_after: u64) -> String {
    let title = status.canonical_reason().unwrap_or("Error");
    let mut json = format!(
        r#"{{"type":"about:blank","title":"{title}","status":{},"detail":"{detail}""#,
        status.as_u16()
    );
    if retry_after > 0 {
        json.push_str(&format!(r#","retryAfter":{retry_after}"#));
    }
    json.push('}');
    json
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_counts_the_tolerance_and_is_clamped() {
        let ttl = Duration::from_secs(30);
        let now = 1_000_000;
        assert_eq!(retry_after_secs(None, now, ttl), 1);
        // Expires in 2.5 s: live 3.5 s more, rounded up to 4.
        assert_eq!(retry_after_secs(Some(now + 2_500), now, ttl), 4);
        // Already expired but inside the tolerance.
        assert_eq!(retry_after_secs(Some(now - 500), now, ttl), 1);
        assert_eq!(retry_after_secs(Some(now - 5_000), now, ttl), 1);
        // A clock an hour ahead: clamped to the ttl plus the tolerance.
        assert_eq!(retry_after_secs(Some(now + 3_600_000), now, ttl), 31);
        assert_eq!(
            retry_after_secs(Some(now + 3_600_000), now, Duration::from_millis(1)),
            2
        );
    }

    #[test]
    fn problem_documents_are_json() {
        let json = problem_json(StatusCode::LOCKED, "held", 3);
        assert_eq!(
            json,
            r#"{"type":"about:blank","title":"Locked","status":423,"detail":"held","retryAfter":3}"#
        );
    }
}
