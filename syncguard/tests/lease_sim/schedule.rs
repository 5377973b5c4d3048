//! Schedules: what one seed makes of a run, and the random choices its clients draw.

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use syncguard::backend::time::MAX_TTL;
use syncguard::{Backoff, Jitter, LockOptions, LockOptionsBuilder, RetryPolicy};

use crate::faults::FaultProfile;
use crate::util::{ms, whole_ms};

#[derive(Debug)]
pub(crate) struct Schedule {
    pub(crate) keys: Vec<String>,
    pub(crate) faults: FaultProfile,
    /// The checker task wakes after 1 to this many milliseconds.
    pub(crate) check_every_ms: u64,
    /// Rounds (lock, hold, let go) of each client.
    pub(crate) rounds: Vec<u32>,
    pub(crate) client_seeds: Vec<u64>,
    pub(crate) fault_seed: u64,
    pub(crate) checker_seed: u64,
}

impl Schedule {
    pub(crate) fn generate(rng: &mut StdRng) -> Self {
        let clients = rng.random_range(1..=3);
        let keys = (0..rng.random_range(1..=2))
            .map(|k| format!("k{k}"))
            .collect();
        let faults = match rng.random_range(0..10) {
            0..2 => FaultProfile {
                latency_ms: 0,
                fault_rate: 0.0,
            },
            2..6 => FaultProfile {
                latency_ms: rng.random_range(0..=2),
                fault_rate: 0.02,
            },
            6..9 => FaultProfile {
                latency_ms: rng.random_range(0..=5),
                fault_rate: 0.1,
            },
            _ => FaultProfile {
                latency_ms: rng.random_range(0..=10),
                fault_rate: 0.3,
            },
        };
        let check_every_ms = [5, 50, 1_000][rng.random_range(0..3)];
        Self {
            keys,
            faults,
            check_every_ms,
            rounds: (0..clients).map(|_| rng.random_range(1..=4)).collect(),
            client_seeds: (0..clients).map(|_| rng.random()).collect(),
            fault_seed: rng.random(),
            checker_seed: rng.random(),
        }
    }
}

/// A lock's ttl: from the 1 ms minimum to minutes, sometimes with a sub-millisecond part
/// (which backends drop).
fn gen_ttl(rng: &mut StdRng) -> Duration {
    match rng.random_range(0..100) {
        0..5 => ms(1),
        5..25 => ms(rng.random_range(2..=20)),
        25..50 => ms(rng.random_range(20..=500)),
        50..80 => ms(rng.random_range(500..=10_000)),
        80..95 => ms(rng.random_range(10_000..=300_000)),
        _ => Duration::from_micros(rng.random_range(1_001..=20_000)),
    }
}

fn gen_retry(rng: &mut StdRng) -> RetryPolicy {
    // Jitter draws from the thread's random generator, not the seed: none keeps replays exact.
    let policy = RetryPolicy::new().with_jitter(Jitter::None);
    match rng.random_range(0..6) {
        0 => policy.with_max_retries(0),
        1 => policy,
        2 => policy
            .with_base_delay(Duration::ZERO)
            .with_max_retries(rng.random_range(1..=50)),
        // A timeout shorter than one delay.
        3 => policy
            .with_base_delay(Duration::from_secs(1))
            .with_timeout(ms(rng.random_range(0..=50))),
        4 => policy
            .with_backoff(Backoff::Fixed)
            .with_base_delay(ms(rng.random_range(1..=50)))
            .with_max_retries(u32::MAX)
            .with_timeout(ms(rng.random_range(0..=10_000))),
        _ => policy
            .with_base_delay(ms(rng.random_range(1..=200)))
            .with_max_retries(rng.random_range(0..=20))
            .with_timeout(ms(rng.random_range(0..=20_000))),
    }
}

