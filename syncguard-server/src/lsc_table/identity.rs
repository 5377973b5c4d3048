//! Keys, holders and lock ids of the LSC-table mode: key `namespace:lockName`, holder the
//! server's `{"owner","instanceId"}`, lock id derived from the four identity columns.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use syncguard::{LockError, LockId};

use crate::holder;

/// LSC's column limit (`VARCHAR(255)`, in characters).
const MAX_COLUMN_CHARS: usize = 255;

/// A key as `(namespace, lockName)`: split at the first `:`.
pub(super) fn split_key(key: &str) -> Result<(&str, &str), LockError> {
    let Some((namespace, lock_name)) = key.split_once(':') else {
        return Err(LockError::invalid_argument(
            "the LSC-table backend takes keys `namespace:lockName`",
        ));
    };
    column("namespace", namespace)?;
    column("lock name", lock_name)?;
    Ok((namespace, lock_name))
}

fn column(what: &str, value: &str) -> Result<(), LockError> {
    if value.is_empty() || value.chars().count() > MAX_COLUMN_CHARS {
        return Err(LockError::invalid_argument(format!(
            "the LSC table's {what} must have 1 to {MAX_COLUMN_CHARS} characters"
        )));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Pair {
    owner: String,
    #[serde(rename = "instanceId")]
    instance_id: String,
}

/// A holder the server wrote ([`holder::encode`]) as `(owner, instanceId)`.
pub(super) fn split_holder(encoded: &str) -> Result<(String, String), LockError> {
    syncguard::backend::check_holder(encoded)?;
    let pair: Pair = serde_json::from_str(encoded).map_err(|_| {
        LockError::invalid_argument(
            "the LSC-table backend takes syncguard-server holders ({\"owner\",\"instanceId\"})",
        )
    })?;
    // Only the canonical spelling: equal pairs must be equal holders.
    if holder::encode(&pair.owner, &pair.instance_id) != encoded {
        return Err(LockError::invalid_argument(
            "the holder is not in syncguard-server's canonical form",
        ));
    }
    column("owner", &pair.owner)?;
    column("instanceId", &pair.instance_id)?;
    Ok((pair.owner, pair.instance_id))
}

/// The holder shown for a row's owner and instance id.
pub(super) fn holder_of(owner: &str, instance_id: &str) -> String {
    holder::encode(owner, instance_id)
}

/// The lock id of a row: base64url of the first 16 bytes of SHA-256 over
/// `namespace \0 lockName \0 owner \0 instanceId` (the SQL's `derived_id` computes the same).
pub(super) fn derive_lock_id(
    namespace: &str,
    lock_name: &str,
    owner: &str,
    instance_id: &str,
) -> Result<LockId, LockError> {
    let mut hasher = Sha256::new();
    for (index, part) in [namespace, lock_name, owner, instance_id]
        .into_iter()
        .enumerate()
    {
        if index > 0 {
            hasher.update([0_u8]);
        }
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    LockId::parse(&URL_SAFE_NO_PAD.encode(&digest[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert_eq!(split_key("ns1:a:b").unwrap(), ("ns1", "a:b"));
        assert!(split_key("no-colon").is_err());
        assert!(split_key(":name").is_err());
        assert!(split_key(&format!("ns:{}", "x".repeat(256))).is_err());
    }

    #[test]
    fn holders() {
        let encoded = holder::encode("anonymous", "worker-1");
        assert_eq!(
            split_holder(&encoded).unwrap(),
            ("anonymous".to_owned(), "worker-1".to_owned())
        );
        assert!(split_holder("worker-1").is_err());
        assert!(split_holder(r#"{ "owner":"a","instanceId":"b"}"#).is_err());
    }

    #[test]
    fn lock_ids_are_derived() {
        let id = derive_lock_id("ns", "name", "anonymous", "worker-1").unwrap();
        assert_eq!(id.as_str().len(), 22);
        assert_eq!(
            id,
            derive_lock_id("ns", "name", "anonymous", "worker-1").unwrap()
        );
        assert_ne!(
            id,
            derive_lock_id("ns", "name", "anonymous", "worker-2").unwrap()
        );
        // The separator keeps the parts apart.
        assert_ne!(
            derive_lock_id("ab", "c", "o", "i").unwrap(),
            derive_lock_id("a", "bc", "o", "i").unwrap()
        );
    }
}
