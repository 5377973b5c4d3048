//! How errors, logs and spans name a lock.

use std::fmt;

use crate::backend::key::hash_key;

/// The key hash by which errors, logs and spans name the lock on `key` (unless the holder
/// [shows the key](crate::LockOptionsBuilder::show_key)): compute it for a key you know to find
/// that key's lines. It is the reference design's sanitized hash (24 hex digits over the
/// NFC-normalized key), so TypeScript services log the same hash for the same key. Not
/// cryptographic: a hash hides a key from a casual reader, not from someone who can guess it.
///
/// ```
/// use syncguard::{LockName, key_hash};
///
/// let hash = key_hash("invoice:42");
/// assert_eq!(hash.len(), 24);
/// assert_eq!(LockName::new("invoice:42", false).to_string(), format!("key hash {hash}"));
/// ```
pub fn key_hash(key: &str) -> String {
    hash_key(key)
}

/// Which lock an error, a log line or a span is about: the sanitized hash of its key
/// ([`key_hash`]), and the key itself only when the holder opted in with
/// [`LockOptionsBuilder::show_key`](crate::LockOptionsBuilder::show_key) (keys may carry
/// personal data, so they are not shown by default).
///
/// ```
/// use syncguard::LockName;
///
/// let hidden = LockName::new("user:42:export", false);
/// assert_eq!(hidden.key(), None);
/// assert_eq!(hidden.to_string(), format!("key hash {}", hidden.key_hash()));
///
/// let shown = LockName::new("user:42:export", true);
/// assert_eq!(shown.to_string(), format!("\"user:42:export\" (key hash {})", shown.key_hash()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockName {
    key_hash: String,
    key: Option<String>,
}

impl LockName {
    /// The name of the lock on `key`, showing the key itself only with `show_key`.
    pub fn new(key: &str, show_key: bool) -> Self {
        Self {
            key_hash: hash_key(key),
            key: show_key.then(|| key.to_owned()),
        }
    }

    /// The sanitized hash of the key, as telemetry and the reference design report it.
    pub fn key_hash(&self) -> &str {
        &self.key_hash
    }

    /// The key, if the holder opted into showing it.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) => write!(f, "{key:?} (key hash {})", self.key_hash),
            None => write!(f, "key hash {}", self.key_hash),
        }
    }
}
