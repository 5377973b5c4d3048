//! What the checks share: keys of their own, and the assertions they repeat.

use std::time::Duration;

use crate::backend::{Lease, LockBackend};
use crate::error::{ErrorCode, LockError};
use crate::lock_id::LockId;

/// A key no other check (or earlier run) uses.
pub fn unique_key(label: &str) -> String {
    format!("conformance:{label}:{}", LockId::generate())
}

pub(crate) async fn acquired<B: LockBackend>(backend: &B, key: &str, ttl: Duration) -> Lease {
    match backend.acquire(key, ttl).await {
        Ok(outcome) => match outcome.lease() {
            Some(lease) => lease,
            None => panic!("expected to acquire {key:?}, it is contended"),
        },
        Err(error) => panic!("expected to acquire {key:?}, got {error}"),
    }
}

pub(crate) async fn assert_contended<B: LockBackend>(backend: &B, key: &str) {
    let outcome = backend
        .acquire(key, Duration::from_secs(10))
        .await
        .expect("acquire");
    assert!(
        outcome.is_contended(),
        "{key:?} should be held: {outcome:?}"
    );
}

pub(crate) fn assert_code<T: std::fmt::Debug>(
    result: Result<T, LockError>,
    code: ErrorCode,
    what: &str,
) {
    match result {
        Err(error) => assert_eq!(error.code(), code, "{what}: {error}"),
        Ok(value) => panic!("{what}: expected {code} error, got {value:?}"),
    }
}
