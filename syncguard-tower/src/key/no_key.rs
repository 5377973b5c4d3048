//! Why a key function made no key: what the request, or its route, lacks.

use std::borrow::Cow;
use std::fmt;

/// Why a [key function](super::MakeKey) made no key for a request; its text names what is
/// missing, and the layer puts it in its answer and in its warning.
///
/// Two kinds, which the layer answers differently (see [the module's
/// documentation](super#when-there-is-no-key)):
///
/// - [`missing`](Self::missing): the request does not carry what the key is made of (a
///   header, a metadata entry): the client's error, `400 Bad Request`, or run unlocked when
///   the layer says [`Keyless::RunUnlocked`](crate::Keyless::RunUnlocked).
/// - [`misconfigured`](Self::misconfigured): the server cannot make a key for this route (a
///   route without the parameter the key reads): `500 Internal Server Error`, always.
///
/// ```
/// use syncguard_tower::key::NoKey;
///
/// let missing = NoKey::missing("header `idempotency-key`");
/// assert_eq!(missing.to_string(), "the request has no header `idempotency-key`");
/// assert!(!missing.is_misconfigured());
///
/// let route = NoKey::misconfigured("the route `/orders/{id}` has no parameter `{order_id}`");
/// assert!(route.is_misconfigured());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoKey {
    text: Cow<'static, str>,
    misconfigured: bool,
}

impl NoKey {
    /// The request lacks `what` (for example "header `x-tenant`"); the text is "the request
    /// has no " followed by `what`. Write `what` from the server's names only, never from
    /// request data: it is sent to the client and logged.
    pub fn missing(what: impl Into<Cow<'static, str>>) -> Self {
        let what = what.into();
        Self {
            text: Cow::Owned(format!("the request has no {what}")),
            misconfigured: false,
        }
    }

    /// The layer cannot key the requests of this route, for the reason `why` (a complete
    /// sentence naming what is missing and where). The same rule as for
    /// [`missing`](Self::missing): the server's names only.
    pub fn misconfigured(why: impl Into<Cow<'static, str>>) -> Self {
        Self {
            text: why.into(),
            misconfigured: true,
        }
    }

    /// Whether the server, not the request, lacks what the key needs: such a request is
    /// answered 500, even under [`Keyless::RunUnlocked`](crate::Keyless::RunUnlocked).
    pub fn is_misconfigured(&self) -> bool {
        self.misconfigured
    }
}

impl fmt::Display for NoKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for NoKey {}
