//! The signing keys of JWTs: a JSON Web Key Set fetched from `JWT_JWKS` (or from the
//! `jwks_uri` of the issuer's OpenID discovery document), cached, and fetched again when it
//! is older than the cache time, or when a token names a key id the set lacks (at most once
//! per minimum refresh interval, so forged key ids cannot make the server hammer the key
//! server). One fetch at a time; concurrent requests wait for it.

use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use tokio::sync::Mutex;

use super::fetch::JsonFetcher;

/// Where the keys come from.
#[derive(Debug, Clone)]
pub(crate) enum KeySource {
    /// A JWKS URL.
    Jwks(String),
    /// An issuer whose discovery document names the JWKS.
    Issuer(String),
}

/// Why no key could verify a token.
#[derive(Debug)]
pub(crate) enum KeyError {
    /// The key set has no usable key for the token (unknown key id, unsupported algorithm).
    NoKey(String),
    /// The key set could not be fetched and none is cached.
    Unavailable(String),
}

#[derive(Default)]
struct Cached {
    keys: Option<JwkSet>,
    fetched_at: Option<Instant>,
    last_attempt: Option<Instant>,
    /// The JWKS URL, once discovered (or as configured).
    jwks_uri: Option<String>,
}

/// The cached key set.
pub(crate) struct Jwks {
    source: KeySource,
    fetcher: JsonFetcher,
    cache_ttl: Duration,
    min_refresh: Duration,
    cached: Mutex<Cached>,
}

#[derive(Deserialize)]
struct Discovery {
    issuer: Option<String>,
    jwks_uri: String,
}

impl Jwks {
    pub(crate) fn new(
        source: KeySource,
        fetcher: JsonFetcher,
        cache_ttl: Duration,
        min_refresh: Duration,
    ) -> Self {
        let jwks_uri = match &source {
            KeySource::Jwks(url) => Some(url.clone()),
            KeySource::Issuer(_) => None,
        };
        Self {
            source,
            fetcher,
            cache_ttl,
            min_refresh,
            cached: Mutex::new(Cached {
                jwks_uri,
                ..Cached::default()
            }),
        }
    }

    /// The keys that may have signed a token with `kid` and `alg`, fetching the set first
    /// when it is missing, stale, or lacks the key id.
    pub(crate) async fn keys_for(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<Vec<DecodingKey>, KeyError> {
        let mut cached = self.cached.lock().await;
        let stale = cached
            .fetched_at
            .is_none_or(|at| at.elapsed() >= self.cache_ttl);
        if stale && self.may_fetch(&cached) {
            self.refresh(&mut cached).await?;
        }
        let mut keys = cached.keys.as_ref().map(|set| candidates(set, kid, alg));
        if keys.as_ref().is_none_or(Vec::is_empty) && self.may_fetch(&cached) {
            self.refresh(&mut cached).await?;
            keys = cached.keys.as_ref().map(|set| candidates(set, kid, alg));
        }
        match keys {
            None => Err(KeyError::Unavailable(
                "the token signing keys have not been fetched yet".to_owned(),
            )),
            Some(keys) if keys.is_empty() => Err(KeyError::NoKey(match kid {
                Some(kid) => format!("no {alg:?} key with id '{kid}' in the key set"),
                None => format!("no {alg:?} key in the key set"),
            })),
            Some(keys) => Ok(keys),
        }
    }

    /// Whether a fetch is allowed now: never fetched, or the last attempt is older than the
    /// minimum refresh interval.
    fn may_fetch(&self, cached: &Cached) -> bool {
        cached
            .last_attempt
            .is_none_or(|at| at.elapsed() >= self.min_refresh)
    }

    /// Fetches the key set. A failure keeps the keys cached before (if any) and fails only
    /// when there are none.
    async fn refresh(&self, cached: &mut Cached) -> Result<(), KeyError> {
        cached.last_attempt = Some(Instant::now());
        match self.fetch(cached).await {
            Ok(set) => {
                cached.keys = Some(set);
                cached.fetched_at = Some(Instant::now());
                Ok(())
            }
            Err(error) if cached.keys.is_some() => {
                tracing::warn!(
                    error,
                    "fetching the JWKS failed; using the keys fetched before"
                );
                Ok(())
            }
            Err(error) => Err(KeyError::Unavailable(error)),
        }
    }

    async fn fetch(&self, cached: &mut Cached) -> Result<JwkSet, String> {
        let jwks_uri = match (&cached.jwks_uri, &self.source) {
            (Some(uri), _) => uri.clone(),
            (None, KeySource::Issuer(issuer)) => {
                let uri = self.discover(issuer).await?;
                cached.jwks_uri = Some(uri.clone());
                uri
            }
            (None, KeySource::Jwks(url)) => url.clone(),
        };
        let set: JwkSet = self.fetcher.get(&jwks_uri).await?;
        tracing::debug!(keys = set.keys.len(), jwks_uri, "fetched the JWKS");
        Ok(set)
    }

    /// The `jwks_uri` of `issuer`'s OpenID discovery document, whose `issuer` must be the
    /// configured one (as Spring Security checks).
    async fn discover(&self, issuer: &str) -> Result<String, String> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        let discovery: Discovery = self.fetcher.get(&url).await?;
        if let Some(found) = &discovery.issuer
            && found != issuer
        {
            return Err(format!(
                "the discovery document at {url} is for issuer `{found}`, not `{issuer}`"
            ));
        }
        Ok(discovery.jwks_uri)
    }
}

/// The keys of `set` that may verify a token signed with `alg` by key `kid`: same key id
/// (when the token names one), a key type that fits `alg`, and the same `alg` when the key
/// declares one. Symmetric keys are never used: a JWKS is public.
fn candidates(set: &JwkSet, kid: Option<&str>, alg: Algorithm) -> Vec<DecodingKey> {
    set.keys
        .iter()
        .filter(|jwk| kid.is_none_or(|kid| jwk.common.key_id.as_deref() == Some(kid)))
        .filter(|jwk| declared_alg_fits(jwk, alg))
        .filter_map(|jwk| DecodingKey::from_jwk(jwk).ok())
        .collect()
}

fn declared_alg_fits(jwk: &Jwk, alg: Algorithm) -> bool {
    use jsonwebtoken::jwk::{AlgorithmParameters, PublicKeyUse};
    let type_fits = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => matches!(
            alg,
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::PS256
                | Algorithm::PS384
                | Algorithm::PS512
        ),
        AlgorithmParameters::EllipticCurve(_) => {
            matches!(alg, Algorithm::ES256 | Algorithm::ES384)
        }
        AlgorithmParameters::OctetKeyPair(_) => matches!(alg, Algorithm::EdDSA),
        // Symmetric keys (`oct`) and key types jsonwebtoken does not know.
        _ => false,
    };
    let for_signatures = !matches!(
        jwk.common.public_key_use,
        Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
    );
    type_fits
        && for_signatures
        && jwk
            .common
            .key_algorithm
            .is_none_or(|declared| key_algorithm(declared) == Some(alg))
}

fn key_algorithm(declared: KeyAlgorithm) -> Option<Algorithm> {
    Some(match declared {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}
