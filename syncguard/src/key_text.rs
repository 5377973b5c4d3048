//! The key a guard holds, inline when short.

use std::fmt;

use arrayvec::ArrayString;

/// The longest key stored inline; longer ones are kept in a `String`.
const INLINE: usize = 62;

/// A lock key as a guard keeps it: inline when short (most keys are), so that making a key
/// from its parts and keeping it for the life of the lock allocates nothing.
#[derive(Clone)]
pub struct KeyText(Repr);

#[derive(Clone)]
enum Repr {
    Inline(ArrayString<INLINE>),
    Heap(String),
}

impl KeyText {
    /// `parts` one after the other.
    pub fn concat(parts: &[&str]) -> Self {
        let len: usize = parts.iter().map(|part| part.len()).sum();
        if len <= INLINE {
            let mut text = ArrayString::new();
            for part in parts {
                text.push_str(part);
            }
            Self(Repr::Inline(text))
        } else {
            Self(Repr::Heap(parts.concat()))
        }
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Inline(text) => text,
            Repr::Heap(text) => text,
        }
    }

    /// The key as a `String`.
    pub fn into_string(self) -> String {
        match self.0 {
            Repr::Inline(text) => text.as_str().to_owned(),
            Repr::Heap(text) => text,
        }
    }
}

impl From<String> for KeyText {
    fn from(text: String) -> Self {
        Self(Repr::Heap(text))
    }
}

impl From<&str> for KeyText {
    fn from(key: &str) -> Self {
        Self::concat(&[key])
    }
}

impl fmt::Debug for KeyText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_joined_inline_or_on_the_heap() {
        let short = KeyText::concat(&["idempotency-key:", "7f3a", ""]);
        assert!(matches!(short.0, Repr::Inline(_)));
        assert_eq!(short.as_str(), "idempotency-key:7f3a");
        assert_eq!(short.clone().into_string(), "idempotency-key:7f3a");

        let edge = "é".repeat(INLINE / 2); // exactly INLINE bytes, multi-byte characters
        let at_limit = KeyText::concat(&[&edge[..4], &edge[4..]]);
        assert!(matches!(at_limit.0, Repr::Inline(_)));
        assert_eq!(at_limit.as_str(), edge);

        let long = "k".repeat(INLINE + 1);
        let over = KeyText::concat(&[&long[..10], &long[10..]]);
        assert!(matches!(over.0, Repr::Heap(_)));
        assert_eq!(over.as_str(), long);
        assert_eq!(format!("{over:?}"), format!("{long:?}"));

        assert_eq!(KeyText::from("owned".to_owned()).into_string(), "owned");
        assert!(matches!(KeyText::from("short").0, Repr::Inline(_)));
        assert_eq!(KeyText::concat(&[]).as_str(), "");
    }
}
