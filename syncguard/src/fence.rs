//! Fencing tokens.

use std::fmt;
use std::str::FromStr;

use crate::LockError;

/// Fences above this value are refused with [`LockError::Internal`].
pub const FENCE_MAX: u64 = 900_000_000_000_000;
/// Fences above this value are accepted with a logged warning, an early signal to rotate keys.
pub const FENCE_WARN: u64 = 90_000_000_000_000;

/// A fencing token: a per-key counter that strictly increases with every acquisition of the
/// key, surviving releases, expiry and backend restarts.
///
/// Pass it to the resource the lock protects, and have the resource refuse writes that carry
/// a smaller fence than one it has already seen: a holder that stalled past its lease (and
/// lost the lock to a newer holder) is then refused instead of corrupting data.
///
/// Fences compare numerically, which is the same order as their 15-digit text form (the
/// format every SyncGuard backend stores and returns), so either can be stored.
///
/// ```
/// use syncguard::Fence;
///
/// let older: Fence = "000000000000041".parse()?;
/// let newer = Fence::new(42)?;
/// assert!(newer > older);
/// assert_eq!(newer.to_string(), "000000000000042");
/// assert_eq!(newer.get(), 42);
/// # Ok::<(), syncguard::LockError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(u64);

impl Fence {
    /// Checks a counter value read from a backend.
    ///
    /// # Errors
    /// [`LockError::Internal`] for 0 (counters start at 1) or for a value above [`FENCE_MAX`].
    /// Above [`FENCE_WARN`] a warning is logged.
    pub fn new(value: u64) -> Result<Self, LockError> {
        if value == 0 {
            return Err(LockError::internal(
                "fence counter returned 0; counters start at 1",
            ));
        }
        if value > FENCE_MAX {
            return Err(LockError::internal(format!(
                "fence {value:015} exceeds the safe maximum {FENCE_MAX:015}; rotate the key namespace"
            )));
        }
        if value > FENCE_WARN {
            tracing::warn!(
                fence = %format_args!("{value:015}"),
                "syncguard fence is approaching its maximum ({FENCE_MAX:015}); plan a key namespace rotation"
            );
        }
        Ok(Self(value))
    }

    /// The counter value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    /// The 15-digit zero-padded form, e.g. `000000000000001`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:015}", self.0)
    }
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fence({:015})", self.0)
    }
}

impl FromStr for Fence {
    type Err = LockError;

    /// Parses the 15-digit form, as stored by SyncGuard backends.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() != 15 || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(LockError::internal(format!(
                "stored fence {text:?} is not a 15-digit decimal"
            )));
        }
        let value = text
            .parse::<u64>()
            .map_err(|e| LockError::internal("stored fence is not a number").with_source(e))?;
        Self::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifteen_digits_and_ordering() {
        let a = Fence::new(9).unwrap();
        let b = Fence::new(10).unwrap();
        assert!(a < b);
        assert!(a.to_string() < b.to_string());
        assert_eq!(a.to_string(), "000000000000009");
        assert_eq!(b.to_string().len(), 15);
    }

    #[test]
    fn thresholds() {
        assert!(Fence::new(FENCE_MAX).is_ok());
        assert!(Fence::new(FENCE_WARN + 1).is_ok());
        let err = Fence::new(FENCE_MAX + 1).unwrap_err();
        assert_eq!(err.code(), crate::ErrorCode::Internal);
        assert_eq!(
            Fence::new(0).unwrap_err().code(),
            crate::ErrorCode::Internal
        );
    }

    #[test]
    fn parse_requires_fifteen_digits() {
        assert_eq!("000000000000007".parse::<Fence>().unwrap().get(), 7);
        for bad in [
            "7",
            "0000000000000007",
            "00000000000000a",
            "-00000000000007",
        ] {
            assert!(bad.parse::<Fence>().is_err(), "{bad}");
        }
        assert!("900000000000001".parse::<Fence>().is_err());
    }
}
