//! The four lock routes of LockServiceCentral's API, and what every other request to the API
//! gets (404, 405, OPTIONS).
//!
//! Each handler keeps LSC's order of checks (its specification's section 2.6): the route and
//! method were matched by the router; then the body is read and validated (400 `JSON
//! validation failed`); then the path parameters (400 `Validation failed`); only then is the
//! backend called. So a request with both a bad path and a bad body reports the body, and
//! bad input never reaches a lock.

use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use percent_encoding::percent_decode_str;

use crate::auth::Owner;
use crate::connections::is_body_timeout;
use crate::error::ApiError;
use crate::holder;
use crate::locks::{Answer, Locks};
use crate::responses;
use crate::trace::{RequestFacts, hash_instance_id};
use crate::validation::{self, LockPath};

/// The largest body read: LSC's bodies are under 150 bytes.
const MAX_BODY: usize = 64 * 1024;

/// The status route.
pub(crate) const STATUS_ROUTE: &str = "/v1/{namespace}/lock/{lockName}";

/// The lock routes, on `locks`.
pub(crate) fn lock_routes(locks: Locks) -> Router {
    Router::new()
        .route(
            STATUS_ROUTE,
            get(status).options(|| options("GET, HEAD, OPTIONS")),
        )
        .route(
            "/v1/{namespace}/lock/{lockName}/acquire",
            post(acquire).options(|| options("POST, OPTIONS")),
        )
        .route(
            "/v1/{namespace}/lock/{lockName}/renew",
            post(renew).options(|| options("POST, OPTIONS")),
        )
        .route(
            "/v1/{namespace}/lock/{lockName}/release",
            post(release).options(|| options("POST, OPTIONS")),
        )
        .with_state(locks)
}

/// 404 `Resource not found` for every unmapped path.
pub(crate) async fn not_found() -> Response {
    ApiError::NotFound.into_response()
}

/// 405 `Method not allowed` for a mapped path with another method.
pub(crate) async fn method_not_allowed() -> Response {
    ApiError::MethodNotAllowed.into_response()
}

/// OPTIONS: 200 with `Allow`, as Spring answers it.
async fn options(allow: &'static str) -> Response {
    (
        StatusCode::OK,
        [(header::ALLOW, HeaderValue::from_static(allow))],
    )
        .into_response()
}

/// The raw `namespace` and `lockName` of a lock route's path, percent-decoded (invalid UTF-8
/// becomes U+FFFD, which then fails the pattern).
fn raw_path_parameters(uri: &Uri) -> (String, String) {
    let mut segments = uri.path().split('/').skip(2);
    let mut next = || {
        segments
            .next()
            .map(|segment| percent_decode_str(segment).decode_utf8_lossy().into_owned())
            .unwrap_or_default()
    };
    let namespace = next();
    let _lock = next();
    let lock_name = next();
    (namespace, lock_name)
}

/// The path parameters, validated.
fn lock_path(uri: &Uri) -> Result<LockPath, ApiError> {
    let (namespace, lock_name) = raw_path_parameters(uri);
    validation::lock_path(&namespace, &lock_name)
}

/// The body, whatever its Content-Type.
async fn read_body(body: Body) -> Result<axum::body::Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY).await.map_err(|error| {
        let too_large = std::error::Error::source(&error)
            .is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
        if too_large {
            ApiError::BodyTooLarge
        } else if is_body_timeout(&error) {
            ApiError::BodyTimeout
        } else {
            ApiError::BodyValidation(vec![format!(
                "$: the request body could not be read: {error}"
            )])
        }
    })
}

/// Attaches what the request log should know.
fn with_facts(mut response: Response, facts: RequestFacts) -> Response {
    response.extensions_mut().insert(facts);
    response
}

fn facts_for(operation: &'static str, path: Option<&LockPath>) -> RequestFacts {
    RequestFacts {
        namespace: path.map(|path| path.namespace.clone()),
        lock_name: path.map(|path| path.lock_name.clone()),
        ..RequestFacts::new(operation)
    }
}

