//! Lock ids: the unguessable handle of one acquisition.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore as _;

use crate::error::LockError;

/// The handle of one acquisition: 16 bytes from a CSPRNG, encoded base64url without padding
/// (22 characters), as the reference design makes them.
///
/// Release and extend take the lock id alone; it is the proof of ownership, so treat it as a
/// secret (its [`Debug`] output is redacted; [`Display`](fmt::Display) prints it in full).
///
/// ```
/// use syncguard::LockId;
///
/// let id = LockId::generate();
/// assert_eq!(id.as_str().len(), 22);
/// let parsed: LockId = id.as_str().parse()?;
/// assert_eq!(parsed, id);
/// assert!(LockId::parse("not a lock id").is_err());
/// # Ok::<(), syncguard::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockId([u8; LockId::LEN]);

impl LockId {
    /// The length of every lock id, in characters (ASCII, so also in bytes).
    pub const LEN: usize = 22;

    /// A fresh lock id from the thread-local CSPRNG.
    pub fn generate() -> Self {
        // Two words from the generator cost less than its byte-filling path.
        let mut rng = rand::rng();
        let (high, low) = (rng.next_u64(), rng.next_u64());
        let mut bytes = [0_u8; 16];
        bytes[..8].copy_from_slice(&high.to_le_bytes());
        bytes[8..].copy_from_slice(&low.to_le_bytes());
        Self(base64url(&bytes))
    }

    /// A lock id whose first 8 bytes are `head` and whose last 8 come from the CSPRNG: a
    /// backend whose storage is found from the lock id (the Redis cluster layout) puts there
    /// what finds it.
    #[cfg(feature = "redis")]
    pub(crate) fn with_head(head: [u8; 8]) -> Self {
        let mut bytes = [0_u8; 16];
        bytes[..8].copy_from_slice(&head);
        bytes[8..].copy_from_slice(&rand::rng().next_u64().to_le_bytes());
        Self(base64url(&bytes))
    }

    /// The first 8 bytes of the id (what [`with_head`](Self::with_head) put there).
    #[cfg(feature = "redis")]
    pub(crate) fn head(&self) -> [u8; 8] {
        // 12 characters are exactly 9 bytes: no padding or trailing bits to reject.
        let mut nine = [0_u8; 9];
        URL_SAFE_NO_PAD
            .decode_slice(&self.0[..12], &mut nine)
            .expect("12 base64url characters are 9 bytes");
        let mut head = [0_u8; 8];
        head.copy_from_slice(&nine[..8]);
        head
    }

    /// Parses a lock id received from elsewhere (another service, a request).
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) unless `value` matches
    /// `^[A-Za-z0-9_-]{22}$`.
    pub fn parse(value: &str) -> Result<Self, LockError> {
        let well_formed = value.len() == Self::LEN
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if well_formed {
            let mut text = [0_u8; Self::LEN];
            text.copy_from_slice(value.as_bytes());
            Ok(Self(text))
        } else {
            Err(LockError::invalid_argument(
                "malformed lock id: expected 22 base64url characters (A-Z, a-z, 0-9, '-', '_')",
            ))
        }
    }

    /// The 22-character text of the id.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("lock ids are base64url text")
    }
}

/// `bytes` in base64url without padding.
fn base64url(bytes: &[u8; 16]) -> [u8; LockId::LEN] {
    let mut text = [0_u8; LockId::LEN];
    let written = URL_SAFE_NO_PAD
        .encode_slice(bytes, &mut text)
        .expect("16 bytes are 22 base64url characters");
    debug_assert_eq!(written, LockId::LEN);
    text
}

impl FromStr for LockId {
    type Err = LockError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Self::parse(value)
    }
}

impl fmt::Display for LockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for LockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockId({}…)", &self.as_str()[..4])
    }
}

impl AsRef<str> for LockId {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_well_formed_and_distinct() {
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| LockId::generate()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            assert!(LockId::parse(id.as_str()).is_ok(), "{id}");
        }
    }

    #[test]
    #[cfg(feature = "redis")]
    fn a_head_is_kept_and_the_rest_is_random() {
        let head = *b"\x00\xffhead!\x7f";
        let (a, b) = (LockId::with_head(head), LockId::with_head(head));
        assert_ne!(a, b);
        for id in [&a, &b] {
            assert_eq!(id.head(), head);
            assert!(LockId::parse(id.as_str()).is_ok());
        }
        let generated = LockId::generate();
        assert_eq!(
            LockId::parse(generated.as_str()).unwrap().head(),
            generated.head()
        );
    }

    #[test]
    fn malformed_ids_are_rejected() {
        for bad in [
            "",
            "short",
            "AAAAAAAAAAAAAAAAAAAAA",   // 21
            "AAAAAAAAAAAAAAAAAAAAAAA", // 23
            "AAAAAAAAAAAAAAAAAAAAA=",
            "AAAAAAAAAAAAAAAAAAAAA+",
            "AAAAAAAAAAAAAAAAAAAAA/",
            "AAAAAAAAAAAAAAAAAAAAAé",
            "AAAAAAAAAAAAAAAAAAAA A",
        ] {
            let err = LockId::parse(bad).unwrap_err();
            assert_eq!(err.code(), crate::ErrorCode::InvalidArgument, "{bad:?}");
        }
        assert!(LockId::parse("Ab-_09zZAb-_09zZAb-_09").is_ok());
    }

    #[test]
    fn ids_are_base64url_without_padding() {
        use base64::Engine as _;
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;

        let mut bytes = [0_u8; 16];
        for seed in 0..=255_u8 {
            for (i, byte) in bytes.iter_mut().enumerate() {
                *byte = seed
                    .wrapping_mul(31)
                    .wrapping_add(i as u8)
                    .rotate_left(u32::from(seed % 8));
            }
            assert_eq!(base64url(&bytes), URL_SAFE_NO_PAD.encode(bytes).as_bytes());
        }
        assert_eq!(
            base64url(&[0xff; 16]),
            URL_SAFE_NO_PAD.encode([0xff; 16]).as_bytes()
        );
        assert_eq!(&base64url(&[0; 16]), b"AAAAAAAAAAAAAAAAAAAAAA");
    }

    #[test]
    fn debug_is_redacted() {
        let id = LockId::parse("AbCdEfGhIjKlMnOpQrStUv").unwrap();
        assert_eq!(format!("{id:?}"), "LockId(AbCd…)");
    }
}
