//! "Never", as a time: far enough ahead never to come, near enough for every clock to
//! represent. A deadline that a user's duration reaches (a wait of `Duration::MAX`, a campaign
//! that waits for ever, an absurd expiry) saturates here instead of overflowing `Instant`.

use std::time::Duration;

use tokio::time::Instant;

/// About a century: longer than any wait, lease or hold, yet an `Instant` that far ahead is
/// representable on every platform.
pub(crate) const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// `at + by`, saturating [`FAR_FUTURE`] ahead instead of overflowing.
pub(crate) fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by.min(FAR_FUTURE))
        .or_else(|| at.checked_add(FAR_FUTURE))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_saturate_in_the_far_future() {
        let now = Instant::now();
        assert_eq!(
            later(now, Duration::from_secs(3)),
            now + Duration::from_secs(3)
        );
        assert_eq!(later(now, Duration::MAX), now + FAR_FUTURE);
    }
}