fn gen_max_hold(rng: &mut StdRng, ttl: Duration) -> Option<Duration> {
    match rng.random_range(0..100) {
        0..35 => None,
        35..45 => Some(Duration::MAX),
        45..52 => Some(Duration::from_secs(u64::MAX / 2)),
        52..58 => Some(Duration::from_secs(100 * 365 * 24 * 3600)),
        58..66 => Some(Duration::from_micros(rng.random_range(0..=5_000))),
        _ => Some(whole_ms(ttl.mul_f64(rng.random_range(0.5..5.0)))),
    }
}

/// One round's lock: its key, and the options to build (which refuse an invalid ttl).
pub(crate) struct Plan {
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    pub(crate) options: LockOptionsBuilder,
}

pub(crate) fn gen_options(rng: &mut StdRng, keys: &[String]) -> Plan {
    let key = keys[rng.random_range(0..keys.len())].clone();
    // Now and then an invalid ttl, which must fail cleanly.
    let ttl = match rng.random_range(0..100) {
        0 => Duration::ZERO,
        1 => MAX_TTL + ms(1),
        _ => gen_ttl(rng),
    };
    let options = LockOptions::builder()
        .ttl(ttl)
        .retry(gen_retry(rng))
        .heartbeat(rng.random_bool(0.75));
    let options = match gen_max_hold(rng, ttl) {
        Some(max_hold) => options.max_hold(max_hold),
        None => options,
    };
    Plan { key, ttl, options }
}

/// A wait or a stall while holding: relative to the ttl, or absolute and long.
fn gen_wait(rng: &mut StdRng, ttl: Duration) -> Duration {
    match rng.random_range(0..100) {
        0..10 => Duration::ZERO,
        10..40 => ms(rng.random_range(1..=5)),
        40..75 => whole_ms(ttl.mul_f64(rng.random_range(0.0..1.5))),
        75..90 => whole_ms(ttl.mul_f64(rng.random_range(1.5..6.0))),
        90..97 => ms(rng.random_range(1_000..=120_000)),
        // Off the millisecond grid the timers tick on.
        _ => Duration::from_micros(rng.random_range(1..=3_000)),
    }
}

/// The ttl of a manual extend: the guard's, another, or an invalid one.
fn gen_extend_ttl(rng: &mut StdRng, ttl: Duration) -> Duration {
    match rng.random_range(0..100) {
        0..4 => Duration::ZERO,
        4..6 => MAX_TTL + ms(1),
        6..40 => ttl,
        40..70 => gen_ttl(rng),
        _ => whole_ms(ttl.mul_f64(rng.random_range(0.1..3.0))).max(ms(1)),
    }
}

/// Gaps between rounds.
pub(crate) fn gen_gap(rng: &mut StdRng) -> Duration {
    match rng.random_range(0..10) {
        0..4 => Duration::ZERO,
        4..8 => ms(rng.random_range(1..=50)),
        _ => ms(rng.random_range(100..=10_000)),
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Action {
    /// Await a timer: the heartbeat runs meanwhile.
    Sleep(Duration),
    /// Block the thread: the whole runtime jumps ahead, timers fire late.
    Stall(Duration),
    Extend(Duration),
    /// Two manual extends at once, racing each other and the heartbeat.
    ExtendPair(Duration, Duration),
    /// An extend in a task of its own, which may outlive this step (and the hold).
    SpawnExtend(Duration),
    /// Wait for the loss, up to a limit.
    WaitLost(Duration),
    Yield,
    /// Stop holding now.
    End,
}

pub(crate) fn gen_action(rng: &mut StdRng, ttl: Duration) -> Action {
    match rng.random_range(0..100) {
        0..30 => Action::Sleep(gen_wait(rng, ttl)),
        30..45 => Action::Stall(gen_wait(rng, ttl)),
        45..58 => Action::Extend(gen_extend_ttl(rng, ttl)),
        58..66 => Action::ExtendPair(gen_extend_ttl(rng, ttl), gen_extend_ttl(rng, ttl)),
        66..80 => Action::SpawnExtend(gen_extend_ttl(rng, ttl)),
        80..90 => Action::WaitLost(gen_wait(rng, ttl)),
        90..95 => Action::Yield,
        _ => Action::End,
    }
}
