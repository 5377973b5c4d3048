//! What a guard may believe about its lease: the local deadline by which the lock must be
//! assumed gone, derived only from what the backend can have done.
//!
//! The backend's expiry is set by the last extend it applied (*its own now + that extend's
//! ttl*). Extends are sent one at a time per guard, so an extend that succeeded was applied
//! after every earlier one that succeeded. Only an extend whose outcome is unknown (an error
//! or a timeout after it was sent) can still land later, at any time after it was sent, and
//! set the expiry to *then + its ttl*. Hence:
//!
//! - from the moment an extend is sent at `s` with ttl `t`, the expiry is at least the
//!   smaller of what it was and `s + t` (it may be applied at once);
//! - after it succeeded, the expiry is at least `s + min(t, u)`, where `u` is the shortest ttl
//!   of any unsettled extend so far (one that failed, timed out, or was abandoned in flight).
//!
//! Backends count whole milliseconds: a ttl's sub-millisecond part is dropped, and the time
//! an expiry is counted from is the backend's clock floored to the millisecond, up to 1 ms
//! before the moment it applied the request. So the guard drops the same part, and ends every
//! lease 1 ms before `s + t`.
//!
//! The deadline is never later than those bounds, nor than the backend's reported expiry
//! translated to the local clock. Every sum saturates: no duration a user passes can
//! overflow `Instant`.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::time::now_ms;
use crate::far_future::later;

/// Converts the backend's authoritative expiry into a local instant.
///
/// The offset between the time authority and the local clock is estimated from the acquire:
/// the backend computed `expires_at_ms - ttl` at some moment after the request was sent, so
/// `expires_at_ms - ttl - local_send_time` over-estimates the authority's lead. Over-estimating
/// makes every deadline early, never late.
#[derive(Debug, Clone, Copy)]
pub(super) struct LeaseClock {
    authority_lead_ms: i64,
}

impl LeaseClock {
    /// `sent_wall_ms`: the local wall clock when the acquire was sent.
    pub(super) fn calibrate(sent_wall_ms: u64, ttl: Duration, expires_at_ms: u64) -> Self {
        Self {
            authority_lead_ms: signed(expires_at_ms)
                .saturating_sub(signed_millis(ttl))
                .saturating_sub(signed(sent_wall_ms)),
        }
    }

    /// The local instant at which the authority's clock reads `expires_at_ms`; far in the
    /// future (not a panic) for an absurd expiry.
    fn local(self, expires_at_ms: u64) -> Instant {
        let authority_now = signed(now_ms()).saturating_add(self.authority_lead_ms);
        let left_ms = signed(expires_at_ms).saturating_sub(authority_now).max(0);
        later(
            Instant::now(),
            Duration::from_millis(left_ms.unsigned_abs()),
        )
    }
}

/// What the guard believes about its lease.
#[derive(Debug, Clone, Copy)]
pub(super) struct Belief {
    /// Local instant by which the lock must be assumed gone.
    pub(super) deadline: Instant,
    /// The latest authoritative expiry the backend reported (Unix ms of its time authority).
    pub(super) expires_at_ms: u64,
    /// The lease reaches the hold cap: it is the last one, and its end is the cap's doing.
    pub(super) reaches_cap: bool,
    /// The shortest ttl of any extend whose outcome is unknown.
    unsettled_ttl: Option<Duration>,
}

impl Belief {
    /// The lease of an acquire sent at `sent_at` for `ttl`. Its deadline is the ttl from the
    /// send: the clock was calibrated on this very lease, so its authoritative expiry says
    /// the same.
    pub(super) fn granted(sent_at: Instant, ttl: Duration, expires_at_ms: u64) -> Self {
        Self {
            deadline: lease_end(sent_at, ttl),
            expires_at_ms,
            reaches_cap: false,
            unsettled_ttl: None,
        }
    }

    /// An extend sent at `sent_at` for `ttl` succeeded with `expires_at_ms`.
    pub(super) fn extended(
        &mut self,
        clock: LeaseClock,
        sent_at: Instant,
        ttl: Duration,
        expires_at_ms: u64,
    ) {
        self.deadline = lease_end(sent_at, self.surely(ttl)).min(clock.local(expires_at_ms));
        self.expires_at_ms = expires_at_ms;
    }

    /// How long a lease granted now for `ttl` can surely last: an unsettled extend for less
    /// may still land and shorten it.
    pub(super) fn surely(&self, ttl: Duration) -> Duration {
        self.unsettled_ttl
            .map_or(ttl, |unsettled| unsettled.min(ttl))
    }

    /// An extend for `ttl` is sent now, at `sent_at`: the backend may apply it at once.
    pub(super) fn sending(&mut self, sent_at: Instant, ttl: Duration) {
        self.deadline = self.deadline.min(lease_end(sent_at, ttl));
    }

