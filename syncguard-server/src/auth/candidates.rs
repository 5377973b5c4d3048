//! Which keys of a JSON Web Key Set may verify a token: the key id the token names (if any),
//! a key type that fits its algorithm, and the key's own declared algorithm (if any).

use jsonwebtoken::jwk::{Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};

/// The keys of `set` that may verify a token signed with `alg` by key `kid`: same key id
/// (when the token names one), a key type that fits `alg`, and the same `alg` when the key
/// declares one. Symmetric keys are never used: a JWKS is public.
pub(crate) fn candidates(set: &JwkSet, kid: Option<&str>, alg: Algorithm) -> Vec<DecodingKey> {
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
