//! A history of the holds of one key, and the check a correct lock passes on it, after
//! Jepsen's fenced-mutex checker.
//!
//! Each holder records its hold: the fence it got, when it got it, every moment it acted on
//! the protected resource *while its guard said the lock was held*, and how the hold ended.
//! [`History::check`] then verifies, over the whole run (faults, restarts and all):
//!
//! - **no two holders at once**: the spans between the first and last action of two holds
//!   never overlap;
//! - **fences order the holders**: in the order holders acted, their fences strictly increase
//!   (so a resource that refuses lower fences never refuses the current holder);
//! - **no fence repeats**, across releases, expiry and restarts.
//!
//! Times are instants of one process's monotonic clock: the holders whose histories are
//! checked together (several backend instances, as several processes would use) run in one
//! test process.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use tokio::time::Instant;

use crate::error::LostReason;
use crate::fence::Fence;

/// One acquisition, as its holder saw it.
#[derive(Debug, Clone)]
pub struct Hold {
    /// Who held it (for the report), e.g. `"instance 1, worker 3"`.
    pub holder: String,
    /// The fence of the acquisition.
    pub fence: Fence,
    /// When the acquisition returned.
    pub acquired: Instant,
    /// When the holder acted on the resource, each time with its guard saying the lock was
    /// held (checked after taking the instant: a loss is final, so the lock was held then).
    pub actions: Vec<Instant>,
    /// Why the hold ended in a loss, if it did.
    pub lost: Option<LostReason>,
}

/// The holds of one key, recorded by any number of holders at once.
#[derive(Debug, Default)]
pub struct History {
    holds: Mutex<Vec<Hold>>,
}

/// What [`History::check`] found in a correct history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// Holds recorded.
    pub holds: usize,
    /// Holds that acted on the resource.
    pub acting: usize,
    /// Actions on the resource.
    pub actions: usize,
    /// Holds that ended in a loss.
    pub lost: usize,
}

/// What [`History::check`] found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violations(pub Vec<String>);

impl fmt::Display for Violations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} violations of the lock's guarantees:", self.0.len())?;
        for violation in &self.0 {
            writeln!(f, "- {violation}")?;
        }
        Ok(())
    }
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a hold that has ended.
    pub fn record(&self, hold: Hold) {
        self.holds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(hold);
    }

    /// The holds recorded so far.
    pub fn holds(&self) -> Vec<Hold> {
        self.holds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Checks the guarantees (see the module documentation).
    ///
    /// # Errors
    /// Every violation found, described with the holders, fences and times (from the first
    /// acquisition) involved.
    pub fn check(&self) -> Result<Checked, Violations> {
        let holds = self.holds();
        let origin = holds.iter().map(|hold| hold.acquired).min();
        let at = |instant: Instant| {
            origin.map_or(0.0, |origin| {
                instant.saturating_duration_since(origin).as_secs_f64() * 1000.0
            })
        };
        let mut violations = Vec::new();

        let mut by_fence: HashMap<Fence, &Hold> = HashMap::new();
        for hold in &holds {
            if let Some(first) = by_fence.insert(hold.fence, hold) {
                violations.push(format!(
                    "fence {} was granted twice: to {} at {:.1} ms and to {} at {:.1} ms",
                    hold.fence,
                    first.holder,
                    at(first.acquired),
                    hold.holder,
                    at(hold.acquired)
                ));
            }
        }

        let mut acting: Vec<(&Hold, Instant, Instant)> = holds
            .iter()
            .filter_map(|hold| {
                let first = *hold.actions.iter().min()?;
                let last = *hold.actions.iter().max()?;
                Some((hold, first, last))
            })
            .collect();
        acting.sort_by_key(|(_, first, _)| *first);
        for pair in acting.windows(2) {
            let [(earlier, _, earlier_last), (later, later_first, _)] = pair else {
                continue;
            };
            // Equal instants are not an overlap: under a paused or coarse clock a release and
            // the next acquisition can share one.
            if earlier_last > later_first {
                violations.push(format!(
                    "two holders at once: {} (fence {}) acted until {:.1} ms, {} (fence {}) from {:.1} ms",
                    earlier.holder,
                    earlier.fence,
                    at(*earlier_last),
                    later.holder,
                    later.fence,
                    at(*later_first)
                ));
            }
            if earlier.fence >= later.fence {
                violations.push(format!(
                    "fences out of order: {} acted with fence {} before {} with fence {}",
                    earlier.holder, earlier.fence, later.holder, later.fence
                ));
            }
        }

        if !violations.is_empty() {
            return Err(Violations(violations));
        }
        Ok(Checked {
            holds: holds.len(),
            acting: acting.len(),
            actions: acting.iter().map(|(hold, ..)| hold.actions.len()).sum(),
            lost: holds.iter().filter(|hold| hold.lost.is_some()).count(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn hold(holder: &str, fence: u64, start: Instant, actions: &[u64]) -> Hold {
        Hold {
            holder: holder.to_owned(),
            fence: Fence::new(fence).unwrap(),
            acquired: start,
            actions: actions
                .iter()
                .map(|ms| start + Duration::from_millis(*ms))
                .collect(),
            lost: None,
        }
    }

    #[test]
    fn a_correct_history_passes() {
        let t = Instant::now();
        let history = History::new();
        history.record(hold("a", 1, t, &[0, 5, 9]));
        history.record(hold("b", 2, t, &[10, 20]));
        history.record(hold("c", 3, t, &[]));
        history.record(hold("d", 4, t, &[21]));
        let checked = history.check().unwrap();
        assert_eq!(
            checked,
            Checked {
                holds: 4,
                acting: 3,
                actions: 6,
                lost: 0
            }
        );
    }

    #[test]
    fn overlapping_holders_are_caught() {
        let t = Instant::now();
        let history = History::new();
        history.record(hold("a", 1, t, &[0, 15]));
        history.record(hold("b", 2, t, &[10, 20]));
        let violations = history.check().unwrap_err().to_string();
        assert!(violations.contains("two holders at once"), "{violations}");
    }

    #[test]
    fn repeated_and_reordered_fences_are_caught() {
        let t = Instant::now();
        let history = History::new();
        history.record(hold("a", 5, t, &[0]));
        history.record(hold("b", 5, t, &[10]));
        history.record(hold("c", 4, t, &[20]));
        let violations = history.check().unwrap_err().0;
        assert!(
            violations.iter().any(|v| v.contains("granted twice")),
            "{violations:?}"
        );
        assert!(
            violations.iter().any(|v| v.contains("out of order")),
            "{violations:?}"
        );
    }
}
