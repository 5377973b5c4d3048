//! Holders: an identity stored with a lock, for services that lock on behalf of their clients.

use crate::error::LockError;

/// The longest holder, in bytes.
pub const MAX_HOLDER_BYTES: usize = 1024;

/// Checks a holder given to [`LockBackend::acquire_as`](super::LockBackend::acquire_as): 1 to
/// [`MAX_HOLDER_BYTES`] bytes, without NUL (some stores cannot keep it).
///
/// ```
/// use syncguard::backend::check_holder;
///
/// assert!(check_holder(r#"{"owner":"svc-a","instanceId":"w-1"}"#).is_ok());
/// assert!(check_holder("").is_err());
/// assert!(check_holder("a\0b").is_err());
/// ```
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) saying what is wrong.
pub fn check_holder(holder: &str) -> Result<(), LockError> {
    if holder.is_empty() {
        return Err(LockError::invalid_argument(
            "the lock holder is empty; give an identity of 1 to 1024 bytes",
        ));
    }
    if holder.len() > MAX_HOLDER_BYTES {
        return Err(LockError::invalid_argument(format!(
            "the lock holder is {} bytes long; at most {MAX_HOLDER_BYTES} are accepted",
            holder.len()
        )));
    }
    if holder.contains('\0') {
        return Err(LockError::invalid_argument(
            "the lock holder contains a NUL character, which not every store can keep",
        ));
    }
    Ok(())
}

/// The error of a backend that does not store holders.
pub(super) fn unsupported(backend: &str, operation: &str) -> LockError {
    LockError::invalid_argument(format!(
        "the {backend} backend does not store lock holders, so it has no `{operation}`; use a backend whose capabilities().holders is true"
    ))
}
