//! Request validation over real HTTP: LockServiceCentral's path and body rules with their
//! exact messages (its specification's sections 2.2, 2.3 and 2.6), the 400 for malformed
//! JSON (a deliberate deviation from LSC's 500), and that bad input never changes a lock.

mod support;

use http::{Method, StatusCode};
use serde_json::json;
use support::{TestServer, assert_error_id};

const SIZE_NS: &str =
    "Parameter 'namespace' failed validation: Namespace must be between 3 and 64 characters long";
const PATTERN_NS: &str = "Parameter 'namespace' failed validation: Namespace must be alphanumeric with dashes and underscores only";
const SIZE_NAME: &str =
    "Parameter 'lockName' failed validation: Lock name must be between 3 and 64 characters long";
const PATTERN_NAME: &str = "Parameter 'lockName' failed validation: Lock name must be alphanumeric with dashes and underscores only";

#[tokio::test]
async fn path_validation() {
    let server = TestServer::memory().await;
    let long = "x".repeat(65);
    let longest = "y".repeat(64);
    let cases: Vec<(String, String, Vec<&str>)> = vec![
        ("ab".into(), "mylock".into(), vec![SIZE_NS]),
        ("abc".into(), "my".into(), vec![SIZE_NAME]),
        (long.clone(), "mylock".into(), vec![SIZE_NS]),
        ("abc".into(), long.clone(), vec![SIZE_NAME]),
        ("my.ns".into(), "mylock".into(), vec![PATTERN_NS]),
        ("abc".into(), "my%20lock".into(), vec![PATTERN_NAME]),
        ("abc".into(), "lock%3Aname".into(), vec![PATTERN_NAME]),
        ("abc".into(), "l%C3%B6ck".into(), vec![PATTERN_NAME]),
        ("a!".into(), "mylock".into(), vec![SIZE_NS, PATTERN_NS]),
        (
            "a!".into(),
            "b%3F".into(),
            vec![SIZE_NS, PATTERN_NS, SIZE_NAME, PATTERN_NAME],
        ),
        ("n%FF%FE".into(), "mylock".into(), vec![PATTERN_NS]),
    ];
    for (ns, name, expected) in cases {
        let get = server.get(&format!("/v1/{ns}/lock/{name}")).await;
        assert_eq!(get.status, StatusCode::BAD_REQUEST, "GET {ns}/{name}");
        let body = get.json();
        assert_eq!(body["message"], "Validation failed");
        let mut details: Vec<&str> = body["details"]
            .as_array()
            .unwrap()
            .iter()
            .map(|detail| detail.as_str().unwrap())
            .collect();
        // Within one parameter LSC's order is not defined; across them, namespace first.
        let mut wanted = expected.clone();
        assert_eq!(body.as_object().unwrap().len(), 2, "{body}");
        let first_name = details
            .iter()
            .position(|detail| detail.contains("'lockName'"))
            .unwrap_or(details.len());
        assert!(
            details[first_name..]
                .iter()
                .all(|detail| detail.contains("'lockName'")),
            "namespace first: {details:?}"
        );
        details.sort_unstable();
        wanted.sort_unstable();
        assert_eq!(details, wanted, "GET {ns}/{name}");

        for operation in ["acquire", "renew", "release"] {
            let reply = server
                .post(
                    &format!("/v1/{ns}/lock/{name}/{operation}"),
                    r#"{"instanceId":"abc","leaseDuration":5}"#
                        .replace(
                            r#","leaseDuration":5"#,
                            if operation == "release" {
                                ""
                            } else {
                                r#","leaseDuration":5"#
                            },
                        )
                        .as_str(),
                )
                .await;
            assert_eq!(
                reply.status,
                StatusCode::BAD_REQUEST,
                "{operation} {ns}/{name}"
            );
            assert_eq!(reply.json()["message"], "Validation failed");
        }
    }
    // The bounds themselves are accepted.
    assert_eq!(server.status("abc", &longest).await.status, StatusCode::OK);
    assert_eq!(server.status(&longest, "a-_").await.status, StatusCode::OK);
    assert_eq!(
        server.acquire("A_b-9", "Z-z_0", "abc", 5).await.status,
        StatusCode::OK
    );
}

