//! The documents as stored: lock and fence counter documents, field for field as the
//! reference design writes them (plus the lock's optional `holder`), their ids, and a document
//! as read with its precondition.

use firestore::FirestoreDb;
use firestore::FirestoreWritePrecondition;
use firestore::errors::FirestoreError;
use firestore::gcloud_sdk::google::firestore::v1::Document;
use firestore::timestamp_utils::from_timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::config::{MAX_ID_BYTES, id_problem};
use crate::backend::LockInfo;
use crate::backend::key::{make_fence_key, make_storage_key};
use crate::error::LockError;
use crate::fence::Fence;
use crate::lock_id::LockId;

/// A lock document, field for field as the reference stores it, plus `holder`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct LockDocument {
    pub(super) lock_id: String,
    pub(super) expires_at_ms: Millis,
    pub(super) acquired_at_ms: Millis,
    pub(super) key: String,
    pub(super) fence: String,
    /// Who took the lock with `acquire_as`; absent (never `null`) for a lock taken without a
    /// holder, as in every document the reference writes: such a lock is re-entered by no one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) holder: Option<String>,
}

/// The largest expiry an extend by an amount writes: the largest integer a JavaScript number
/// (the reference reads `expiresAtMs` as one) holds exactly.
pub(super) const MAX_EXPIRES_MS: u64 = (1 << 53) - 1;

/// A fence counter document.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct FenceDocument {
    pub(super) fence: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) key_debug: Option<String>,
}

/// Unix milliseconds, written as a Firestore integer and read from an integer or (as a
/// JavaScript client may write it) a whole double.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Millis(pub(super) u64);

