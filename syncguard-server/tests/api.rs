//! The HTTP API over real HTTP on loopback: every route, status and answer shape of
//! LockServiceCentral's specification (sections 2.1, 2.4 and 2.5), the operations and
//! documentation routes, and the 503 of a failing backend (a deliberate deviation). The
//! validation rules are in `validation.rs`.

mod support;

use std::sync::Arc;

use http::{Method, StatusCode};
use serde_json::json;
use support::{TestServer, assert_error_id, flaky_backend, now_seconds};
use syncguard_server::Auth;

#[tokio::test]
async fn bodies_field_for_field() {
    let server = TestServer::memory().await;

    let free = server.status("mynamespace", "mylock").await;
    assert_eq!(free.status, StatusCode::OK);
    assert_eq!(
        free.json(),
        json!({"namespace":"mynamespace","lockName":"mylock"})
    );
    assert_eq!(free.fence(), None, "a free lock has no fencing token");
    assert_eq!(
        free.headers["content-type"], "application/json",
        "JSON answers say so"
    );

    let before = now_seconds();
    let acquired = server
        .acquire("mynamespace", "mylock", "instance-1", 60)
        .await;
    let after = now_seconds();
    assert_eq!(acquired.status, StatusCode::OK);
    let expiry = acquired.expiry();
    assert!(
        (before + 60..=after + 60).contains(&expiry),
        "expiry = now + D: {expiry}"
    );
    assert_eq!(
        acquired.json(),
        json!({"success":true,"namespace":"mynamespace","lockName":"mylock","owner":"anonymous",
               "instanceId":"instance-1","leaseDuration":60,"expiry":expiry})
    );
    // LSC's field order, for clients that compare text.
    assert!(
        acquired
            .text
            .starts_with(r#"{"success":true,"namespace":"mynamespace","lockName":"mylock","owner":"anonymous","instanceId":"instance-1","leaseDuration":60,"expiry":"#),
        "{}",
        acquired.text
    );
    let fence = acquired.fence_value();

    let held = server.status("mynamespace", "mylock").await;
    assert_eq!(
        held.json(),
        json!({"namespace":"mynamespace","lockName":"mylock","owner":"anonymous","expiry":expiry}),
        "GET never shows instanceId, leaseDuration or success"
    );
    assert_eq!(held.fence_value(), fence);

    let refused = server
        .acquire("mynamespace", "mylock", "instance-2", 60)
        .await;
    assert_eq!(refused.status, StatusCode::LOCKED);
    assert_eq!(
        refused.json(),
        json!({"success":false,"namespace":"mynamespace","lockName":"mylock"})
    );
    assert_eq!(refused.fence(), None, "a refusal shows no lock");

    let renewed = server
        .renew("mynamespace", "mylock", "instance-1", 60)
        .await;
    assert_eq!(renewed.status, StatusCode::OK);
    assert_eq!(
        renewed.json(),
        json!({"success":true,"namespace":"mynamespace","lockName":"mylock","owner":"anonymous",
               "instanceId":"instance-1","leaseDuration":120,"expiry":expiry + 60})
    );
    assert_eq!(renewed.fence_value(), fence);

    let released = server.release("mynamespace", "mylock", "instance-1").await;
    assert_eq!(released.status, StatusCode::OK);
    assert_eq!(
        released.json(),
        json!({"success":true,"namespace":"mynamespace","lockName":"mylock"})
    );
    assert_eq!(released.fence(), None);
    assert_eq!(
        server.status("mynamespace", "mylock").await.json(),
        json!({"namespace":"mynamespace","lockName":"mylock"})
    );
}

#[tokio::test]
async fn unmapped_paths_are_404() {
    let server = TestServer::memory().await;
    for path in [
        "/v1/mynamespace/lock",
        "/v1/mynamespace/lock/mylock/",
        "/v1/mynamespace/lock/mylock/steal",
        "/v1/mynamespace/locks/mylock",
        "/v1",
        "/v2/mynamespace/lock/mylock",
        "/nothing-here",
    ] {
        for method in [Method::GET, Method::POST] {
            let reply = server.send(method.clone(), path, &[], "{}").await;
            assert_eq!(reply.status, StatusCode::NOT_FOUND, "{method} {path}");
            assert_error_id(&reply.json(), "Resource not found");
        }
    }
}

#[tokio::test]
async fn wrong_methods_are_405() {
    let server = TestServer::memory().await;
    let status_path = "/v1/mynamespace/lock/mylock";
    let mut cases = vec![
        (Method::POST, status_path.to_owned()),
        (Method::PUT, status_path.to_owned()),
        (Method::DELETE, status_path.to_owned()),
        (Method::PATCH, status_path.to_owned()),
    ];
    for operation in ["acquire", "renew", "release"] {
        let path = format!("{status_path}/{operation}");
        for method in [Method::GET, Method::PUT, Method::DELETE, Method::PATCH] {
            cases.push((method, path.clone()));
        }
    }
    for (method, path) in cases {
        let reply = server.send(method.clone(), &path, &[], "").await;
        assert_eq!(
            reply.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        assert_error_id(&reply.json(), "Method not allowed");
    }
    let head = server
        .send(Method::HEAD, &format!("{status_path}/acquire"), &[], "")
        .await;
    assert_eq!(head.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn head_and_options() {
    let server = TestServer::memory().await;
    let head = server
        .send(Method::HEAD, "/v1/mynamespace/lock/mylock", &[], "")
        .await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.text, "");
    let options = server
        .send(Method::OPTIONS, "/v1/mynamespace/lock/mylock", &[], "")
        .await;
    assert_eq!(options.status, StatusCode::OK);
    assert_eq!(options.headers["allow"], "GET, HEAD, OPTIONS");
    let options = server
        .send(
            Method::OPTIONS,
            "/v1/mynamespace/lock/mylock/acquire",
            &[],
            "",
        )
        .await;
    assert_eq!(options.headers["allow"], "POST, OPTIONS");
}

#[tokio::test]
async fn backend_failures_are_503() {
    let backend = flaky_backend();
    let server = TestServer::start(Arc::new(backend.clone()), Auth::disabled()).await;
    assert_eq!(
        server
            .acquire("mynamespace", "mylock", "abc", 30)
            .await
            .status,
        StatusCode::OK
    );

    backend.fail(true);
    let replies = [
        server.status("mynamespace", "mylock").await,
        server.acquire("mynamespace", "mylock", "abc", 30).await,
        server.acquire("mynamespace", "other", "abc", 30).await,
        server.renew("mynamespace", "mylock", "abc", 30).await,
        server.release("mynamespace", "mylock", "abc").await,
    ];
    for reply in replies {
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            reply.text
        );
        assert_error_id(&reply.json(), "Lock backend unavailable");
        assert_eq!(reply.fence(), None);
    }
    // Validation still answers first: it needs no backend.
    let invalid = server
        .post("/v1/mynamespace/lock/mylock/release", "{}")
        .await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);

    let ready = server.get("/ready").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready.json(), json!({"status":"DOWN"}));
    assert_eq!(
        server.get("/actuator/health").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let health = server.get("/health").await;
    assert_eq!(
        health.status,
        StatusCode::OK,
        "liveness does not depend on the backend"
    );

    backend.fail(false);
    assert_eq!(server.get("/ready").await.json(), json!({"status":"UP"}));
    assert_eq!(
        server.get("/actuator/health").await.json(),
        json!({"status":"UP"})
    );
    let held = server.status("mynamespace", "mylock").await;
    assert_eq!(
        held.json()["owner"],
        "anonymous",
        "the failed calls changed nothing"
    );
    assert_eq!(
        server.status("mynamespace", "other").await.fence(),
        None,
        "the failed acquire took nothing"
    );
}

#[tokio::test]
async fn documentation_and_static_pages() {
    let server = TestServer::memory().await;
    let openapi = server.get("/openapi.yaml").await;
    assert_eq!(openapi.status, StatusCode::OK);
    assert_eq!(openapi.headers["content-type"], "application/yaml");
    assert_eq!(openapi.text, syncguard_server::OPENAPI_YAML);
    for needle in [
        "openapi: 3.0.3",
        "/v1/{namespace}/lock/{lockName}:",
        "/v1/{namespace}/lock/{lockName}/acquire:",
        "/v1/{namespace}/lock/{lockName}/renew:",
        "/v1/{namespace}/lock/{lockName}/release:",
        "Fencing-Token:",
        "additionalProperties: false",
        "maximum: 86400",
    ] {
        assert!(openapi.text.contains(needle), "openapi.yaml has {needle}");
    }
    for path in ["/", "/index.html"] {
        let page = server.get(path).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(
            page.text.contains("/openapi.yaml"),
            "{path} loads the description"
        );
    }
    let robots = server.get("/robots.txt").await;
    assert_eq!(robots.text, "User-agent: *\nDisallow: /\n");
    assert_eq!(server.get("/health").await.json(), json!({"status":"UP"}));
}