    /// An extend sent (see [`sending`](Self::sending)) for `ttl` failed, timed out or was
    /// abandoned: whether the backend applied it, or will, is unknown.
    pub(super) fn unsettled(&mut self, ttl: Duration) {
        self.unsettled_ttl = Some(self.unsettled_ttl.map_or(ttl, |shortest| shortest.min(ttl)));
    }
}

/// The end of a lease for `ttl` counted from `sent_at`, allowing for the backend's clock
/// being floored to the millisecond.
fn lease_end(sent_at: Instant, ttl: Duration) -> Instant {
    later(sent_at, ttl.saturating_sub(Duration::from_millis(1)))
}

/// `duration` in the whole milliseconds a backend counts (it drops the rest).
pub(super) fn whole_millis(duration: Duration) -> Duration {
    Duration::from_millis(millis(duration))
}

/// `duration` as a count of whole milliseconds, saturating.
pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn signed(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn signed_millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    fn granted_now() -> (Belief, LeaseClock, Instant) {
        let sent = Instant::now();
        let wall = now_ms();
        let clock = LeaseClock::calibrate(wall, TTL, wall + 10_000);
        (Belief::granted(sent, TTL, wall + 10_000), clock, sent)
    }

    #[test]
    fn deadline_never_later_than_ttl_from_send() {
        let sent = Instant::now();
        let wall = now_ms();
        // Authority clock 1 h ahead of ours: the ttl bound still applies.
        let clock = LeaseClock::calibrate(wall, TTL, wall + 3_600_000 + 10_000);
        let mut belief = Belief::granted(sent, TTL, wall + 3_600_000 + 10_000);
        belief.extended(clock, sent, TTL, wall + 3_600_000 + 10_000);
        assert!(belief.deadline <= sent + TTL);
        assert!(belief.deadline + Duration::from_millis(500) >= sent + TTL);
    }

    #[test]
    fn deadline_follows_a_shorter_authoritative_expiry() {
        let (mut belief, clock, sent) = granted_now();
        // A later extend reports an expiry only 2 s ahead (e.g. a shortened lease).
        belief.extended(clock, sent, TTL, now_ms() + 2_000);
        assert!(belief.deadline <= Instant::now() + Duration::from_millis(2_000));
        assert!(
            belief.deadline + Duration::from_millis(500) >= Instant::now() + Duration::from_secs(2)
        );
    }

    #[test]
    fn an_unsettled_short_extend_caps_this_and_every_later_deadline() {
        let (mut belief, clock, sent) = granted_now();
        // A manual extend for 200 ms whose reply was lost: it may have been applied.
        belief.sending(sent, Duration::from_millis(200));
        assert!(belief.deadline <= sent + Duration::from_millis(200));
        belief.unsettled(Duration::from_millis(200));
        assert!(belief.deadline <= sent + Duration::from_millis(200));
        // A later heartbeat extend for the full ttl succeeds, but the short one may still
        // land after it.
        let later_send = Instant::now();
        belief.sending(later_send, TTL);
        belief.extended(clock, later_send, TTL, now_ms() + 10_000);
        assert!(belief.deadline <= later_send + Duration::from_millis(200));
    }

    #[test]
    fn an_unsettled_long_extend_changes_nothing() {
        let (mut belief, _, sent) = granted_now();
        let before = belief.deadline;
        belief.sending(Instant::now(), TTL * 2);
        belief.unsettled(TTL * 2);
        assert_eq!(belief.deadline, before);
        assert!(belief.deadline <= sent + TTL);
    }

    #[test]
    fn an_extend_in_flight_caps_the_deadline_until_it_is_answered() {
        let (mut belief, clock, sent) = granted_now();
        let short = Duration::from_millis(5);
        belief.sending(sent, short);
        assert!(belief.deadline <= sent + short, "it may be applied at once");
        // Answered: the backend applied it, and nothing else can land after it.
        belief.extended(clock, sent, TTL, now_ms() + 10_000);
        assert!(belief.deadline > sent + short);
    }

    #[test]
    fn sub_millisecond_parts_are_dropped() {
        assert_eq!(
            whole_millis(Duration::from_micros(17_316)),
            Duration::from_millis(17)
        );
    }

    #[test]
    fn absurd_expiries_and_durations_saturate() {
        let clock = LeaseClock::calibrate(u64::MAX, Duration::MAX, u64::MAX);
        let now = Instant::now();
        assert!(clock.local(u64::MAX) > now);
        assert!(later(now, Duration::MAX) > now);
        let mut belief = Belief::granted(now, Duration::MAX, u64::MAX);
        belief.extended(clock, now, Duration::MAX, u64::MAX);
        belief.sending(now, Duration::MAX);
        belief.unsettled(Duration::MAX);
        assert!(belief.deadline > now);
        assert_eq!(whole_millis(Duration::MAX), Duration::from_millis(u64::MAX));
    }
}
