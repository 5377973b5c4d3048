//! How long and how often to retry an acquire while the lock is held by someone else.

use std::time::Duration;

/// How the delay between acquire attempts grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backoff {
    /// The base delay doubles after every attempt.
    Exponential,
    /// Every delay is the base delay.
    Fixed,
}

/// How much randomness is mixed into each delay, so that waiters do not retry in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Jitter {
    /// Half the delay is kept, the other half is random: between 50 % and 100 % of it.
    Equal,
    /// Anywhere between zero and the whole delay.
    Full,
    /// The delay as computed.
    None,
}

/// Waiting for a lock: how many attempts, how far apart, and for how long in total.
///
/// Giving up is [`ErrorCode::AcquisitionTimeout`](crate::ErrorCode::AcquisitionTimeout), or
/// [`ErrorCode::Contended`](crate::ErrorCode::Contended) when the policy allowed no wait.
/// [`wait_for`](Self::wait_for) is the usual way to say "wait up to this long".
///
/// # Default
/// The reference design's recommended policy:
///
/// | setting | default |
/// |---|---|
/// | [`max_retries`](Self::with_max_retries) | 10 (11 attempts in all) |
/// | [`base_delay`](Self::with_base_delay) | 100 ms |
/// | [`backoff`](Self::with_backoff) | [`Backoff::Exponential`] |
/// | [`jitter`](Self::with_jitter) | [`Jitter::Equal`] |
/// | [`timeout`](Self::with_timeout) | 5 s |
/// | [`wake_on_release`](Self::with_wake_on_release) | on |
///
/// # Waking on release
/// On a backend that announces releases (see
/// [`LockBackend::release_notifier`](crate::backend::LockBackend::release_notifier)), a
/// waiter also wakes when the lock is released, and when the holder's lease ends (learnt from
/// the refused attempt); the delays above then only bound how long it sleeps when nothing is
/// announced (an expiry, a peer that does not publish, a lost announcement). Attempts made on
/// an announcement do not use up retries. The waiters of one key in one process take turns in
/// arrival order: only the first tries on an announcement, and a newcomer queues behind them
/// instead of trying first; a waiter that becomes first because the one ahead took the lock
/// counts its pending delay from then. [`with_wake_on_release(false)`](Self::with_wake_on_release)
/// polls at the delays alone.
///
/// ```
/// use std::time::Duration;
/// use syncguard::{Backoff, Jitter, RetryPolicy};
///
/// let patient = RetryPolicy::new()
///     .with_timeout(Duration::from_secs(60))
///     .with_max_retries(u32::MAX)
///     .with_backoff(Backoff::Fixed)
///     .with_jitter(Jitter::None);
/// let delays: Vec<_> = patient.delays().take(2).collect();
/// assert_eq!(delays, [Duration::from_millis(100); 2]);
///
/// let once = RetryPolicy::single_attempt();
/// assert_eq!(once.max_retries(), 0);
/// ```
///
/// # Edge cases
/// Every value is accepted, and none can overflow:
/// - **No retries** ([`single_attempt`](Self::single_attempt), or `with_max_retries(0)`):
///   one attempt, whatever the timeout.
/// - **A zero timeout**: one attempt, whatever the retries.
/// - **Short delays**: every delay is at least 1 ms, so a zero base delay retries at once
///   without spinning on the backend.
/// - **Long delays**: a delay that would pass the timeout is cut short, and a last attempt
///   is made at the timeout. So a timeout shorter than the base delay gives two attempts:
///   the first, and one at the timeout.
/// - **Huge values** (`Duration::MAX`, `u32::MAX` retries) saturate: exponential growth stops
///   at the largest delay, and the timeout still ends the wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    max_retries: u32,
    base_delay: Duration,
    backoff: Backoff,
    jitter: Jitter,
    timeout: Duration,
    wake_on_release: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// The default policy (see the table above).
    pub const fn new() -> Self {
        Self {
            max_retries: 10,
            base_delay: Duration::from_millis(100),
            backoff: Backoff::Exponential,
            jitter: Jitter::Equal,
            timeout: Duration::from_secs(5),
            wake_on_release: true,
        }
    }

    /// One attempt: contention fails at once, with
    /// [`ErrorCode::Contended`](crate::ErrorCode::Contended).
    pub const fn single_attempt() -> Self {
        Self::new().with_max_retries(0)
    }

    /// Waits up to `wait` for a held lock, retrying as often as the delays allow (exponential
    /// from 100 ms, equal jitter) until then; a zero `wait` is one attempt.
    ///
    /// ```
    /// use std::time::Duration;
    /// use syncguard::RetryPolicy;
    ///
    /// let policy = RetryPolicy::wait_for(Duration::from_secs(30));
    /// assert_eq!(policy.timeout(), Duration::from_secs(30));
    /// assert_eq!(policy.max_retries(), u32::MAX);
    /// assert_eq!(RetryPolicy::wait_for(Duration::ZERO), RetryPolicy::single_attempt().with_timeout(Duration::ZERO));
    /// ```
    pub const fn wait_for(wait: Duration) -> Self {
        let retries = if wait.is_zero() { 0 } else { u32::MAX };
        Self::new().with_max_retries(retries).with_timeout(wait)
    }

    /// Retries after the first attempt (`u32::MAX` to retry until the timeout).
    pub const fn with_max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = max_retries;
        self
    }

    /// The delay before the first retry.
    pub const fn with_base_delay(mut self, base_delay: Duration) -> Self {
        self.base_delay = base_delay;
        self
    }

    /// How delays grow.
    pub const fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How delays are randomized.
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The total time to keep trying, first attempt included.
    pub const fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether a waiter also wakes when the lock is released (see the type's docs); on by
    /// default, `false` to poll at the delays alone.
    pub const fn with_wake_on_release(mut self, wake_on_release: bool) -> Self {
        self.wake_on_release = wake_on_release;
        self
    }

    /// Whether a waiter also wakes when the lock is released.
    pub const fn wake_on_release(&self) -> bool {
        self.wake_on_release
    }

    /// Retries after the first attempt.
    pub const fn max_retries(&self) -> u32 {
        self.max_retries
    }

    /// The delay before the first retry.
    pub const fn base_delay(&self) -> Duration {
        self.base_delay
    }

    /// How delays grow.
    pub const fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// How delays are randomized.
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The total time to keep trying.
    pub const fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The delays before each retry, in order, jitter applied, each at least 1 ms; not yet
    /// clamped to the timeout (the waiting loop does that).
    pub fn delays(&self) -> impl Iterator<Item = Duration> + use<> {
        let policy = *self;
        (0..policy.max_retries).map(move |retry| {
            let delay = match policy.backoff {
                Backoff::Fixed => policy.base_delay,
                Backoff::Exponential => policy
                    .base_delay
                    .saturating_mul(2_u32.saturating_pow(retry)),
            };
            policy.jitter.apply(delay).max(SHORTEST_DELAY)
        })
    }
}

