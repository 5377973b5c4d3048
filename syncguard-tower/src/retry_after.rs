//! The `Retry-After` hint of a contended answer: when the holder is likely done, from the
//! holds this layer has seen end, bounded by the holder's lease and by a setting.
//!
//! A leaf module: it imports none of the others.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The default bound of the hint
/// ([`LockLayer::with_max_retry_after`](crate::LockLayer::with_max_retry_after)).
pub(crate) const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The shortest hint: a client is never told to come back at once.
const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How much the newest hold counts in the mean: 1/8, so that the mean follows a change of the
/// handlers' pace within a few dozen requests, and one outlier moves it by an eighth.
const WEIGHT_SHIFT: u32 = 3;

/// No hold has ended yet.
const NONE: u64 = u64::MAX;

/// How long the holds of one layer last: an exponentially weighted mean of the holds it ended
/// with a release (not those lost or dropped), in milliseconds.
#[derive(Debug)]
pub(crate) struct HoldTimes {
    mean_ms: AtomicU64,
}

impl Default for HoldTimes {
    fn default() -> Self {
        Self {
            mean_ms: AtomicU64::new(NONE),
        }
    }
}

impl HoldTimes {
    /// Counts a hold of `held` in the mean.
    pub(crate) fn record(&self, held: Duration) {
        let held_ms = u64::try_from(held.as_millis())
            .unwrap_or(NONE - 1)
            .min(NONE - 1);
        // One writer at a time per update; a lost race retries with the newer mean.
        let _ = self
            .mean_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| {
                Some(if mean == NONE {
                    held_ms
                } else {
                    // mean + (held - mean) / 8, in signed arithmetic.
                    let delta = (i128::from(held_ms) - i128::from(mean)) >> WEIGHT_SHIFT;
                    u64::try_from(i128::from(mean) + delta).unwrap_or(0)
                })
            });
    }

    /// The mean hold, once one has ended.
    pub(crate) fn mean(&self) -> Option<Duration> {
        match self.mean_ms.load(Ordering::Relaxed) {
            NONE => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }
}

/// The hint: `clamp(min(lease, likely), 1 s, max(max, 1 s))`, where
///
/// - `lease` = `lease_left`, the time until the holder's lease ends plus syncguard's 1 s
///   liveness tolerance, as the refusal reported it
///   ([`LockError::holder_lease_left`](syncguard::LockError::holder_lease_left)), at most the
///   ttl plus 1 s (a time authority whose clock is ahead of ours must not make an absurd
///   wait); what the holder may take without renewing its lease;
/// - `likely` = the mean hold, or `lease` while no hold of this layer has ended (how long the
///   holder has held the lock already is not known: no backend reports it with a refusal);
///
/// and 1 s when the refusal did not report the holder's expiry.
pub(crate) fn hint(
    lease_left: Option<Duration>,
    ttl: Duration,
    mean_hold: Option<Duration>,
    max: Duration,
) -> Duration {
    let Some(lease_left) = lease_left else {
        return MIN_RETRY_AFTER;
    };
    let tolerance = Duration::from_millis(syncguard::backend::time::TIME_TOLERANCE_MS);
    let lease = lease_left.min(ttl.saturating_add(tolerance));
    let likely = mean_hold.unwrap_or(lease);
    lease
        .min(likely)
        .clamp(MIN_RETRY_AFTER, max.max(MIN_RETRY_AFTER))
}

/// `hint` in whole seconds for `Retry-After`, rounded up.
pub(crate) fn whole_seconds(hint: Duration) -> u64 {
    hint.as_secs() + u64::from(hint.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);
    const MAX: Duration = Duration::from_secs(5);

    /// The lease left of a holder whose lease ends in `expires_in_ms` (its expiry, plus the
    /// 1 s tolerance), as `LockError::holder_lease_left` gives it.
    fn lease(expires_in_ms: u64) -> Option<Duration> {
        Some(Duration::from_millis(expires_in_ms + 1_000))
    }

    fn secs(hint: Duration) -> u64 {
        whole_seconds(hint)
    }

    #[test]
    fn without_a_known_hold_the_lease_bounded_by_the_setting() {
        assert_eq!(hint(None, TTL, None, MAX), MIN_RETRY_AFTER);
        // Expires in 2.5 s: live 3.5 s more, rounded up to 4.
        assert_eq!(secs(hint(lease(2_500), TTL, None, MAX)), 4);
        // A 30 s lease renewed by the heartbeat: the setting, not 31.
        assert_eq!(hint(lease(30_000), TTL, None, MAX), MAX);
        assert_eq!(
            hint(lease(30_000), TTL, None, Duration::from_secs(60)),
            Duration::from_secs(31)
        );
        // Already expired, inside the tolerance or past it.
        assert_eq!(secs(hint(lease(0), TTL, None, MAX)), 1);
        assert_eq!(hint(Some(Duration::ZERO), TTL, None, MAX), MIN_RETRY_AFTER);
        // A clock an hour ahead: the ttl plus the tolerance.
        let ahead = hint(lease(3_600_000), TTL, None, Duration::from_secs(3600));
        assert_eq!(ahead, Duration::from_secs(31));
        // A bound under a second is a second.
        assert_eq!(
            hint(lease(30_000), TTL, None, Duration::ZERO),
            MIN_RETRY_AFTER
        );
    }

    #[test]
    fn with_known_holds_the_mean_within_the_lease() {
        let mean = Some(Duration::from_millis(1_500));
        // A 1.5 s mean under a renewed 30 s lease: 1.5 s, rounded up to 2 (not 31).
        assert_eq!(secs(hint(lease(30_000), TTL, mean, MAX)), 2);
        // A mean under a second: come back in a second.
        let quick = Some(Duration::from_millis(200));
        assert_eq!(hint(lease(30_000), TTL, quick, MAX), MIN_RETRY_AFTER);
        // A mean longer than the setting: the setting.
        let long = Some(Duration::from_secs(60));
        assert_eq!(hint(lease(30_000), TTL, long, MAX), MAX);
        // A lease that ends before the likely end: the lease.
        assert_eq!(secs(hint(lease(1_000), TTL, long, MAX)), 2);
    }

    #[test]
    fn the_mean_starts_at_the_first_hold_and_moves_an_eighth() {
        let holds = HoldTimes::default();
        assert_eq!(holds.mean(), None);
        holds.record(Duration::from_millis(1_600));
        assert_eq!(holds.mean(), Some(Duration::from_millis(1_600)));
        holds.record(Duration::from_millis(0));
        assert_eq!(holds.mean(), Some(Duration::from_millis(1_400)));
        holds.record(Duration::from_millis(3_000));
        assert_eq!(holds.mean(), Some(Duration::from_millis(1_600)));
        holds.record(Duration::MAX);
        assert!(
            holds.mean().is_some(),
            "a huge hold is counted, not taken for none"
        );
    }

    #[test]
    fn whole_seconds_round_up() {
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2_001)), 3);
        assert_eq!(whole_seconds(Duration::from_millis(999)), 1);
    }
}
