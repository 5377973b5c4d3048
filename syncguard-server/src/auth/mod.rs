//! Who is calling: LockServiceCentral's three authentication modes, checked before routing
//! on every `/v1` path (as Spring Security's filter chain runs before Spring MVC), so an
//! unauthenticated call learns nothing, not even whether its route exists.
//!
//! | settings | mode | owner |
//! |---|---|---|
//! | `JWT_JWKS` or `JWT_ISSUER` set (even with `AUTHENTICATION_DISABLED=true`) | JWT | the token's `sub` |
//! | `AUTHENTICATION_DISABLED=true` | disabled | `anonymous` |
//! | neither | unconfigured | every `/v1` call refused: 403 |
//!
//! In JWT mode a call without a bearer token, or whose token does not verify, is answered 401
//! with `WWW-Authenticate: Bearer ...` and no body (Spring's answer); when the keys cannot be
//! fetched, 503.

mod candidates;
mod fetch;
mod jwks;
mod jwt;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::config::{AuthSettings, JwtSettings};
use crate::error::ApiError;
use crate::holder;
use crate::startup::StartupError;

use jwks::{Jwks, KeySource};
pub(crate) use jwt::install_crypto_provider;
use jwt::{JwtVerifier, TokenError};

/// The owner LSC gives every caller when authentication is disabled.
pub const ANONYMOUS: &str = "anonymous";

/// The authenticated caller of a `/v1` request: a request extension the authentication
/// middleware adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner(pub(crate) String);

#[derive(Clone)]
enum Mode {
    Disabled,
    Jwt(Arc<JwtVerifier>),
    Unconfigured,
}

/// How the server authenticates callers. Build it from [`AuthSettings`] with
/// [`Auth::from_settings`], or with [`Auth::disabled`] for tests and trusted networks.
#[derive(Clone)]
pub struct Auth {
    mode: Mode,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.mode {
            Mode::Disabled => "Auth::Disabled",
            Mode::Jwt(_) => "Auth::Jwt",
            Mode::Unconfigured => "Auth::Unconfigured",
        })
    }
}

impl Auth {
    /// Every caller is `anonymous`: the instanceId alone is the credential.
    pub fn disabled() -> Self {
        Self {
            mode: Mode::Disabled,
        }
    }

    /// No authentication configured: every `/v1` call is refused (403), as in LSC.
    pub fn unconfigured() -> Self {
        Self {
            mode: Mode::Unconfigured,
        }
    }

    /// JWTs verified as `settings` say. No I/O happens here: the keys are fetched at the
    /// first token.
    ///
    /// # Errors
    /// [`StartupError::Auth`] when neither a JWKS URL nor an issuer is given, or HTTPS cannot
    /// be set up.
    pub fn jwt(settings: &JwtSettings) -> Result<Self, StartupError> {
        let source = match (&settings.jwks, &settings.issuer) {
            (Some(jwks), _) => KeySource::Jwks(jwks.clone()),
            (None, Some(issuer)) => KeySource::Issuer(issuer.clone()),
            (None, None) => {
                return Err(StartupError::Auth(
                    "JWT verification needs JWT_JWKS or JWT_ISSUER".to_owned(),
                ));
            }
        };
        let fetcher = fetch::JsonFetcher::new().map_err(StartupError::Auth)?;
        let keys = Jwks::new(source, fetcher, settings.cache_ttl, settings.min_refresh);
        let verifier = JwtVerifier::new(keys, settings.issuer.clone(), settings.audience.clone());
        Ok(Self {
            mode: Mode::Jwt(Arc::new(verifier)),
        })
    }

