//! What the network backends' configurations share about their timeouts: each must be at
//! least a millisecond, checked when a backend is made, naming the setter.

use std::time::Duration;

use crate::error::LockError;

/// Checks `timeouts` (setter name, value) of the configuration type `config`.
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) naming the first timeout under 1 ms, as `Config::setter`.
pub(crate) fn check_timeouts(config: &str, timeouts: &[(&str, Duration)]) -> Result<(), LockError> {
    for &(setter, timeout) in timeouts {
        if timeout < Duration::from_millis(1) {
            return Err(LockError::invalid_argument(format!(
                "{config}::{setter} must be at least 1ms, got {timeout:?}"
            )));
        }
    }
    Ok(())
}
