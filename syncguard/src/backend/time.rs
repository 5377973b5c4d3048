//! Time: the one liveness predicate, and ttl validation.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::LockError;

/// How long past its stored expiry a lock still counts as live, in milliseconds. Fixed (not
/// configurable) and the same for every backend, as in the reference design: it absorbs clock
/// differences so that a lock is never considered free while its holder may still think it
/// holds it.
pub const TIME_TOLERANCE_MS: u64 = 1000;

/// How far past the tolerance an expired lock must be before a cleanup deletes it, so that
/// cleanup can never race an extend that is renewing it. The same for every backend that
/// cleans up.
pub const CLEANUP_GUARD_MS: u64 = 2000;

/// The longest ttl accepted: one year. Longer leases are a misuse (use a heartbeat instead),
/// and the bound keeps every expiry well inside the integer range all backends store.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Whether a lock that expires at `expires_at_ms` is live at `now_ms` (both Unix
/// milliseconds, from the backend's time authority): `expires_at_ms > now_ms - 1000`.
///
/// This is the only place liveness is decided; every backend calls it (or, for scripts and
/// SQL that run on the server, embeds [`TIME_TOLERANCE_MS`] in the same comparison).
pub const fn is_live(expires_at_ms: u64, now_ms: u64) -> bool {
    expires_at_ms + TIME_TOLERANCE_MS > now_ms
}

/// The local wall clock in Unix milliseconds: the time authority of client-time backends.
pub fn now_ms() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    // Whole milliseconds, as `as_millis` gives them, without its 128-bit arithmetic (this is
    // read on every acquire and release).
    since_epoch
        .as_secs()
        .saturating_mul(1000)
        .saturating_add(u64::from(since_epoch.subsec_millis()))
}

/// Checks a ttl and converts it to whole milliseconds (sub-millisecond parts are dropped).
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a ttl under 1 ms or over
/// [`MAX_TTL`].
pub fn ttl_millis(ttl: Duration) -> Result<u64, LockError> {
    if ttl > MAX_TTL {
        return Err(LockError::invalid_argument(format!(
            "ttl of {ttl:?} is longer than the 365-day maximum; use a shorter ttl with a heartbeat"
        )));
    }
    match u64::try_from(ttl.as_millis()) {
        Ok(ms) if ms > 0 => Ok(ms),
        _ => Err(LockError::invalid_argument(format!(
            "ttl must be at least 1ms, got {ttl:?}"
        ))),
    }
}

/// Checks an absolute expiry (Unix ms, as [`LockBackend::expire_at`] takes it): at most
/// [`MAX_TTL`] past the local clock. Expiries in the past are valid: they leave a lock expired.
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for an expiry further ahead.
///
/// [`LockBackend::expire_at`]: crate::backend::LockBackend::expire_at
pub fn check_expiry(expires_at_ms: u64) -> Result<u64, LockError> {
    let latest = now_ms().saturating_add(ttl_millis(MAX_TTL)?);
    if expires_at_ms > latest {
        return Err(LockError::invalid_argument(format!(
            "expiry {expires_at_ms} (Unix ms) is more than the 365-day maximum ttl ahead"
        )));
    }
    Ok(expires_at_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_honours_the_tolerance() {
        let now = 10_000;
        assert!(is_live(now + 1, now));
        assert!(is_live(now, now));
        assert!(is_live(now - 999, now));
        assert!(!is_live(now - 1000, now));
        assert!(!is_live(now - 5000, now));
        // No underflow near the epoch.
        assert!(is_live(0, 500));
    }

    #[test]
    fn ttl_bounds() {
        assert_eq!(ttl_millis(Duration::from_millis(1)).unwrap(), 1);
        assert_eq!(ttl_millis(Duration::from_micros(1500)).unwrap(), 1);
        assert!(ttl_millis(Duration::ZERO).is_err());
        assert!(ttl_millis(Duration::from_micros(999)).is_err());
        assert!(ttl_millis(MAX_TTL).is_ok());
        assert!(ttl_millis(MAX_TTL + Duration::from_millis(1)).is_err());
    }
}