/// The shortest delay between two attempts: retrying sooner would only load the backend.
const SHORTEST_DELAY: Duration = Duration::from_millis(1);

impl Jitter {
    /// `delay` randomized, in whole nanoseconds (no floating point that could overflow).
    fn apply(self, delay: Duration) -> Duration {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        match self {
            Self::None => delay,
            Self::Equal => {
                let kept = nanos - nanos / 2;
                Duration::from_nanos(kept + rand::random_range(0..=nanos / 2))
            }
            Self::Full => Duration::from_nanos(rand::random_range(0..=nanos)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_without_jitter_doubles() {
        let policy = RetryPolicy::new().with_jitter(Jitter::None);
        let delays: Vec<u128> = policy.delays().map(|d| d.as_millis()).collect();
        assert_eq!(
            delays,
            [100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 51200]
        );
    }

    #[test]
    fn equal_jitter_keeps_half() {
        for delay in RetryPolicy::new().delays().take(5).zip(0..) {
            let (d, n) = delay;
            let full = Duration::from_millis(100) * 2_u32.pow(n);
            assert!(d >= full / 2 && d <= full, "{d:?} vs {full:?}");
        }
    }

    #[test]
    fn full_jitter_stays_below_delay() {
        let policy = RetryPolicy::new()
            .with_backoff(Backoff::Fixed)
            .with_jitter(Jitter::Full);
        let delays: Vec<_> = policy.delays().collect();
        assert_eq!(delays.len(), 10);
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(100)));
    }

    #[test]
    fn delays_are_at_least_a_millisecond() {
        for jitter in [Jitter::None, Jitter::Equal, Jitter::Full] {
            let policy = RetryPolicy::new()
                .with_base_delay(Duration::ZERO)
                .with_jitter(jitter);
            let delays: Vec<_> = policy.delays().collect();
            assert_eq!(delays.len(), 10);
            assert!(delays.iter().all(|d| *d == SHORTEST_DELAY), "{delays:?}");
        }
    }

    #[test]
    fn huge_delays_saturate_with_every_jitter() {
        for jitter in [Jitter::None, Jitter::Equal, Jitter::Full] {
            let policy = RetryPolicy::new()
                .with_base_delay(Duration::MAX)
                .with_max_retries(u32::MAX)
                .with_jitter(jitter);
            for delay in policy.delays().take(40) {
                assert!(delay >= SHORTEST_DELAY);
            }
        }
    }

    #[test]
    fn unlimited_retries_do_not_overflow() {
        let policy = RetryPolicy::new()
            .with_max_retries(u32::MAX)
            .with_jitter(Jitter::None);
        // Saturates at 100 ms × u32::MAX (about 13 years) instead of overflowing.
        let late = policy.delays().nth(100).unwrap();
        assert_eq!(late, Duration::from_millis(100) * u32::MAX);
    }
}
