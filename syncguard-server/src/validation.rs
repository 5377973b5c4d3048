//! Request validation, with LockServiceCentral's messages.
//!
//! - Path parameters (`namespace`, `lockName`): 3 to 64 characters of `[a-zA-Z0-9_-]`, as
//!   Jakarta Bean Validation checks them in LSC, each failed constraint one detail
//!   `Parameter '<name>' failed validation: <message>` of a 400 `Validation failed`.
//! - Bodies: LSC's JSON Schemas (draft-07, `additionalProperties: false`), each violation one
//!   detail of a 400 `JSON validation failed`, worded as the networknt validator LSC uses
//!   words it (`$.leaseDuration: must have a maximum value of 86400`).
//! - A body that gives a property twice (`{"instanceId":"a","instanceId":"b"}`) is refused
//!   with one detail per repeated name (`$: property 'instanceId' is given more than once`),
//!   before the schema: which of the values was meant is unknown, and picking one (the last,
//!   as a plain JSON parser does) lets a proxy that checked the other pass something else.
//!
//! Nothing here touches a lock: a request that fails validation changes nothing.

use std::collections::HashSet;
use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::ApiError;

/// The pattern of namespaces, lock names and instance ids, as LSC writes it.
pub(crate) const NAME_PATTERN: &str = "^[a-zA-Z0-9_-]+$";
/// The shortest name or instance id.
const MIN_LEN: usize = 3;
/// The longest name or instance id.
const MAX_LEN: usize = 64;
/// The longest lease a request may ask for, in seconds (24 h).
pub(crate) const MAX_LEASE_SECONDS: u32 = 86_400;

/// Whether every character is one of `[a-zA-Z0-9_-]` (and there is one at least).
fn matches_name_pattern(value: &str) -> bool {
    !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A lock's validated address: namespace and lock name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockPath {
    pub(crate) namespace: String,
    pub(crate) lock_name: String,
}

impl LockPath {
    /// The syncguard key: `namespace:lockName`, unambiguous since neither part can hold `:`
    /// (the key four of LSC's five backends use).
    pub(crate) fn key(&self) -> String {
        format!("{}:{}", self.namespace, self.lock_name)
    }
}

/// Checks the two path parameters, namespace first.
pub(crate) fn lock_path(namespace: &str, lock_name: &str) -> Result<LockPath, ApiError> {
    let mut details = Vec::new();
    check_parameter(&mut details, "namespace", "Namespace", namespace);
    check_parameter(&mut details, "lockName", "Lock name", lock_name);
    if details.is_empty() {
        Ok(LockPath {
            namespace: namespace.to_owned(),
            lock_name: lock_name.to_owned(),
        })
    } else {
        Err(ApiError::PathValidation(details))
    }
}

fn check_parameter(details: &mut Vec<String>, parameter: &str, label: &str, value: &str) {
    // Bean Validation's @Size counts Java chars: UTF-16 code units.
    let len = value.encode_utf16().count();
    if !(MIN_LEN..=MAX_LEN).contains(&len) {
        details.push(format!(
            "Parameter '{parameter}' failed validation: {label} must be between {MIN_LEN} and {MAX_LEN} characters long"
        ));
    }
    if !matches_name_pattern(value) {
        details.push(format!(
            "Parameter '{parameter}' failed validation: {label} must be alphanumeric with dashes and underscores only"
        ));
    }
}

/// The body of acquire and renew: `acquireLockSchema.json` / `renewLockSchema.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseRequest {
    pub(crate) instance_id: String,
    /// Seconds, 1 to [`MAX_LEASE_SECONDS`].
    pub(crate) lease_duration: u32,
}

/// The body of release: `releaseLockSchema.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReleaseRequest {
    pub(crate) instance_id: String,
}

/// A property of LSC's request schemas.
#[derive(Clone, Copy)]
enum Property {
    InstanceId,
    LeaseDuration,
}

impl Property {
    const fn name(self) -> &'static str {
        match self {
            Self::InstanceId => "instanceId",
            Self::LeaseDuration => "leaseDuration",
        }
    }
}

/// Parses and checks an acquire or renew body.
pub(crate) fn lease_request(body: &[u8]) -> Result<LeaseRequest, ApiError> {
    let object = validate(body, &[Property::InstanceId, Property::LeaseDuration])?;
    match (
        object.get("instanceId").and_then(Value::as_str),
        object.get("leaseDuration").and_then(integer),
    ) {
        (Some(instance_id), Some(lease)) => Ok(LeaseRequest {
            instance_id: instance_id.to_owned(),
            lease_duration: u32::try_from(lease).unwrap_or(MAX_LEASE_SECONDS),
        }),
        _ => Err(ApiError::Internal(
            "a validated lease request lacks its fields".to_owned(),
        )),
    }
}