/// The details of a 400 `JSON validation failed`.
async fn body_details(server: &TestServer, operation: &str, body: &str) -> Vec<String> {
    let reply = server
        .post(&format!("/v1/mynamespace/lock/mylock/{operation}"), body)
        .await;
    assert_eq!(
        reply.status,
        StatusCode::BAD_REQUEST,
        "{operation} {body}: {}",
        reply.text
    );
    let json = reply.json();
    assert_eq!(json["message"], "JSON validation failed", "{json}");
    assert_eq!(json.as_object().unwrap().len(), 2, "{json}");
    json["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|detail| detail.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn body_validation_of_acquire_and_renew() {
    let server = TestServer::memory().await;
    let long = "i".repeat(65);
    let cases: Vec<(String, Vec<&str>)> = vec![
        (
            r#"{"instanceId":"abc","leaseDuration":60,"foo":"bar"}"#.into(),
            vec![
                "$: property 'foo' is not defined in the schema and the schema does not allow additional properties",
            ],
        ),
        (
            r#"{"instanceId":"abc","leaseDuration":60,"owner":"someone-else"}"#.into(),
            vec![
                "$: property 'owner' is not defined in the schema and the schema does not allow additional properties",
            ],
        ),
        (
            r#"{"leaseDuration":60}"#.into(),
            vec!["$: required property 'instanceId' not found"],
        ),
        (
            r#"{"instanceId":"abc"}"#.into(),
            vec!["$: required property 'leaseDuration' not found"],
        ),
        (
            "{}".into(),
            vec![
                "$: required property 'instanceId' not found",
                "$: required property 'leaseDuration' not found",
            ],
        ),
        (
            r#"{"instanceId":"ab","leaseDuration":60}"#.into(),
            vec!["$.instanceId: must be at least 3 characters long"],
        ),
        (
            format!(r#"{{"instanceId":"{long}","leaseDuration":60}}"#),
            vec!["$.instanceId: must be at most 64 characters long"],
        ),
        (
            r#"{"instanceId":"a b c","leaseDuration":60}"#.into(),
            vec!["$.instanceId: does not match the regex pattern ^[a-zA-Z0-9_-]+$"],
        ),
        (
            r#"{"instanceId":"abc\n","leaseDuration":60}"#.into(),
            vec!["$.instanceId: does not match the regex pattern ^[a-zA-Z0-9_-]+$"],
        ),
        (
            r#"{"instanceId":123,"leaseDuration":60}"#.into(),
            vec!["$.instanceId: integer found, string expected"],
        ),
        (
            r#"{"instanceId":"abc","leaseDuration":0}"#.into(),
            vec!["$.leaseDuration: must have a minimum value of 1"],
        ),
        (
            r#"{"instanceId":"abc","leaseDuration":-5}"#.into(),
            vec!["$.leaseDuration: must have a minimum value of 1"],
        ),
        (
            r#"{"instanceId":"abc","leaseDuration":86401}"#.into(),
            vec!["$.leaseDuration: must have a maximum value of 86400"],
        ),
        (
            r#"{"instanceId":"abc","leaseDuration":99999999999999999999999}"#.into(),
            vec!["$.leaseDuration: must have a maximum value of 86400"],
        ),
        (
            r#"{"instanceId":"abc","leaseDuration":"60"}"#.into(),
            vec!["$.leaseDuration: string found, integer expected"],
        ),
        (
            r#"{"instanceId":"abc","leaseDuration":1.5}"#.into(),
            vec!["$.leaseDuration: number found, integer expected"],
        ),
        (
            r#"{"instanceId":"abc","leaseDuration":null}"#.into(),
            vec!["$.leaseDuration: null found, integer expected"],
        ),
        (
            r#"{"instanceId":["abc"],"leaseDuration":{}}"#.into(),
            vec![
                "$.instanceId: array found, string expected",
                "$.leaseDuration: object found, integer expected",
            ],
        ),
        ("[]".into(), vec!["$: array found, object expected"]),
        ("\"text\"".into(), vec!["$: string found, object expected"]),
        ("42".into(), vec!["$: integer found, object expected"]),
        ("null".into(), vec!["$: null found, object expected"]),
    ];
    for operation in ["acquire", "renew"] {
        for (body, expected) in &cases {
            let mut details = body_details(&server, operation, body).await;
            let mut expected: Vec<String> = expected.iter().map(|d| (*d).to_owned()).collect();
            details.sort();
            expected.sort();
            assert_eq!(details, expected, "{operation} {body}");
        }
    }
    assert_eq!(
        server.status("mynamespace", "mylock").await.fence(),
        None,
        "nothing was taken"
    );
}

#[tokio::test]
async fn body_validation_of_release() {
    let server = TestServer::memory().await;
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (
            r#"{"instanceId":"abc","leaseDuration":60}"#,
            vec![
                "$: property 'leaseDuration' is not defined in the schema and the schema does not allow additional properties",
            ],
        ),
        ("{}", vec!["$: required property 'instanceId' not found"]),
        (
            r#"{"instanceId":"x"}"#,
            vec!["$.instanceId: must be at least 3 characters long"],
        ),
        (
            r#"{"instanceId":"x!"}"#,
            vec![
                "$.instanceId: must be at least 3 characters long",
                "$.instanceId: does not match the regex pattern ^[a-zA-Z0-9_-]+$",
            ],
        ),
        (
            r#"{"instanceId":true}"#,
            vec!["$.instanceId: boolean found, string expected"],
        ),
    ];
    for (body, expected) in cases {
        let mut details = body_details(&server, "release", body).await;
        let mut expected: Vec<String> = expected.iter().map(|d| (*d).to_owned()).collect();
        details.sort();
        expected.sort();
        assert_eq!(details, expected, "release {body}");
    }
}

#[tokio::test]
async fn malformed_and_empty_bodies_are_400() {
    let server = TestServer::memory().await;
    for operation in ["acquire", "renew", "release"] {
        for body in ["{", "not json", r#"{"instanceId":"abc","#, ""] {
            let details = body_details(&server, operation, body).await;
            assert_eq!(details.len(), 1, "{details:?}");
            assert!(
                details[0].starts_with("$: the request body "),
                "{details:?}"
            );
        }
    }
}

#[tokio::test]
async fn body_is_read_whatever_the_content_type() {
    let server = TestServer::memory().await;
    let body = r#"{"instanceId":"abc","leaseDuration":5}"#;
    let plain = server
        .send(
            Method::POST,
            "/v1/mynamespace/lock/textplain/acquire",
            &[("content-type", "text/plain")],
            body,
        )
        .await;
    assert_eq!(plain.status, StatusCode::OK, "{}", plain.text);
    let none = server
        .send(
            Method::POST,
            "/v1/mynamespace/lock/nocontenttype/acquire",
            &[],
            body,
        )
        .await;
    assert_eq!(none.status, StatusCode::OK, "{}", none.text);
    let form = server
        .send(
            Method::POST,
            "/v1/mynamespace/lock/nocontenttype/release",
            &[("content-type", "application/x-www-form-urlencoded")],
            r#"{"instanceId":"abc"}"#,
        )
        .await;
    assert_eq!(form.status, StatusCode::OK, "{}", form.text);
}

#[tokio::test]
async fn lease_bounds_and_integral_numbers() {
    let server = TestServer::memory().await;
    let longest = server
        .acquire("mynamespace", "longest", "abc", 86_400)
        .await;
    assert_eq!(longest.status, StatusCode::OK);
    assert_eq!(longest.json()["leaseDuration"], 86_400);
    let shortest = server.acquire("mynamespace", "shortest", "abc", 1).await;
    assert_eq!(shortest.json()["leaseDuration"], 1);
    let float = server
        .post(
            "/v1/mynamespace/lock/float/acquire",
            r#"{"instanceId":"abc","leaseDuration":60.0}"#,
        )
        .await;
    assert_eq!(float.status, StatusCode::OK, "{}", float.text);
    assert_eq!(float.json()["leaseDuration"], 60);
}

#[tokio::test]
async fn body_errors_win_over_path_errors() {
    let server = TestServer::memory().await;
    let reply = server
        .post(
            "/v1/a!/lock/b%3F/acquire",
            r#"{"instanceId":"abc","foo":1}"#,
        )
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let body = reply.json();
    assert_eq!(body["message"], "JSON validation failed");
    let details = body["details"].to_string();
    assert!(
        !details.contains("Parameter"),
        "only the body is reported: {details}"
    );
}

#[tokio::test]
async fn oversized_body_is_413() {
    let server = TestServer::memory().await;
    let body = format!(
        r#"{{"instanceId":"abc","leaseDuration":5,"pad":"{}"}}"#,
        "p".repeat(70_000)
    );
    let reply = server
        .post("/v1/mynamespace/lock/mylock/acquire", &body)
        .await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_error_id(&reply.json(), "Request body too large");
    assert_eq!(server.status("mynamespace", "mylock").await.fence(), None);
}

#[tokio::test]
async fn bad_input_changes_nothing() {
    let server = TestServer::memory().await;
    let held = server.acquire("mynamespace", "held", "owner-1", 30).await;
    let expiry = held.expiry();
    let fence = held.fence_value();
    let bad_requests = [
        (
            "/v1/mynamespace/lock/held/release",
            r#"{"instanceId":"owner-1","x":1}"#,
        ),
        ("/v1/mynamespace/lock/held/release", r#"{"instanceId":"o"}"#),
        ("/v1/mynamespace/lock/held/release", "{"),
        (
            "/v1/mynamespace/lock/held/renew",
            r#"{"instanceId":"owner-1","leaseDuration":0}"#,
        ),
        (
            "/v1/mynamespace/lock/held/renew",
            r#"{"instanceId":"owner-1","leaseDuration":86401}"#,
        ),
        (
            "/v1/mynamespace/lock/held/acquire",
            r#"{"instanceId":"owner-1","leaseDuration":"1"}"#,
        ),
        (
            "/v1/mynamespace/lock/held/acquire",
            r#"{"instanceId":"owner-1"}"#,
        ),
        (
            "/v1/mynamespace/lock/free/acquire",
            r#"{"instanceId":"owner-1","leaseDuration":-1}"#,
        ),
        (
            "/v1/mynamespace/lock/fr/acquire",
            r#"{"instanceId":"owner-1","leaseDuration":5}"#,
        ),
    ];
    for (path, body) in bad_requests {
        let reply = server.post(path, body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{path} {body}");
    }
    let after = server.status("mynamespace", "held").await;
    assert_eq!(after.expiry(), expiry, "the held lock is untouched");
    assert_eq!(after.fence_value(), fence);
    let free = server.status("mynamespace", "free").await;
    assert_eq!(
        free.json(),
        json!({"namespace":"mynamespace","lockName":"free"})
    );
}

#[tokio::test]
async fn repeated_properties_are_400_and_change_nothing() {
    let server = TestServer::memory().await;
    let held = server.acquire("mynamespace", "twice", "holder", 30).await;
    let expiry = held.expiry();
    let fence = held.fence_value();
    let cases = [
        (
            "acquire",
            "free-twice",
            r#"{"instanceId":"abc","instanceId":"xyz","leaseDuration":5}"#,
            "instanceId",
        ),
        (
            "acquire",
            "free-twice",
            r#"{"leaseDuration":1,"instanceId":"abc","leaseDuration":86400}"#,
            "leaseDuration",
        ),
        (
            "acquire",
            "twice",
            r#"{"instanceId":"other","instanceId":"holder","leaseDuration":5}"#,
            "instanceId",
        ),
        (
            "renew",
            "twice",
            r#"{"instanceId":"holder","leaseDuration":1,"leaseDuration":86400}"#,
            "leaseDuration",
        ),
        (
            "release",
            "twice",
            r#"{"instanceId":"other","instanceId":"holder"}"#,
            "instanceId",
        ),
        (
            "release",
            "twice",
            r#"{"instanceId":"holder","instance\u0049d":"holder"}"#,
            "instanceId",
        ),
    ];
    for (operation, lock, body, name) in cases {
        let reply = server
            .post(&format!("/v1/mynamespace/lock/{lock}/{operation}"), body)
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{operation} {body}");
        assert_eq!(
            reply.json(),
            json!({
                "message": "JSON validation failed",
                "details": [format!("$: property '{name}' is given more than once")],
            }),
            "{operation} {body}"
        );
    }
    let after = server.status("mynamespace", "twice").await;
    assert_eq!(after.expiry(), expiry, "the held lock is untouched");
    assert_eq!(after.fence_value(), fence);
    assert_eq!(
        server.status("mynamespace", "free-twice").await.json(),
        json!({"namespace":"mynamespace","lockName":"free-twice"}),
        "nothing was taken"
    );
}
