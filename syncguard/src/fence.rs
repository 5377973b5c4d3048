//! Fencing tokens.

use std::fmt;
use std::str::FromStr;

use crate::error::LockError;

/// The largest fence as a number: `Fence::MAX.get()`, with `u64` arithmetic in `const`s.
const MAX: u64 = 900_000_000_000_000;
const WARN: u64 = 90_000_000_000_000;

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
/// With the `serde` feature, a fence serializes as its 15-digit string in human-readable
/// formats (JSON, YAML, TOML: `"000000000000042"`, the reference design's form, which sorts
/// as text the way fences sort as numbers) and as a `u64` in compact ones (bincode, postcard).
/// Human-readable formats read back either the 15-digit string or a number (`42`, safe in
/// JavaScript: the maximum is below 2^53). Zero, values above [`Fence::MAX`], negative or
/// fractional numbers and strings that are not 15 digits are refused with an error saying
/// what a fence is.
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
    /// The largest fence: counters above it are refused with
    /// [`ErrorCode::Internal`](crate::ErrorCode::Internal). Below 2^53, so that JavaScript reads
    /// every fence exactly.
    pub const MAX: Self = Self(MAX);

    /// Fences above this one are accepted with a logged warning, an early signal to rotate
    /// the key namespace.
    pub const WARN: Self = Self(WARN);

    /// Checks a counter value read from a backend.
    ///
    /// # Errors
    /// [`ErrorCode::Internal`](crate::ErrorCode::Internal) for 0 (counters start at 1) or for a
    /// value above [`Fence::MAX`]. Above [`Fence::WARN`] a warning is logged.
    pub fn new(value: u64) -> Result<Self, LockError> {
        if value == 0 {
            return Err(LockError::internal(
                "fence counter returned 0; counters start at 1",
            ));
        }
        if value > MAX {
            return Err(LockError::internal(format!(
                "fence {value:015} exceeds the safe maximum {MAX:015}; rotate the key namespace"
            )));
        }
        if value > WARN {
            tracing::warn!(
                fence = %format_args!("{value:015}"),
                "syncguard fence is approaching its maximum ({MAX:015}); plan a key namespace rotation"
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

#[cfg(feature = "serde")]
mod serde_impl {
    use std::fmt;

    use serde::de::{self, Deserialize, Deserializer, Unexpected, Visitor};
    use serde::ser::{Serialize, Serializer};

    use super::{Fence, MAX};

    /// What a fence looks like, for error messages.
    const EXPECTED: &str =
        "a fence: a number from 1 to 900000000000000, or its 15-digit zero-padded string";

    impl Serialize for Fence {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            if serializer.is_human_readable() {
                serializer.collect_str(self)
            } else {
                serializer.serialize_u64(self.0)
            }
        }
    }

    impl<'de> Deserialize<'de> for Fence {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            if deserializer.is_human_readable() {
                deserializer.deserialize_any(FenceVisitor)
            } else {
                deserializer.deserialize_u64(FenceVisitor)
            }
        }
    }

    struct FenceVisitor;

    impl<'de> Visitor<'de> for FenceVisitor {
        type Value = Fence;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(EXPECTED)
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<Fence, E> {
            // Not `Fence::new`: a value read back was checked when the backend returned it,
            // so it is not warned about again.
            if (1..=MAX).contains(&value) {
                Ok(Fence(value))
            } else {
                Err(E::invalid_value(Unexpected::Unsigned(value), &self))
            }
        }

        fn visit_i64<E: de::Error>(self, value: i64) -> Result<Fence, E> {
            match u64::try_from(value) {
                Ok(value) => self.visit_u64(value),
                Err(_) => Err(E::invalid_value(Unexpected::Signed(value), &self)),
            }
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Fence, E> {
            let invalid = || E::invalid_value(Unexpected::Str(text), &self);
            if text.len() != 15 || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            let value = text.parse::<u64>().map_err(|_| invalid())?;
            if (1..=MAX).contains(&value) {
                Ok(Fence(value))
            } else {
                Err(invalid())
            }
        }
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
        assert!(Fence::new(MAX).is_ok());
        assert!(Fence::new(WARN + 1).is_ok());
        let err = Fence::new(MAX + 1).unwrap_err();
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

#[cfg(all(test, feature = "serde"))]
mod serde_tests {
    use super::*;

    #[test]
    fn json_uses_the_fifteen_digit_string_and_reads_numbers_too() {
        let fence = Fence::new(42).unwrap();
        assert_eq!(
            serde_json::to_string(&fence).unwrap(),
            r#""000000000000042""#
        );
        let back: Fence = serde_json::from_str(r#""000000000000042""#).unwrap();
        assert_eq!(back, fence);
        let number: Fence = serde_json::from_str("42").unwrap();
        assert_eq!(number, fence);
        let max: Fence = serde_json::from_str("900000000000000").unwrap();
        assert_eq!(max.get(), MAX);
        let max: Fence = serde_json::from_str(r#""900000000000000""#).unwrap();
        assert_eq!(max.get(), MAX);

        // Inside a struct, as an application would store one.
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Write {
            fence: Fence,
        }
        let write = Write { fence };
        let json = serde_json::to_string(&write).unwrap();
        assert_eq!(json, r#"{"fence":"000000000000042"}"#);
        assert_eq!(serde_json::from_str::<Write>(&json).unwrap(), write);
    }

    #[test]
    fn json_refuses_what_is_not_a_fence() {
        for bad in [
            "0",
            "900000000000001",
            "18446744073709551615",
            "-1",
            "4.2",
            "true",
            "null",
            r#""42""#,
            r#""000000000000000""#,
            r#""900000000000001""#,
            r#""0000000000000042""#,
            r#""00000000000004a""#,
            r#""-00000000000042""#,
        ] {
            let error = serde_json::from_str::<Fence>(bad).unwrap_err().to_string();
            assert!(
                error.contains("a number from 1 to 900000000000000"),
                "{bad}: {error}"
            );
        }
        let error = serde_json::from_str::<Fence>("900000000000001")
            .unwrap_err()
            .to_string();
        assert!(error.contains("900000000000001"), "{error}");
    }

    /// A compact (not human-readable) format, as bincode or postcard are: the fence is a
    /// `u64` both ways.
    #[test]
    fn compact_formats_use_the_number() {
        use serde::de::value::{Error, U64Deserializer};
        use serde::de::{Deserialize, Deserializer, IntoDeserializer, Visitor};

        struct Compact(u64);
        impl<'de> Deserializer<'de> for Compact {
            type Error = Error;
            fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                let plain: U64Deserializer<Error> = self.0.into_deserializer();
                plain.deserialize_any(visitor)
            }
            fn is_human_readable(&self) -> bool {
                false
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
                byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
                struct enum identifier ignored_any
            }
        }
        assert_eq!(Fence::deserialize(Compact(7)).unwrap().get(), 7);
        assert!(Fence::deserialize(Compact(0)).is_err());
        assert!(Fence::deserialize(Compact(MAX + 1)).is_err());
    }
}
