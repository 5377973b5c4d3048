//! Where the Redis backend stores things, in either layout.
//!
//! **The reference layout** (the default): under a prefix `P`, a lock is at `P:<key>`, its
//! reverse index at `P:id:<lockId>` and its fence counter at `P:fence:P:<key>` (and, when a
//! derived key would be too long, at `P:<22-char hash>`). A user key is just text, so with that
//! layout alone the key `fence:P:x` lands on the fence counter of `x`, `id:<lock id>` on an
//! index key, and a key equal to a 22-character hash on a hashed key.
//!
//! Here such *reserved* keys (starting with `id:` or `fence:`, or exactly the base64url text of
//! 16 bytes, the shape of a hash) are stored under their hashed form `P:<hash of "P:key">`,
//! which is where the reference itself puts keys that are too long. Every other key is stored
//! exactly where the reference stores it. The namespaces are then disjoint: plain lock keys
//! never start with `id:` or `fence:` and are never hash-shaped, index keys start with `id:`,
//! fence keys with `fence:`, and hashed keys are hash-shaped (no colon), so two distinct keys
//! share a Redis key only through a SHA-256 collision.
//!
//! **The cluster layout**: a lock is at `P:{<tag>}` and its fence counter at `P:{<tag>}:fence`,
//! where the tag is the base64url text of the first 8 bytes of `sha256("P:key")`. Both are in
//! the tag's hash slot, so one script call on one node serves every operation. There is no
//! index: the lock id starts with the same 8 bytes (the other 8 are random), so a lock id
//! alone finds its lock. Two keys share a lock only if their hashes agree in 64 bits; they
//! then exclude each other (never two holders), with a chance of about 3 in 10^8 for a million
//! keys held at once.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest as _, Sha256};

use super::config::RedisLayout;
use crate::backend::key::{make_fence_key, make_storage_key};
use crate::error::LockError;
use crate::lock_id::LockId;

/// The reference's Redis key budget, in bytes.
pub(crate) const LIMIT_BYTES: usize = 1000;
/// The reference's reserve for derived keys (`":id:"` and a 22-character lock id).
pub(crate) const RESERVE_BYTES: usize = 26;

/// The key names of one prefix, in one layout.
#[derive(Debug)]
pub(crate) struct Layout {
    prefix: Box<str>,
    kind: RedisLayout,
    /// `P:id:`, the start of every index key (for the scripts that find an old lock's index);
    /// empty in the cluster layout, which has no index.
    index_prefix: Box<str>,
    /// `P:released`, the Pub/Sub channel of releases (channels are no keys: nothing is stored).
    release_channel: Box<str>,
}

/// The Redis keys an acquire writes, and the lock id it writes them under.
pub(crate) struct Placement {
    pub(crate) lock_key: String,
    /// `None` in the cluster layout.
    pub(crate) index_key: Option<String>,
    pub(crate) fence_key: String,
    pub(crate) lock_id: LockId,
}

/// Where an operation on an existing lock finds it: its lock key when known (the backend
/// took the lock, or the layout derives it from the lock id), and its index key in the
/// reference layout. At least one of the two is there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Located {
    pub(crate) lock_key: Option<String>,
    pub(crate) index_key: Option<String>,
}