/// `GET /v1/{namespace}/lock/{lockName}`: the lock's status.
async fn status(State(locks): State<Locks>, uri: Uri) -> Response {
    let path = match lock_path(&uri) {
        Ok(path) => path,
        Err(error) => return with_facts(error.into_response(), facts_for("get", None)),
    };
    let mut facts = facts_for("get", Some(&path));
    let response = match locks.status(&path.key()).await {
        Ok((holding, outcome)) => {
            facts.outcome = Some(outcome.as_str());
            facts.result = Some(outcome.result());
            facts.expiry = holding.as_ref().map(|holding| holding.expiry);
            responses::status(&path, holding.as_ref())
        }
        Err(error) => {
            facts.outcome = Some("GET_ERROR");
            ApiError::from(error).into_response()
        }
    };
    with_facts(response, facts)
}

/// The three mutations.
#[derive(Clone, Copy)]
enum Mutation {
    Acquire,
    Renew,
    Release,
}

impl Mutation {
    const fn operation(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Renew => "renew",
            Self::Release => "release",
        }
    }

    const fn error_outcome(self) -> &'static str {
        match self {
            Self::Acquire => "ACQUIRE_ERROR",
            Self::Renew => "RENEW_ERROR",
            Self::Release => "RELEASE_ERROR",
        }
    }
}

async fn acquire(
    State(locks): State<Locks>,
    Extension(owner): Extension<Owner>,
    uri: Uri,
    body: Body,
) -> Response {
    mutate(Mutation::Acquire, &locks, &owner, &uri, body).await
}

async fn renew(
    State(locks): State<Locks>,
    Extension(owner): Extension<Owner>,
    uri: Uri,
    body: Body,
) -> Response {
    mutate(Mutation::Renew, &locks, &owner, &uri, body).await
}

async fn release(
    State(locks): State<Locks>,
    Extension(owner): Extension<Owner>,
    uri: Uri,
    body: Body,
) -> Response {
    mutate(Mutation::Release, &locks, &owner, &uri, body).await
}

/// A validated mutation request.
struct Checked {
    path: LockPath,
    instance_id: String,
    /// Seconds, for acquire and renew.
    lease: Option<u32>,
}

/// Body first, then path, as LSC.
async fn check(mutation: Mutation, uri: &Uri, body: Body) -> Result<Checked, ApiError> {
    let body = read_body(body).await?;
    let (instance_id, lease) = match mutation {
        Mutation::Acquire | Mutation::Renew => {
            let request = validation::lease_request(&body)?;
            (request.instance_id, Some(request.lease_duration))
        }
        Mutation::Release => (validation::release_request(&body)?.instance_id, None),
    };
    let path = lock_path(uri)?;
    Ok(Checked {
        path,
        instance_id,
        lease,
    })
}

async fn mutate(
    mutation: Mutation,
    locks: &Locks,
    owner: &Owner,
    uri: &Uri,
    body: Body,
) -> Response {
    let checked = match check(mutation, uri, body).await {
        Ok(checked) => checked,
        Err(error) => {
            return with_facts(error.into_response(), facts_for(mutation.operation(), None));
        }
    };
    let Checked {
        path,
        instance_id,
        lease,
    } = checked;
    let mut facts = facts_for(mutation.operation(), Some(&path));
    facts.instance_id_hash = Some(hash_instance_id(&instance_id));
    facts.lease_seconds = lease;
    let key = path.key();
    let holder = holder::encode(&owner.0, &instance_id);
    let result = match (mutation, lease) {
        (Mutation::Acquire, Some(seconds)) => locks.acquire(&key, &holder, seconds).await,
        (Mutation::Renew, Some(seconds)) => locks.renew(&key, &holder, seconds).await,
        _ => locks.release(&key, &holder).await,
    };
    let response = match result {
        Ok((answer, outcome)) => {
            facts.outcome = Some(outcome.as_str());
            facts.result = Some(outcome.result());
            match answer {
                Answer::Granted(grant) => {
                    facts.expiry = Some(grant.expiry);
                    responses::granted(&path, &owner.0, &instance_id, &grant)
                }
                Answer::Cleared => responses::cleared(&path),
                Answer::Refused => responses::refused(&path),
            }
        }
        Err(error) => {
            facts.outcome = Some(mutation.error_outcome());
            ApiError::from(error).into_response()
        }
    };
    with_facts(response, facts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_parameters_are_decoded() {
        let uri: Uri = "/v1/my%20ns/lock/abc/acquire".parse().unwrap();
        assert_eq!(
            raw_path_parameters(&uri),
            ("my ns".to_owned(), "abc".to_owned())
        );
        let uri: Uri = "/v1/a%FFb/lock/abc".parse().unwrap();
        assert_eq!(raw_path_parameters(&uri).0, "a\u{FFFD}b");
    }
}
