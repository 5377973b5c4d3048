//! Small helpers the simulation shares: a mutex lock that ignores poisoning, and durations in
//! milliseconds.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Whole milliseconds: time then stays on the timer wheel's grid unless a schedule leaves it
/// on purpose.
pub(crate) fn whole_ms(duration: Duration) -> Duration {
    ms(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}