impl Layout {
    /// The layout of a prefix already checked by `validate_prefix`.
    pub(crate) fn new(prefix: &str, kind: RedisLayout) -> Self {
        Self {
            prefix: prefix.into(),
            kind,
            index_prefix: match kind {
                RedisLayout::Reference => format!("{prefix}:id:").into(),
                RedisLayout::Cluster => "".into(),
            },
            release_channel: format!("{prefix}:released").into(),
        }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn kind(&self) -> RedisLayout {
        self.kind
    }

    /// `P:id:`, or empty in the cluster layout.
    pub(crate) fn index_prefix(&self) -> &str {
        &self.index_prefix
    }

    /// The channel releases are published on, and the subscriber listens to.
    pub(crate) fn release_channel(&self) -> &str {
        &self.release_channel
    }

    /// The Redis key of the lock on `key` (already NFC-normalized and validated).
    pub(crate) fn lock_key(&self, key: &str) -> Result<String, LockError> {
        match self.kind {
            RedisLayout::Reference if is_reserved(key) => Ok(self.hashed(key)),
            RedisLayout::Reference => {
                make_storage_key(&self.prefix, key, LIMIT_BYTES, RESERVE_BYTES)
            }
            RedisLayout::Cluster => Ok(self.tagged(self.head(key))),
        }
    }

    /// The fence counter key of a lock key (in the reference layout, the reference's two-step
    /// derivation).
    pub(crate) fn fence_key(&self, lock_key: &str) -> Result<String, LockError> {
        match self.kind {
            RedisLayout::Reference => {
                make_fence_key(&self.prefix, lock_key, LIMIT_BYTES, RESERVE_BYTES)
            }
            RedisLayout::Cluster => Ok(format!("{lock_key}:fence")),
        }
    }

    /// The reverse index key of a lock id; `None` in the cluster layout, which has none.
    pub(crate) fn index_key(&self, lock_id: &LockId) -> Result<Option<String>, LockError> {
        if self.kind == RedisLayout::Cluster {
            return Ok(None);
        }
        let mut id_key = String::with_capacity(3 + lock_id.as_str().len());
        id_key.push_str("id:");
        id_key.push_str(lock_id.as_str());
        make_storage_key(&self.prefix, &id_key, LIMIT_BYTES, RESERVE_BYTES).map(Some)
    }

    /// Everything an acquire of `key` (normalized and validated) writes, under a fresh lock id.
    pub(crate) fn place(&self, key: &str) -> Result<Placement, LockError> {
        let (lock_key, lock_id) = match self.kind {
            RedisLayout::Reference => (self.lock_key(key)?, LockId::generate()),
            RedisLayout::Cluster => {
                let head = self.head(key);
                (self.tagged(head), LockId::with_head(head))
            }
        };
        Ok(Placement {
            fence_key: self.fence_key(&lock_key)?,
            index_key: self.index_key(&lock_id)?,
            lock_key,
            lock_id,
        })
    }

    /// Where the lock of `lock_id` is found; `known` is its lock key when the backend took it.
    pub(crate) fn locate(
        &self,
        lock_id: &LockId,
        known: Option<String>,
    ) -> Result<Located, LockError> {
        Ok(match self.kind {
            RedisLayout::Reference => Located {
                lock_key: known,
                index_key: self.index_key(lock_id)?,
            },
            RedisLayout::Cluster => Located {
                lock_key: Some(self.tagged(lock_id.head())),
                index_key: None,
            },
        })
    }

    /// The first 8 bytes of `sha256("P:key")`: the cluster layout's tag, and the head of the
    /// lock ids of `key`.
    fn head(&self, key: &str) -> [u8; 8] {
        let digest = self.digest(key);
        let mut head = [0_u8; 8];
        head.copy_from_slice(&digest[..8]);
        head
    }

    /// `P:{<base64url(head)>}`: the cluster layout's lock key.
    fn tagged(&self, head: [u8; 8]) -> String {
        let mut out = String::with_capacity(self.prefix.len() + 2 + 11 + 1);
        out.push_str(&self.prefix);
        out.push_str(":{");
        URL_SAFE_NO_PAD.encode_string(head, &mut out);
        out.push('}');
        out
    }

    /// `P:<base64url(sha256("P:key")[..16])>`: the reference's hashed form, forced.
    fn hashed(&self, key: &str) -> String {
        let digest = self.digest(key);
        let mut out = String::with_capacity(self.prefix.len() + 1 + 22);
        out.push_str(&self.prefix);
        out.push(':');
        URL_SAFE_NO_PAD.encode_string(&digest[..16], &mut out);
        out
    }

    /// `sha256("P:key")`.
    fn digest(&self, key: &str) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(self.prefix.as_bytes());
        hasher.update(b":");
        hasher.update(key.as_bytes());
        hasher.finalize().into()
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
        let layout = Layout::new("syncguard", RedisLayout::Reference);
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
            Some(format!("syncguard:id:{}", id.as_str()))
        );
        assert_eq!(layout.index_prefix(), "syncguard:id:");
        assert_eq!(layout.release_channel(), "syncguard:released");
    }

    #[test]
    fn reserved_keys_are_hashed_like_long_keys() {
        let layout = Layout::new("syncguard", RedisLayout::Reference);
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
        let layout = Layout::new(&prefix, RedisLayout::Reference);
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
            Some(format!("{}{}", layout.index_prefix(), id.as_str()))
        );
    }

    #[test]
    fn the_cluster_layout_tags_every_key_of_a_lock_with_one_slot() {
        let layout = Layout::new("app", RedisLayout::Cluster);
        let placed = layout.place("job:42").unwrap();
        assert_eq!(placed.lock_key, layout.lock_key("job:42").unwrap());
        assert_eq!(placed.fence_key, format!("{}:fence", placed.lock_key));
        assert_eq!(placed.index_key, None);
        assert_eq!(layout.index_prefix(), "");
        // `app:{<11 characters>}`: the tag is all the slot is computed from.
        let tag = placed
            .lock_key
            .strip_prefix("app:{")
            .and_then(|rest| rest.strip_suffix('}'))
            .unwrap();
        assert_eq!(tag.len(), 11);
        assert!(!tag.contains(['{', '}']));
        // The lock id alone finds the lock; the key's locks differ in their random half.
        let located = layout.locate(&placed.lock_id, None).unwrap();
        assert_eq!(located.lock_key.as_deref(), Some(placed.lock_key.as_str()));
        assert_eq!(located.index_key, None);
        let again = layout.place("job:42").unwrap();
        assert_eq!(again.lock_key, placed.lock_key);
        assert_ne!(again.lock_id, placed.lock_id);
        // Other keys, and the same key under another prefix, go elsewhere.
        assert_ne!(layout.lock_key("job:43").unwrap(), placed.lock_key);
        let other = Layout::new("other", RedisLayout::Cluster);
        assert_ne!(
            other.lock_key("job:42").unwrap()["other:".len()..],
            placed.lock_key["app:".len()..]
        );
        // Reserved and long keys need no escaping: every lock key is a tag.
        for key in ["id:x", "fence:app:x", &"k".repeat(512)] {
            assert_eq!(layout.lock_key(key).unwrap().len(), "app:{}".len() + 11);
        }
    }

    #[test]
    fn the_reference_layout_finds_locks_of_others_through_the_index() {
        let layout = Layout::new("syncguard", RedisLayout::Reference);
        let placed = layout.place("job:42").unwrap();
        assert_eq!(placed.lock_key, "syncguard:job:42");
        let located = layout.locate(&placed.lock_id, None).unwrap();
        assert_eq!(located.lock_key, None);
        assert_eq!(located.index_key, placed.index_key);
        let known = layout
            .locate(&placed.lock_id, Some(placed.lock_key.clone()))
            .unwrap();
        assert_eq!(known.lock_key, Some(placed.lock_key));
    }
}
