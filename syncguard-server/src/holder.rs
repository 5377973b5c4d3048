//! The holder the server stores with each lock (`LockBackend::acquire_as`): LSC's identity of
//! a lock's owner, the pair (owner, instanceId), as a canonical JSON object
//! `{"owner":O,"instanceId":I}`.
//!
//! JSON makes the pair unambiguous whatever the owner holds (a JWT `sub` may contain any
//! character), and one encoder makes equal pairs equal strings, so the backend's holder
//! comparison is LSC's `owner AND instanceId` match. The instanceId acts as a client's secret:
//! a holder is never logged or shown; only its owner is shown (GET), as in LSC.

use serde::{Deserialize, Serialize};
use syncguard::backend::check_holder;

/// The longest instanceId a request may carry (its JSON Schema's `maxLength`).
const MAX_INSTANCE_ID_LEN: usize = 64;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pair<'a> {
    #[serde(borrow)]
    owner: std::borrow::Cow<'a, str>,
    #[serde(rename = "instanceId", borrow)]
    instance_id: std::borrow::Cow<'a, str>,
}

/// The holder of `owner` with `instance_id`.
pub(crate) fn encode(owner: &str, instance_id: &str) -> String {
    let pair = Pair {
        owner: owner.into(),
        instance_id: instance_id.into(),
    };
    // Serializing two strings cannot fail.
    serde_json::to_string(&pair).unwrap_or_default()
}

/// The owner of a stored holder; `None` for a holder this server did not write (another
/// service's `acquire_as`).
pub(crate) fn owner_of(holder: &str) -> Option<String> {
    serde_json::from_str::<Pair<'_>>(holder)
        .ok()
        .map(|pair| pair.owner.into_owned())
}

/// Whether every holder of `owner` fits the backends' holder limit, whatever instanceId a
/// request brings; an owner that does not is refused at authentication.
pub(crate) fn owner_fits(owner: &str) -> bool {
    !owner.is_empty() && check_holder(&encode(owner, &"x".repeat(MAX_INSTANCE_ID_LEN))).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_and_reversible() {
        let holder = encode("svc-a", "worker-1");
        assert_eq!(holder, r#"{"owner":"svc-a","instanceId":"worker-1"}"#);
        assert_eq!(owner_of(&holder).as_deref(), Some("svc-a"));
    }

    #[test]
    fn owners_with_quotes_stay_unambiguous() {
        let tricky = encode(r#"a","instanceId":"b"#, "c12");
        assert_ne!(tricky, encode("a", r#"b","owner":"c12"#));
        assert_eq!(owner_of(&tricky).as_deref(), Some(r#"a","instanceId":"b"#));
    }

    #[test]
    fn foreign_holders_have_no_owner() {
        assert_eq!(owner_of("worker-7"), None);
        assert_eq!(owner_of(r#"{"owner":"a","instanceId":"b","x":1}"#), None);
    }

    #[test]
    fn owner_limits() {
        assert!(owner_fits("anonymous"));
        assert!(!owner_fits(""));
        assert!(owner_fits(&"o".repeat(900)));
        assert!(!owner_fits(&"o".repeat(1000)));
        // Control characters are escaped (6 bytes each), and counted so.
        assert!(!owner_fits(&"\u{1}".repeat(200)));
    }
}
