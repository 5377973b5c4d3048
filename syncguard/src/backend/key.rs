//! Keys: validation, storage-key derivation and sanitized hashes, byte for byte as the
//! reference design computes them, so that Rust and TypeScript services address the same
//! stored locks (within the [Unicode limit](#unicode-the-limit-of-the-compatibility-promise)).
//!
//! ```
//! use syncguard::backend::key::{hash_key, make_fence_key, make_storage_key, normalize_key};
//!
//! let key = normalize_key("job:42")?;
//! let storage = make_storage_key("syncguard", &key, 1000, 26)?;
//! assert_eq!(storage, "syncguard:job:42");
//! assert_eq!(make_fence_key("syncguard", &storage, 1000, 26)?, "syncguard:fence:syncguard:job:42");
//! assert_eq!(hash_key("resource:123"), "e90a28c676a29a3291e2874a");
//! # Ok::<(), syncguard::LockError>(())
//! ```
//!
//! # Unicode: the limit of the compatibility promise
//!
//! Every key is normalized to Unicode NFC before it is stored or hashed ([`normalize_key`]),
//! as the reference does with JavaScript's `key.normalize("NFC")`, so that `"café"` and
//! `"cafe\u{301}"` are one lock. Normalization depends on the Unicode version of its tables.
//! This crate uses those of the `unicode-normalization` crate, version **0.1.26**, which
//! implements **Unicode 18.0.0**. That version is pinned deliberately: a newer Unicode
//! version can normalize a key differently (see below), and a dependency update must not
//! move keys between the replicas of one service built before and after it. A peer service
//! normalizes with the Unicode version of its runtime: Node.js 20.20, for example, implements
//! Unicode 17.0 (`process.versions.unicode`).
//!
//! - A key made only of code points assigned in both Unicode versions is normalized alike by
//!   both (Unicode's normalization stability policy): the two services store it under one
//!   name and exclude each other. ASCII keys are always in NFC, whatever the version.
//! - A key containing a code point that is unassigned in the Unicode version of one of them
//!   can be normalized differently, and so **stored under two different names**: the two
//!   services then do not exclude each other on that key, and count its fences separately.
//!   For example U+05C8 is a combining mark (canonical combining class 10) in Unicode 18 and
//!   unassigned in Unicode 17: here `"\u{5B1}\u{5C8}"` becomes `"\u{5C8}\u{5B1}"` (marks are
//!   put in order of their class), while Node.js 20 leaves it as it is.
//!
//! Keys built from identifiers (ASCII, or text in scripts long assigned) are not affected.
//! Where keys come from user input that may hold new characters, and services in other
//! languages share the locks, keep keys to code points assigned in the oldest Unicode version
//! among them, or hash or percent-encode such input into ASCII before it becomes a key.
//!
//! ```
//! use syncguard::backend::key::normalize_key;
//!
//! // U+05B1 (class 11) before U+05C8 (class 10 in Unicode 18): reordered here.
//! assert_eq!(normalize_key("x\u{5B1}\u{5C8}")?, "x\u{5C8}\u{5B1}");
//! # assert_eq!(unicode_normalization::UNICODE_VERSION, (18, 0, 0), "update the docs above");
//! # Ok::<(), syncguard::LockError>(())
//! ```

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest as _, Sha256};
use unicode_normalization::{IsNormalized, UnicodeNormalization as _, is_nfc_quick};

use crate::error::LockError;

/// The largest accepted user key, in UTF-8 bytes after NFC normalization.
pub const MAX_KEY_BYTES: usize = 512;

/// Normalizes `key` to Unicode NFC and checks it is a valid lock key: not empty and at most
/// [`MAX_KEY_BYTES`] UTF-8 bytes once normalized.
///
/// Every backend calls this before any I/O, so an invalid key never reaches storage.
/// Borrows when the key is already in NFC, which is the common case.
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for an empty or oversized key,
/// or one containing NUL
/// (U+0000): PostgreSQL cannot store it, and one rule holds for every backend.
#[inline]
pub fn normalize_key(key: &str) -> Result<Cow<'_, str>, LockError> {
    // The common case, inlined where keys are taken: ASCII is always in NFC, and telling it is
    // much cheaper than the quick check.
    if key.is_ascii()
        && !key.is_empty()
        && key.len() <= MAX_KEY_BYTES
        && !key.as_bytes().contains(&0)
    {
        return Ok(Cow::Borrowed(key));
    }
    normalize_other(key)
}

/// [`normalize_key`] for keys that are not plain ASCII of a valid length.
fn normalize_other(key: &str) -> Result<Cow<'_, str>, LockError> {
    let normalized = nfc(key);
    if normalized.is_empty() {
        return Err(LockError::invalid_argument("lock key must not be empty"));
    }
    if normalized.contains('\0') {
        return Err(LockError::invalid_argument(
            "lock key must not contain a NUL character (U+0000): PostgreSQL cannot store it, so no backend accepts it",
        ));
    }
    if normalized.len() > MAX_KEY_BYTES {
        return Err(LockError::invalid_argument(format!(
            "lock key is {} bytes after NFC normalization; the limit is {MAX_KEY_BYTES} bytes",
            normalized.len()
        )));
    }
    Ok(normalized)
}

fn nfc(value: &str) -> Cow<'_, str> {
    if value.is_ascii() {
        return Cow::Borrowed(value);
    }
    match is_nfc_quick(value.chars()) {
        IsNormalized::Yes => Cow::Borrowed(value),
        IsNormalized::No | IsNormalized::Maybe => {
            let normalized: String = value.nfc().collect();
            if normalized == value {
                Cow::Borrowed(value)
            } else {
                Cow::Owned(normalized)
            }
        }
    }
}

