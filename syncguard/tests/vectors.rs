//! Key derivation and hashing match the reference implementation's outputs byte for byte
//! (`data/vectors.json`, copied from the reference design).

use serde_json::Value;
use syncguard::backend::key::{hash_key, make_fence_key, make_storage_key};

fn vectors() -> Value {
    serde_json::from_str(include_str!("data/vectors.json")).expect("vectors.json parses")
}

fn text<'a>(entry: &'a Value, field: &str) -> &'a str {
    entry[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} missing in {entry}"))
}

#[test]
fn hash_key_matches_reference() {
    let vectors = vectors();
    let entries = vectors["hashKey"].as_array().unwrap();
    assert!(entries.len() >= 20);
    for entry in entries {
        let input = text(entry, "input");
        assert_eq!(hash_key(input), text(entry, "hash"), "hashKey({input:?})");
    }
}

#[test]
fn storage_and_fence_keys_match_reference() {
    let vectors = vectors();
    let entries = vectors["storageKeys"].as_array().unwrap();
    let mut fence_checked = 0;
    for entry in entries {
        let prefix = text(entry, "prefix");
        let key = text(entry, "key");
        let limit = entry["limit"].as_u64().unwrap() as usize;
        let reserve = entry["reserve"].as_u64().unwrap() as usize;
        let backend = text(entry, "backend");
        let storage = make_storage_key(prefix, key, limit, reserve).unwrap();
        assert_eq!(
            storage,
            text(entry, "storageKey"),
            "{backend}: storage key of {key:?}"
        );
        if let Some(expected) = entry.get("fenceKey") {
            let fence = make_fence_key(prefix, &storage, limit, reserve).unwrap();
            assert_eq!(
                fence,
                expected.as_str().unwrap(),
                "{backend}: fence key of {key:?}"
            );
            fence_checked += 1;
        }
    }
    assert_eq!(entries.len(), 66);
    assert_eq!(fence_checked, 63);
}