    /// The mode `settings` select: JWT when configured (it wins over `disabled`, as in
    /// LSC), else disabled when asked, else unconfigured.
    ///
    /// # Errors
    /// As [`Auth::jwt`].
    pub fn from_settings(settings: &AuthSettings) -> Result<Self, StartupError> {
        match &settings.jwt {
            Some(jwt) => {
                if settings.disabled {
                    tracing::warn!(
                        "AUTHENTICATION_DISABLED=true is ignored: JWT_JWKS or JWT_ISSUER is set, and JWT verification wins (as in LockServiceCentral)"
                    );
                }
                Self::jwt(jwt)
            }
            None if settings.disabled => Ok(Self::disabled()),
            None => {
                tracing::warn!(
                    "no authentication is configured: every /v1 call will be refused with 403; set AUTHENTICATION_DISABLED=true, or JWT_JWKS / JWT_ISSUER"
                );
                Ok(Self::unconfigured())
            }
        }
    }

    /// A one-word name of the mode, for the startup log.
    pub fn mode_name(&self) -> &'static str {
        match self.mode {
            Mode::Disabled => "disabled",
            Mode::Jwt(_) => "jwt",
            Mode::Unconfigured => "unconfigured",
        }
    }

    /// The owner of a request, or why it is refused.
    async fn owner(&self, authorization: Option<&HeaderValue>) -> Result<Owner, ApiError> {
        let verifier = match &self.mode {
            Mode::Disabled => return Ok(Owner(ANONYMOUS.to_owned())),
            Mode::Unconfigured => return Err(ApiError::Forbidden),
            Mode::Jwt(verifier) => verifier,
        };
        let token = bearer_token(authorization)?;
        let subject = verifier.subject(token).await.map_err(|error| match error {
            TokenError::Invalid(reason) => ApiError::Unauthorized {
                reason: Some(reason),
            },
            TokenError::KeysUnavailable(reason) => ApiError::KeysUnavailable(reason),
        })?;
        if !holder::owner_fits(&subject) {
            return Err(ApiError::Unauthorized {
                reason: Some(
                    "the token's subject (sub) is too long to name a lock owner".to_owned(),
                ),
            });
        }
        Ok(Owner(subject))
    }
}

/// The token of an `Authorization: Bearer <token>` header (the scheme in any case, as
/// Spring's resolver accepts it).
fn bearer_token(authorization: Option<&HeaderValue>) -> Result<&str, ApiError> {
    let Some(value) = authorization else {
        return Err(ApiError::Unauthorized { reason: None });
    };
    let malformed = || ApiError::Unauthorized {
        reason: Some("Bearer token is malformed".to_owned()),
    };
    let value = value.to_str().map_err(|_| malformed())?;
    let Some((scheme, token)) = value.split_once(' ') else {
        return Err(ApiError::Unauthorized { reason: None });
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ApiError::Unauthorized { reason: None });
    }
    let token = token.trim();
    if token.is_empty() || token.contains(' ') {
        return Err(malformed());
    }
    Ok(token)
}

/// Whether `path` is under `/v1` (Spring's `/v1/**`, which also matches `/v1` itself).
fn is_api_path(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/")
}

/// The middleware: authenticates `/v1` requests and adds their [`Owner`]; other paths pass.
pub(crate) async fn authenticate(
    State(auth): State<Auth>,
    mut request: Request,
    next: Next,
) -> Response {
    if !is_api_path(request.uri().path()) {
        return next.run(request).await;
    }
    let authorization = request.headers().get(header::AUTHORIZATION).cloned();
    match auth.owner(authorization.as_ref()).await {
        Ok(owner) => {
            request.extensions_mut().insert(owner);
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_paths() {
        assert!(is_api_path("/v1"));
        assert!(is_api_path("/v1/ns/lock/abc"));
        assert!(!is_api_path("/v10"));
        assert!(!is_api_path("/health"));
    }

    #[test]
    fn mode_selection() {
        let jwt = JwtSettings::from_jwks("http://127.0.0.1:1/jwks");
        let mut both = AuthSettings::jwt(jwt);
        both.disabled = true;
        assert_eq!(Auth::from_settings(&both).unwrap().mode_name(), "jwt");
        assert_eq!(
            Auth::from_settings(&AuthSettings::disabled())
                .unwrap()
                .mode_name(),
            "disabled"
        );
        assert_eq!(
            Auth::from_settings(&AuthSettings::default())
                .unwrap()
                .mode_name(),
            "unconfigured"
        );
    }
}
