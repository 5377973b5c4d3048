//! Verifying a bearer JWT as LSC's Spring Security configuration does: signed by a key of the
//! JWKS, `exp` and `nbf` (when present) checked with 60 s of clock skew, `iss` equal to
//! `JWT_ISSUER` when set, `aud` containing `JWT_AUDIENCE` when set. The owner is `sub`; a
//! token without one is refused (LSC let it act as a wildcard owner: its quirk Q7).
//!
//! A token whose header has a `crit` parameter is refused: it names extensions the token
//! must not be accepted without understanding (RFC 7515 section 4.1.11), and this server
//! understands none (as Spring Security's resource server, which LSC uses, refuses them).

use std::collections::HashSet;

use jsonwebtoken::{Algorithm, Validation, decode, decode_header};
use serde::Deserialize;

use super::jwks::{Jwks, KeyError};

/// Spring Security's default clock skew for `exp` and `nbf`.
const LEEWAY_SECONDS: u64 = 60;

/// Why a token was not accepted.
#[derive(Debug)]
pub(crate) enum TokenError {
    /// The token is malformed, badly signed, expired, or lacks what is required: 401.
    Invalid(String),
    /// The keys could not be fetched: 503.
    KeysUnavailable(String),
}

/// The claims the server reads; the others are checked by the validation or ignored.
#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
}

/// Verifies tokens against a key set.
pub(crate) struct JwtVerifier {
    keys: Jwks,
    issuer: Option<String>,
    audience: Option<String>,
}

impl JwtVerifier {
    pub(crate) fn new(keys: Jwks, issuer: Option<String>, audience: Option<String>) -> Self {
        install_crypto_provider();
        Self {
            keys,
            issuer,
            audience,
        }
    }

    /// The token's subject, once the token is verified.
    pub(crate) async fn subject(&self, token: &str) -> Result<String, TokenError> {
        let header = decode_header(token)
            .map_err(|error| TokenError::Invalid(format!("malformed token: {error}")))?;
        if let Some(critical) = &header.crit {
            return Err(TokenError::Invalid(format!(
                "the token's header names critical extensions this server does not understand (crit: {critical:?})"
            )));
        }
        if !is_asymmetric(header.alg) {
            return Err(TokenError::Invalid(format!(
                "the {:?} algorithm is not accepted",
                header.alg
            )));
        }
        let keys = self
            .keys
            .keys_for(header.kid.as_deref(), header.alg)
            .await
            .map_err(|error| match error {
                KeyError::NoKey(reason) => TokenError::Invalid(reason),
                KeyError::Unavailable(reason) => TokenError::KeysUnavailable(reason),
            })?;
        let validation = self.validation(header.alg);
        let mut last_error = None;
        for key in &keys {
            match decode::<Claims>(token, key, &validation) {
                Ok(data) => {
                    return match data.claims.sub {
                        Some(sub) if !sub.is_empty() => Ok(sub),
                        _ => Err(TokenError::Invalid(
                            "the token has no subject (sub), which names the lock owner".to_owned(),
                        )),
                    };
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(TokenError::Invalid(match last_error {
            Some(error) => format!("the token does not verify: {error}"),
            None => "no key to verify the token with".to_owned(),
        }))
    }

    fn validation(&self, alg: Algorithm) -> Validation {
        let mut validation = Validation::new(alg);
        validation.leeway = LEEWAY_SECONDS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        // As Spring: `exp` and `nbf` are checked when present, not required.
        let mut required = HashSet::new();
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            required.insert("iss".to_owned());
        }
        match &self.audience {
            Some(audience) => {
                validation.set_audience(&[audience]);
                required.insert("aud".to_owned());
            }
            None => validation.validate_aud = false,
        }
        validation.required_spec_claims = required;
        validation
    }
}

/// Chooses jsonwebtoken's process-wide crypto provider, if none is chosen yet: when another
/// crate of the build enables its aws-lc provider too (the Firestore client does), jsonwebtoken
/// chooses none by itself and panics at its first use. Ours is pure Rust.
pub(crate) fn install_crypto_provider() {
    let _ = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.install_default();
}

const fn is_asymmetric(alg: Algorithm) -> bool {
    !matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
}