/// Parses and checks a release body.
pub(crate) fn release_request(body: &[u8]) -> Result<ReleaseRequest, ApiError> {
    let object = validate(body, &[Property::InstanceId])?;
    match object.get("instanceId").and_then(Value::as_str) {
        Some(instance_id) => Ok(ReleaseRequest {
            instance_id: instance_id.to_owned(),
        }),
        None => Err(ApiError::Internal(
            "a validated release request lacks its instanceId".to_owned(),
        )),
    }
}

/// Parses `body` (read as UTF-8 whatever the Content-Type, as LSC does) and validates it
/// against a schema whose properties are `properties`, all required, no others allowed.
fn validate(body: &[u8], properties: &[Property]) -> Result<Map<String, Value>, ApiError> {
    let text = String::from_utf8_lossy(body);
    if text.trim().is_empty() {
        return Err(ApiError::BodyValidation(vec![
            "$: the request body is empty; a JSON object is expected".to_owned(),
        ]));
    }
    let value: Value = serde_json::from_str(&text).map_err(|error| {
        ApiError::BodyValidation(vec![format!(
            "$: the request body is not valid JSON: {error}"
        )])
    })?;
    let Value::Object(object) = value else {
        return Err(ApiError::BodyValidation(vec![format!(
            "$: {} found, object expected",
            type_name(&value)
        )]));
    };
    // `Value` keeps the last of repeated keys: read the names again, which now parse.
    let repeated = serde_json::from_str::<RepeatedKeys>(&text)
        .map_err(|error| ApiError::Internal(format!("a parsed body fails to parse: {error}")))?;
    if !repeated.0.is_empty() {
        return Err(ApiError::BodyValidation(
            repeated
                .0
                .iter()
                .map(|name| format!("$: property '{name}' is given more than once"))
                .collect(),
        ));
    }
    let mut details = Vec::new();
    for name in object.keys() {
        if !properties.iter().any(|property| property.name() == name) {
            details.push(format!(
                "$: property '{name}' is not defined in the schema and the schema does not allow additional properties"
            ));
        }
    }
    for &property in properties {
        if let Some(value) = object.get(property.name()) {
            check_property(&mut details, property, value);
        }
    }
    for &property in properties {
        if !object.contains_key(property.name()) {
            details.push(format!(
                "$: required property '{}' not found",
                property.name()
            ));
        }
    }
    if details.is_empty() {
        Ok(object)
    } else {
        Err(ApiError::BodyValidation(details))
    }
}

/// The names a JSON object gives more than once, each named once, in the order of their
/// second appearance.
struct RepeatedKeys(Vec<String>);

impl<'de> Deserialize<'de> for RepeatedKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Names;

        impl<'de> Visitor<'de> for Names {
            type Value = RepeatedKeys;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RepeatedKeys, A::Error> {
                let mut seen = HashSet::new();
                let mut repeated = Vec::new();
                // `String`, not `&str`: `"instance\u0049d"` is `instanceId` too.
                while let Some(name) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    if !seen.insert(name.clone()) && !repeated.contains(&name) {
                        repeated.push(name);
                    }
                }
                Ok(RepeatedKeys(repeated))
            }
        }

        deserializer.deserialize_map(Names)
    }
}

fn check_property(details: &mut Vec<String>, property: Property, value: &Value) {
    let at = format!("$.{}", property.name());
    match property {
        Property::InstanceId => {
            let Value::String(text) = value else {
                details.push(format!("{at}: {} found, string expected", type_name(value)));
                return;
            };
            // networknt counts code points.
            let len = text.chars().count();
            if len < MIN_LEN {
                details.push(format!("{at}: must be at least {MIN_LEN} characters long"));
            }
            if len > MAX_LEN {
                details.push(format!("{at}: must be at most {MAX_LEN} characters long"));
            }
            if !matches_name_pattern(text) {
                details.push(format!(
                    "{at}: does not match the regex pattern {NAME_PATTERN}"
                ));
            }
        }
        Property::LeaseDuration => {
            let Some(seconds) = integer_value(value) else {
                details.push(format!(
                    "{at}: {} found, integer expected",
                    type_name(value)
                ));
                return;
            };
            if seconds < 1.0 {
                details.push(format!("{at}: must have a minimum value of 1"));
            }
            if seconds > f64::from(MAX_LEASE_SECONDS) {
                details.push(format!(
                    "{at}: must have a maximum value of {MAX_LEASE_SECONDS}"
                ));
            }
        }
    }
}

/// A JSON integer's value, for range checks: integers, and numbers with no fractional part
/// (`60.0`), which JSON Schema draft-06 and later count as integers.
fn integer_value(value: &Value) -> Option<f64> {
    let number = value.as_number()?;
    if let Some(n) = number.as_i64() {
        #[allow(clippy::cast_precision_loss)] // Only compared with 1 and 86400.
        return Some(n as f64);
    }
    if let Some(n) = number.as_u64() {
        #[allow(clippy::cast_precision_loss)]
        return Some(n as f64);
    }
    number
        .as_f64()
        .filter(|n| n.is_finite() && n.fract() == 0.0)
}

