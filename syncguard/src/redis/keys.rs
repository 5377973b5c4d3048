//! Where the Redis backend stores things: the reference layout, plus the escaping that keeps
//! user keys out of the index and fence namespaces.
//!
//! Under a prefix `P`, the reference layout puts a lock at `P:<key>`, its reverse index at
//! `P:id:<lockId>` and its fence counter at `P:fence:P:<key>` (and, when a derived key would be
//! too long, at `P:<22-char hash>`). A user key is just text, so with that layout alone the key
//! `fence:P:x` lands on the fence counter of `x`, `id:<lock id>` on an index key, and a key
//! equal to a 22-character hash on a hashed key.
//!
//! Here such *reserved* keys (starting with `id:` or `fence:`, or exactly the base64url text of
//! 16 bytes, the shape of a hash) are stored under their hashed form `P:<hash of "P:key">`,
//! which is where the reference itself puts keys that are too long. Every other key is stored
//! exactly where the reference stores it. The namespaces are then disjoint: plain lock keys
//! never start with `id:` or `fence:` and are never hash-shaped, index keys start with `id:`,
//! fence keys with `fence:`, and hashed keys are hash-shaped (no colon), so two distinct keys
//! share a Redis key only through a SHA-256 collision.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest as _, Sha256};

use crate::backend::key::{make_fence_key, make_storage_key};
use crate::error::LockError;
use crate::lock_id::LockId;

/// The reference's Redis key budget, in bytes.
pub(crate) const LIMIT_BYTES: usize = 1000;
/// The reference's reserve for derived keys (`":id:"` and a 22-character lock id).
pub(crate) const RESERVE_BYTES: usize = 26;

/// The key names of one prefix.
#[derive(Debug)]
pub(crate) struct Layout {
    prefix: Box<str>,
    /// `P:id:`, the start of every index key (for the scripts that find an old lock's index).
    index_prefix: Box<str>,
    /// `P:released`, the Pub/Sub channel of releases (channels are no keys: nothing is stored).
    release_channel: Box<str>,
}

impl Layout {
    /// The layout of a prefix already checked by `validate_prefix`.
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.into(),
            index_prefix: format!("{prefix}:id:").into(),
            release_channel: format!("{prefix}:released").into(),
        }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn index_prefix(&self) -> &str {
        &self.index_prefix
    }

    /// The channel releases are published on, and the subscriber listens to.
    pub(crate) fn release_channel(&self) -> &str {
        &self.release_channel
    }

    /// The Redis key of the lock on `key` (already NFC-normalized and validated).
    pub(crate) fn lock_key(&self, key: &str) -> Result<String, LockError> {
        if is_reserved(key) {
            Ok(self.hashed(key))
        } else {
            make_storage_key(&self.prefix, key, LIMIT_BYTES, RESERVE_BYTES)
        }
    }

    /// The fence counter key of a lock key (the reference's two-step derivation).
    pub(crate) fn fence_key(&self, lock_key: &str) -> Result<String, LockError> {
        make_fence_key(&self.prefix, lock_key, LIMIT_BYTES, RESERVE_BYTES)
    }

    /// The reverse index key of a lock id.
    pub(crate) fn index_key(&self, lock_id: &LockId) -> Result<String, LockError> {
        let mut id_key = String::with_capacity(3 + lock_id.as_str().len());
        id_key.push_str("id:");
        id_key.push_str(lock_id.as_str());
        make_storage_key(&self.prefix, &id_key, LIMIT_BYTES, RESERVE_BYTES)
    }

    /// `P:<base64url(sha256("P:key")[..16])>`: the reference's hashed form, forced.
    fn hashed(&self, key: &str) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.prefix.as_bytes());
        hasher.update(b":");
        hasher.update(key.as_bytes());
        let digest = hasher.finalize();
        let mut out = String::with_capacity(self.prefix.len() + 1 + 22);
        out.push_str(&self.prefix);
        out.push(':');
        URL_SAFE_NO_PAD.encode_string(&digest[..16], &mut out);
        out
    }
}

