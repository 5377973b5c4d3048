//! What the table holds under one key hash: the key's fence counter and its stored locks.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::backend::time::is_live;
use crate::fence::Fence;
use crate::lock_id::LockId;

/// A table keyed by hashes computed beforehand.
pub(super) type ByHash<V> = HashMap<u64, V, BuildHasherDefault<KnownHash>>;

/// What one hash holds: the last fence of its key, and its stored lock in `first`. Distinct
/// keys that collide on all 64 bits share the counter and store their further locks in
/// `collided` (an empty `Vec` allocates nothing), which is empty whenever `first` is.
pub(super) struct Slot {
    pub(super) fence: u64,
    pub(super) first: Option<Held>,
    pub(super) collided: Vec<Held>,
}

pub(super) struct Held {
    pub(super) key: StoredKey,
    pub(super) lock_id: LockId,
    pub(super) expires_at_ms: u64,
    pub(super) acquired_at_ms: u64,
    pub(super) fence: Fence,
    /// Who took it, with `acquire_as`.
    pub(super) holder: Option<Box<str>>,
}

/// A held lock's key: inline up to [`INLINE_KEY`] bytes (an idempotency key with its prefix
/// fits), which spares an allocation and a free per lock; on the heap beyond.
pub(super) enum StoredKey {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<str>),
}

pub(super) const INLINE_KEY: usize = 62;

impl StoredKey {
    pub(super) fn new(key: &str) -> Self {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE_KEY => {
                let mut bytes = [0; INLINE_KEY];
                bytes[..key.len()].copy_from_slice(key.as_bytes());
                Self::Inline { len, bytes }
            }
            _ => Self::Heap(key.into()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(key) => key.as_bytes(),
        }
    }

    /// The key (stored from a `&str`, so always UTF-8).
    pub(super) fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    /// Whether this is `key` (compared as bytes: no UTF-8 check on the hot path).
    pub(super) fn is(&self, key: &str) -> bool {
        self.as_bytes() == key.as_bytes()
    }

    pub(super) fn to_owned_string(&self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }
}

/// The hasher of the tables whose keys already are hashes.
#[derive(Default)]
pub(super) struct KnownHash(u64);

impl Hasher for KnownHash {
    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are `u64`); fold anything else all the same.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Hashes the lock ids of the reverse index. Every id in it was drawn from a CSPRNG here, so
/// its bytes are already uniformly random and folding them spreads the table as well as
/// SipHash would, at a fraction of the cost.
#[derive(Default)]
pub(super) struct LockIdHasher(u64);

impl Hasher for LockIdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0_u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn finish(&self) -> u64 {
        // The multiplications mix upwards; fold the high half into the low bits, which pick
        // the bucket.
        self.0 ^ (self.0 >> 32)
    }
}

impl Slot {
    pub(super) fn locks(&self) -> impl Iterator<Item = &Held> {
        self.first.iter().chain(&self.collided)
    }

    pub(super) fn locks_mut(&mut self) -> impl Iterator<Item = &mut Held> {
        self.first.iter_mut().chain(&mut self.collided)
    }

    pub(super) fn store(&mut self, held: Held) {
        match self.first {
            None => self.first = Some(held),
            Some(_) => self.collided.push(held),
        }
    }
}

impl Held {
    pub(super) fn is_live(&self, now: u64) -> bool {
        is_live(self.expires_at_ms, now)
    }
}

/// The stored lock under `hash` that `is_it` picks (by key, or by lock id: an explicit
/// ownership check even though the index points here).
pub(super) fn find_lock(
    keys: &mut ByHash<Slot>,
    hash: u64,
    is_it: impl Fn(&Held) -> bool,
) -> Option<&mut Held> {
    keys.get_mut(&hash)?.locks_mut().find(|held| is_it(held))
}

/// Removes the stored lock `lock_id` holds under `hash` (not its index entry); the slot keeps
/// the fence counter.
pub(super) fn take_lock(keys: &mut ByHash<Slot>, hash: u64, lock_id: &LockId) -> Option<Held> {
    let slot = keys.get_mut(&hash)?;
    if slot
        .first
        .as_ref()
        .is_some_and(|held| held.lock_id == *lock_id)
    {
        let next = slot.collided.pop();
        return std::mem::replace(&mut slot.first, next);
    }
    let index = slot
        .collided
        .iter()
        .position(|held| held.lock_id == *lock_id)?;
    Some(slot.collided.swap_remove(index))
}