/// An in-range lease, once validated.
fn integer(value: &Value) -> Option<u64> {
    integer_value(value).and_then(|n| {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // 1..=86400 here.
        (1.0..=f64::from(MAX_LEASE_SECONDS))
            .contains(&n)
            .then_some(n as u64)
    })
}

/// networknt's name for the JSON type of a value.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) if integer_value(value).is_some() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_details(body: &str) -> Vec<String> {
        match lease_request(body.as_bytes()) {
            Err(ApiError::BodyValidation(details)) => details,
            other => panic!("expected a body validation error, got {other:?}"),
        }
    }

    fn path_details(namespace: &str, lock_name: &str) -> Vec<String> {
        match lock_path(namespace, lock_name) {
            Err(ApiError::PathValidation(details)) => details,
            other => panic!("expected a path validation error, got {other:?}"),
        }
    }

    #[test]
    fn valid_requests() {
        let request = lease_request(br#"{"instanceId":"abc","leaseDuration":60}"#).unwrap();
        assert_eq!(request.instance_id, "abc");
        assert_eq!(request.lease_duration, 60);
        let request = lease_request(br#"{"instanceId":"a-_","leaseDuration":86400.0}"#).unwrap();
        assert_eq!(request.lease_duration, 86_400);
        let request = release_request(br#"{"instanceId":"x_Y-9"}"#).unwrap();
        assert_eq!(request.instance_id, "x_Y-9");
    }

    #[test]
    fn schema_messages() {
        assert_eq!(
            body_details(r#"{"instanceId":"abc","leaseDuration":60,"foo":1}"#),
            [
                "$: property 'foo' is not defined in the schema and the schema does not allow additional properties"
            ]
        );
        assert_eq!(
            body_details(r#"{"leaseDuration":60}"#),
            ["$: required property 'instanceId' not found"]
        );
        assert_eq!(
            body_details(r#"{"instanceId":"ab!","leaseDuration":"60"}"#),
            [
                "$.instanceId: does not match the regex pattern ^[a-zA-Z0-9_-]+$",
                "$.leaseDuration: string found, integer expected"
            ]
        );
        assert_eq!(
            body_details(r#"{"instanceId":"a","leaseDuration":0}"#),
            [
                "$.instanceId: must be at least 3 characters long",
                "$.leaseDuration: must have a minimum value of 1"
            ]
        );
        assert_eq!(
            body_details(&format!(
                r#"{{"instanceId":"{}","leaseDuration":86401}}"#,
                "a".repeat(65)
            )),
            [
                "$.instanceId: must be at most 64 characters long",
                "$.leaseDuration: must have a maximum value of 86400"
            ]
        );
        assert_eq!(
            body_details(r#"{"instanceId":"abc","leaseDuration":1.5}"#),
            ["$.leaseDuration: number found, integer expected"]
        );
        assert_eq!(
            body_details(r#"{"instanceId":null,"leaseDuration":true}"#),
            [
                "$.instanceId: null found, string expected",
                "$.leaseDuration: boolean found, integer expected"
            ]
        );
        assert_eq!(body_details("[1]"), ["$: array found, object expected"]);
    }

    #[test]
    fn repeated_properties_are_refused() {
        assert_eq!(
            body_details(r#"{"instanceId":"abc","instanceId":"xyz","leaseDuration":60}"#),
            ["$: property 'instanceId' is given more than once"]
        );
        assert_eq!(
            body_details(
                r#"{"leaseDuration":1,"instanceId":"abc","leaseDuration":86400,"leaseDuration":2,"instance\u0049d":"x"}"#
            ),
            [
                "$: property 'leaseDuration' is given more than once",
                "$: property 'instanceId' is given more than once"
            ]
        );
        assert!(matches!(
            release_request(br#"{"instanceId":"abc","instanceId":"abc"}"#),
            Err(ApiError::BodyValidation(_))
        ));
        // Nested objects are not checked here: the schema refuses any object value.
        assert_eq!(
            body_details(r#"{"instanceId":{"a":1,"a":2},"leaseDuration":60}"#),
            ["$.instanceId: object found, string expected"]
        );
    }

    #[test]
    fn malformed_json_is_a_validation_error() {
        assert!(body_details("{")[0].starts_with("$: the request body is not valid JSON"));
        assert!(body_details("  ")[0].starts_with("$: the request body is empty"));
    }

    #[test]
    fn path_messages() {
        assert!(lock_path("abc", "a_b-C9").is_ok());
        assert_eq!(
            path_details("ab", "lock"),
            [
                "Parameter 'namespace' failed validation: Namespace must be between 3 and 64 characters long"
            ]
        );
        assert_eq!(
            path_details("abc", "lo.ck"),
            [
                "Parameter 'lockName' failed validation: Lock name must be alphanumeric with dashes and underscores only"
            ]
        );
        assert_eq!(path_details("a!", &"x".repeat(65)).len(), 3);
    }
}