/// Whether a (normalized) user key would, stored verbatim, land in the index or fence namespace
/// or on a hashed key.
pub(crate) fn is_reserved(key: &str) -> bool {
    key.starts_with("id:") || key.starts_with("fence:") || is_hash_shaped(key)
}

/// Exactly 22 base64url characters that decode to 16 bytes (the last character then carries
/// two bits followed by four zero bits: one of `A`, `Q`, `g`, `w`).
fn is_hash_shaped(key: &str) -> bool {
    let bytes = key.as_bytes();
    bytes.len() == 22
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && matches!(bytes[21], b'A' | b'Q' | b'g' | b'w')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_keys_use_the_reference_layout() {
        let layout = Layout::new("syncguard");
        for key in [
            "job:42",
            "x",
            "fence",
            "idx:1",
            "ids:2",
            "a:id:b",
            "fencing:1",
        ] {
            let lock = layout.lock_key(key).unwrap();
            assert_eq!(lock, make_storage_key("syncguard", key, 1000, 26).unwrap());
            assert_eq!(
                layout.fence_key(&lock).unwrap(),
                make_fence_key("syncguard", &lock, 1000, 26).unwrap()
            );
        }
        let id = LockId::generate();
        assert_eq!(
            layout.index_key(&id).unwrap(),
            format!("syncguard:id:{}", id.as_str())
        );
        assert_eq!(layout.index_prefix(), "syncguard:id:");
        assert_eq!(layout.release_channel(), "syncguard:released");
    }

    #[test]
    fn reserved_keys_are_hashed_like_long_keys() {
        let layout = Layout::new("syncguard");
        let hashed_len = "syncguard:".len() + 22;
        let id = LockId::generate();
        for key in [
            "fence:syncguard:x".to_owned(),
            format!("id:{}", id.as_str()),
            "id:".to_owned(),
            "fence:".to_owned(),
            id.as_str().to_owned(),
        ] {
            let lock = layout.lock_key(&key).unwrap();
            assert_eq!(lock.len(), hashed_len, "{key}");
            assert!(!lock["syncguard:".len()..].contains(':'));
        }
        // The forced hash is the reference's hash of the prefixed key: a key too long for the
        // budget hashes to the same place in both implementations.
        let long = format!("fence:{}", "k".repeat(1000));
        assert_eq!(
            layout.lock_key(&long).unwrap(),
            make_storage_key("syncguard", &long, 1000, 26).unwrap()
        );
    }

    #[test]
    fn hash_shape() {
        let id = LockId::generate();
        assert!(is_hash_shaped(id.as_str()));
        assert!(!is_hash_shaped("AAAAAAAAAAAAAAAAAAAAAB"));
        assert!(!is_hash_shaped("AAAAAAAAAAAAAAAAAAAAA"));
        assert!(!is_hash_shaped("AAAAAAAAAAAAAAAAAAAA:A"));
        // Every hash the reference produces is hash-shaped.
        for key in ["a", "b", "job:1"] {
            let long = format!("{key}{}", "x".repeat(990));
            let stored = make_storage_key("syncguard", &long, 1000, 26).unwrap();
            assert!(is_hash_shaped(&stored["syncguard:".len()..]), "{stored}");
        }
    }

    #[test]
    fn the_longest_prefix_and_key_never_hash() {
        let prefix = "p".repeat(super::super::config::MAX_PREFIX_BYTES);
        let layout = Layout::new(&prefix);
        let key = "k".repeat(crate::backend::key::MAX_KEY_BYTES);
        let lock = layout.lock_key(&key).unwrap();
        assert_eq!(lock, format!("{prefix}:{key}"));
        assert_eq!(
            layout.fence_key(&lock).unwrap(),
            format!("{prefix}:fence:{lock}")
        );
        let id = LockId::generate();
        assert_eq!(
            layout.index_key(&id).unwrap(),
            format!("{}{}", layout.index_prefix(), id.as_str())
        );
    }
}