/// Derives the storage key for `key` under `prefix`, as the reference's `makeStorageKey`.
///
/// The result is `prefix:key` (or `key` when the prefix is empty) when that fits in
/// `limit_bytes - reserve_bytes`; otherwise the full prefixed key is hashed with SHA-256, the
/// first 16 bytes are encoded base64url without padding, and the result is `prefix:<hash>`.
/// Trailing colons of the prefix are ignored and the key is NFC-normalized first.
/// `reserve_bytes` keeps room for suffixes that backends derive from the storage key.
///
/// This does not apply the 512-byte user key limit; [`normalize_key`] does.
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) if `key` is empty, or if the
/// prefix plus the reserve leaves no room for a key.
pub fn make_storage_key(
    prefix: &str,
    key: &str,
    limit_bytes: usize,
    reserve_bytes: usize,
) -> Result<String, LockError> {
    if key.is_empty() {
        return Err(LockError::invalid_argument("lock key must not be empty"));
    }
    let key = nfc(key);
    let prefix = prefix.trim_end_matches(':');
    let separator = usize::from(!prefix.is_empty());
    if prefix.len() + separator + reserve_bytes > limit_bytes {
        return Err(LockError::invalid_argument(format!(
            "prefix of {} bytes leaves no room for keys within the backend's {limit_bytes}-byte limit; use a shorter prefix",
            prefix.len()
        )));
    }

    let prefixed = join(prefix, &key);
    if prefixed.len() + reserve_bytes <= limit_bytes {
        return Ok(prefixed);
    }

    let digest = Sha256::digest(prefixed.as_bytes());
    let hashed = join(prefix, &URL_SAFE_NO_PAD.encode(&digest[..16]));
    if hashed.len() + reserve_bytes > limit_bytes {
        return Err(LockError::invalid_argument(
            "key exceeds the backend's limit even after hashing; use a shorter prefix",
        ));
    }
    Ok(hashed)
}

/// Derives the fence counter key from a lock's *storage* key (the reference's two-step
/// derivation): `make_storage_key(prefix, "fence:" + storage_key, limit, reserve)`.
///
/// Deriving from the storage key rather than the user key keeps one counter per stored lock
/// even when long keys are hashed.
///
/// # Errors
/// As [`make_storage_key`].
pub fn make_fence_key(
    prefix: &str,
    storage_key: &str,
    limit_bytes: usize,
    reserve_bytes: usize,
) -> Result<String, LockError> {
    make_storage_key(
        prefix,
        &format!("fence:{storage_key}"),
        limit_bytes,
        reserve_bytes,
    )
}

fn join(prefix: &str, rest: &str) -> String {
    if prefix.is_empty() {
        rest.to_owned()
    } else {
        let mut out = String::with_capacity(prefix.len() + 1 + rest.len());
        out.push_str(prefix);
        out.push(':');
        out.push_str(rest);
        out
    }
}

/// The sanitized 24-hex-digit identifier the reference design logs and returns instead of raw
/// keys and lock ids.
///
/// It is three 32-bit polynomial hashes over the UTF-16 code units of the NFC-normalized
/// value. It is **not** cryptographic: it is for telemetry, logs and UIs only.
pub fn hash_key(value: &str) -> String {
    let (mut h1, mut h2, mut h3) = (0_i32, 0_i32, 0_i32);
    for unit in nfc(value).encode_utf16() {
        let c = i32::from(unit);
        h1 = h1.wrapping_shl(5).wrapping_sub(h1).wrapping_add(c);
        h2 = h2.wrapping_shl(7).wrapping_sub(h2).wrapping_add(c * 3);
        h3 = h3.wrapping_shl(11).wrapping_sub(h3).wrapping_add(c * 7);
    }
    // Reinterpreting as unsigned mirrors JavaScript's `>>> 0`.
    let mut out = String::with_capacity(24);
    for part in [h1 as u32, h2 as u32, h3 as u32] {
        for shift in (0..8).rev() {
            let nibble = (part >> (shift * 4)) & 0xf;
            out.push(char::from_digit(nibble, 16).unwrap_or('0'));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_oversized_keys_are_rejected() {
        assert!(normalize_key("").unwrap_err().code() == crate::ErrorCode::InvalidArgument);
        let max = "k".repeat(MAX_KEY_BYTES);
        assert_eq!(normalize_key(&max).unwrap(), max);
        let over = "k".repeat(MAX_KEY_BYTES + 1);
        let err = normalize_key(&over).unwrap_err();
        assert!(err.to_string().contains("513 bytes"), "{err}");
    }

    #[test]
    fn keys_with_nul_are_rejected_on_every_path() {
        for key in ["\0", "job:\0", "ключ\0", "\0e\u{301}"] {
            let err = normalize_key(key).unwrap_err();
            assert!(err.to_string().contains("NUL"), "{key:?}: {err}");
        }
    }

    #[test]
    fn limit_counts_normalized_bytes() {
        // 256 decomposed "é" are 768 bytes, but 512 once composed: accepted.
        let decomposed = "e\u{301}".repeat(256);
        assert_eq!(normalize_key(&decomposed).unwrap().len(), 512);
        assert!(matches!(normalize_key("é").unwrap(), Cow::Borrowed(_)));
    }

    #[test]
    fn prefix_too_long_is_rejected() {
        let prefix = "p".repeat(980);
        let err = make_storage_key(&prefix, "a", 1000, 26).unwrap_err();
        assert_eq!(err.code(), crate::ErrorCode::InvalidArgument);
        assert!(make_storage_key("p", "", 1000, 26).is_err());
    }

    #[test]
    fn trailing_colons_of_prefix_are_ignored() {
        assert_eq!(make_storage_key("sg::", "a", 100, 0).unwrap(), "sg:a");
    }
}