impl Serialize for Millis {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Expiries are bounded by now + MAX_TTL, far inside i64.
        serializer.serialize_i64(i64::try_from(self.0).unwrap_or(i64::MAX))
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Millis;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a non-negative whole number of milliseconds")
            }
            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<Millis, E> {
                Ok(Millis(value))
            }
            fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<Millis, E> {
                u64::try_from(value)
                    .map(Millis)
                    .map_err(|_| E::custom("negative milliseconds"))
            }
            fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<Millis, E> {
                if value.is_finite()
                    && value >= 0.0
                    && value.fract() == 0.0
                    && value < 2f64.powi(63)
                {
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    Ok(Millis(value as u64))
                } else {
                    Err(E::custom(
                        "milliseconds must be a whole non-negative number",
                    ))
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// The lock and fence document ids of a (valid, normalized) key.
pub(super) fn document_ids(key: &str) -> Result<(String, String), LockError> {
    let lock_doc = make_storage_key("", key, MAX_ID_BYTES, 0)?;
    if let Some(problem) = id_problem(&lock_doc) {
        return Err(LockError::invalid_argument(format!(
            "key {key:?} cannot be a Firestore document id: {problem}; use another separator \
             (for example ':')"
        )));
    }
    let fence_doc = make_fence_key("", &lock_doc, MAX_ID_BYTES, 0)?;
    Ok((lock_doc, fence_doc))
}

impl LockDocument {
    /// The stored lock id, checked.
    pub(super) fn parsed_lock_id(&self) -> Result<LockId, LockError> {
        LockId::parse(&self.lock_id).map_err(|error| {
            LockError::internal(format!(
                "a Firestore lock document holds a malformed lockId: {error}"
            ))
        })
    }

    /// The stored fence, checked.
    pub(super) fn parsed_fence(&self) -> Result<Fence, LockError> {
        Fence::new(parse_fence(&self.fence)?)
    }

    /// Whether an `acquire_as` by `holder` (`None`: a plain acquire) re-enters this lock:
    /// only when it was taken by that same holder. A lock without holder (taken by a plain
    /// acquire, or written by the reference) is re-entered by no one.
    pub(super) fn reentered_by(&self, holder: Option<&str>) -> bool {
        holder.is_some() && self.holder.as_deref() == holder
    }

    /// The public view of a stored, live lock document.
    pub(super) fn into_info(self) -> Result<LockInfo, LockError> {
        let lock_id = self.parsed_lock_id()?;
        let fence = self.parsed_fence()?;
        Ok(LockInfo::new(
            self.key,
            lock_id,
            self.expires_at_ms.0,
            self.acquired_at_ms.0,
            fence,
        )
        .with_holder(self.holder))
    }
}

/// A document as read: its id, its data, and the precondition that it is unchanged since.
pub(super) struct Found<T> {
    pub(super) id: String,
    pub(super) data: T,
    pub(super) unchanged: FirestoreWritePrecondition,
}

impl<T: serde::de::DeserializeOwned> Found<T> {
    pub(super) fn from_document(document: &Document) -> Result<Self, FirestoreError> {
        let id = document
            .name
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let data = FirestoreDb::deserialize_doc_to::<T>(document)?;
        Ok(Self {
            id,
            data,
            unchanged: unchanged_since(Some(document))?,
        })
    }
}

/// The precondition that a document is as it was read (`None`: that it still does not exist).
pub(super) fn unchanged_since(
    document: Option<&Document>,
) -> Result<FirestoreWritePrecondition, FirestoreError> {
    match document.and_then(|document| document.update_time) {
        Some(update_time) => Ok(FirestoreWritePrecondition::UpdateTime(from_timestamp(
            update_time,
        )?)),
        None => Ok(FirestoreWritePrecondition::Exists(false)),
    }
}

/// Parses a stored fence counter (15-digit decimal text) without going through floats.
pub(super) fn parse_fence(text: &str) -> Result<u64, LockError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LockError::internal(format!(
            "a Firestore fence holds {text:?}, not a decimal counter; the fence documents were \
             changed by something other than syncguard"
        )));
    }
    text.parse::<u64>().map_err(|error| {
        LockError::internal(format!(
            "a Firestore fence counter {text:?} is out of range"
        ))
        .with_source(error)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_parse_exactly() {
        assert_eq!(parse_fence("000000000000042").unwrap(), 42);
        assert_eq!(parse_fence("899999999999999").unwrap(), 899_999_999_999_999);
        for bad in ["", "-1", "1e3", "12.0", " 1"] {
            assert!(parse_fence(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            format!("{:015}", 900_000_000_000_000_u64),
            "900000000000000"
        );
    }

    #[test]
    fn only_the_same_holder_reenters() {
        let lock = |holder: Option<&str>| LockDocument {
            lock_id: LockId::generate().as_str().to_owned(),
            expires_at_ms: Millis(2),
            acquired_at_ms: Millis(1),
            key: "k".to_owned(),
            fence: "000000000000001".to_owned(),
            holder: holder.map(str::to_owned),
        };
        assert!(lock(Some("a")).reentered_by(Some("a")));
        assert!(!lock(Some("a")).reentered_by(Some("b")));
        assert!(!lock(Some("a")).reentered_by(Some("a ")));
        assert!(!lock(Some("a")).reentered_by(None));
        assert!(!lock(None).reentered_by(Some("a")));
        assert!(!lock(None).reentered_by(None));
    }

    #[test]
    fn the_holder_is_optional_and_absent_when_none() {
        let reference = serde_json::json!({
            "lockId": "AAAAAAAAAAAAAAAAAAAAAA",
            "expiresAtMs": 2,
            "acquiredAtMs": 1,
            "key": "k",
            "fence": "000000000000001",
        });
        let read: LockDocument = serde_json::from_value(reference.clone()).unwrap();
        assert_eq!(read.holder, None);
        assert_eq!(
            serde_json::to_value(&read).unwrap(),
            reference,
            "no holder written"
        );
        let mut with_holder = reference.clone();
        with_holder["holder"] = serde_json::json!("client-a");
        let read: LockDocument = serde_json::from_value(with_holder.clone()).unwrap();
        assert_eq!(read.holder.as_deref(), Some("client-a"));
        assert_eq!(serde_json::to_value(&read).unwrap(), with_holder);
        with_holder["holder"] = serde_json::Value::Null;
        let read: LockDocument = serde_json::from_value(with_holder).unwrap();
        assert_eq!(read.holder, None, "null is no holder");
    }

    #[test]
    fn keys_with_slashes_are_refused_before_io() {
        assert!(document_ids("a/b").is_err());
        let (lock, fence) = document_ids("job:42").unwrap();
        assert_eq!(lock, "job:42");
        assert_eq!(fence, "fence:job:42");
    }
}
