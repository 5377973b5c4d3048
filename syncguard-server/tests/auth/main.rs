//! Authentication over real HTTP: JWTs signed with RSA keys this test generates, verified
//! against a JWKS (and an OpenID discovery document) the test serves on loopback; the
//! disabled and unconfigured modes.

mod keys;
mod slow_keys;
#[path = "../support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use http::Method;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use keys::{KeyServer, keys};
use serde_json::{Value, json};
use support::{Reply, TestServer, now_seconds};
use syncguard::MemoryBackend;
use syncguard_server::{Auth, AuthSettings, JwtSettings};

/// Claims of a valid token for `sub`.
fn claims(sub: &str) -> Value {
    let now = now_seconds();
    json!({"sub": sub, "iat": now, "exp": now + 300})
}

async fn lsc_server(settings: JwtSettings) -> TestServer {
    let auth = Auth::from_settings(&AuthSettings::jwt(settings)).unwrap();
    TestServer::start(Arc::new(MemoryBackend::new()), auth).await
}

async fn call(
    server: &TestServer,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Reply {
    let bearer = token.map(|token| format!("Bearer {token}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer.as_str()));
    }
    server.send(method, path, &headers, body).await
}

async fn acquire(server: &TestServer, token: Option<&str>, name: &str, instance: &str) -> Reply {
    call(
        server,
        Method::POST,
        &format!("/v1/auth/lock/{name}/acquire"),
        token,
        &format!(r#"{{"instanceId":"{instance}","leaseDuration":30}}"#),
    )
    .await
}

fn assert_unauthorized(reply: &Reply, invalid_token: bool) {
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.text);
    assert_eq!(reply.text, "", "Spring's 401 has no body");
    let challenge = reply.headers["www-authenticate"].to_str().unwrap();
    assert!(challenge.starts_with("Bearer"), "{challenge}");
    assert_eq!(
        challenge.contains("error=\"invalid_token\""),
        invalid_token,
        "{challenge}"
    );
}

#[tokio::test]
async fn the_owner_is_the_subject() {
    let (key, _) = keys();
    let jwks = KeyServer::start(&[key]).await;
    let server = lsc_server(JwtSettings::from_jwks(jwks.jwks_url())).await;
    let alice = key.sign(&claims("alice"));
    let bob = key.sign(&claims("bob"));

    let acquired = acquire(&server, Some(&alice), "owned", "shared-instance").await;
    assert_eq!(acquired.status, StatusCode::OK, "{}", acquired.text);
    assert_eq!(acquired.json()["owner"], "alice");
    let status = call(&server, Method::GET, "/v1/auth/lock/owned", Some(&bob), "").await;
    assert_eq!(status.json()["owner"], "alice");

    // Same instanceId, another owner: another holder.
    assert_eq!(
        acquire(&server, Some(&bob), "owned", "shared-instance")
            .await
            .status,
        StatusCode::LOCKED
    );
    let release = r#"{"instanceId":"shared-instance"}"#;
    let bob_release = call(
        &server,
        Method::POST,
        "/v1/auth/lock/owned/release",
        Some(&bob),
        release,
    )
    .await;
    assert_eq!(bob_release.status, StatusCode::LOCKED);
    let alice_release = call(
        &server,
        Method::POST,
        "/v1/auth/lock/owned/release",
        Some(&alice),
        release,
    )
    .await;
    assert_eq!(alice_release.status, StatusCode::OK);
    assert_eq!(jwks.fetches(), 1, "the keys are cached");
}

#[tokio::test]
async fn no_token_is_401_before_routing() {
    let (key, _) = keys();
    let jwks = KeyServer::start(&[key]).await;
    let server = lsc_server(JwtSettings::from_jwks(jwks.jwks_url())).await;
    for (method, path) in [
        (Method::GET, "/v1/auth/lock/mylock"),
        (Method::POST, "/v1/auth/lock/mylock/acquire"),
        (Method::GET, "/v1/auth/lock/mylock/acquire"),
        (Method::GET, "/v1/auth/lock"),
        (Method::POST, "/v1/x/lock/y/acquire"),
    ] {
        let reply = call(&server, method.clone(), path, None, "{}").await;
        assert_unauthorized(&reply, false);
    }
    let basic = server
        .send(
            Method::GET,
            "/v1/auth/lock/mylock",
            &[("authorization", "Basic YWxpY2U6c2VjcmV0")],
            "",
        )
        .await;
    assert_unauthorized(&basic, false);
    // Outside /v1, nothing is authenticated.
    assert_eq!(server.get("/health").await.status, StatusCode::OK);
    assert_eq!(server.get("/ready").await.status, StatusCode::OK);
    assert_eq!(server.get("/openapi.yaml").await.status, StatusCode::OK);
    assert_eq!(server.get("/elsewhere").await.status, StatusCode::NOT_FOUND);
    assert_eq!(jwks.fetches(), 0, "no token, no key fetch");
}

#[tokio::test]
async fn invalid_tokens_are_401() {
    let (key, other) = keys();
    let jwks = KeyServer::start(&[key]).await;
    let server = lsc_server(
        JwtSettings::from_jwks(jwks.jwks_url())
            .issuer("https://idp.test")
            .audience("locks"),
    )
    .await;
    let now = now_seconds();
    let valid = json!({"sub":"alice","iss":"https://idp.test","aud":"locks","exp":now + 300});
    let with = |patch: Value| {
        let mut claims = valid.clone();
        for (name, value) in patch.as_object().unwrap() {
            if value.is_null() {
                claims.as_object_mut().unwrap().remove(name);
            } else {
                claims[name] = value.clone();
            }
        }
        claims
    };
    let hs256 = encode(
        &Header::new(Algorithm::HS256),
        &valid,
        &EncodingKey::from_secret(b"a shared secret"),
    )
    .unwrap();
    let rejected = [
        (
            "signed by another key under a published id",
            other.sign_as("key-a", &valid),
        ),
        ("signed by an unpublished key", other.sign(&valid)),
        (
            "expired beyond the 60 s skew",
            key.sign(&with(json!({"exp": now - 120}))),
        ),
        (
            "not yet valid beyond the skew",
            key.sign(&with(json!({"nbf": now + 300}))),
        ),
        (
            "another issuer",
            key.sign(&with(json!({"iss":"https://evil.test"}))),
        ),
        ("no issuer", key.sign(&with(json!({"iss": null})))),
        ("another audience", key.sign(&with(json!({"aud":"other"})))),
        ("no audience", key.sign(&with(json!({"aud": null})))),
        ("no subject", key.sign(&with(json!({"sub": null})))),
        ("an empty subject", key.sign(&with(json!({"sub": ""})))),
        ("HS256", hs256),
        (
            "alg none",
            "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.".to_owned(),
        ),
        ("garbage", "not-a-jwt".to_owned()),
    ];
    for (case, token) in &rejected {
        let reply = acquire(&server, Some(token), "guarded", "abc").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{case}");
        assert_unauthorized(&reply, true);
    }
    let status = call(
        &server,
        Method::GET,
        "/v1/auth/lock/guarded",
        Some(&key.sign(&valid)),
        "",
    )
    .await;
    assert_eq!(
        status.json(),
        json!({"namespace":"auth","lockName":"guarded"}),
        "nothing was taken"
    );

    let accepted = [
        ("valid", key.sign(&valid)),
        (
            "expired within the skew",
            key.sign(&with(json!({"exp": now - 30}))),
        ),
        (
            "not yet valid within the skew",
            key.sign(&with(json!({"nbf": now + 30}))),
        ),
        (
            "audience among several",
            key.sign(&with(json!({"aud": ["other", "locks"]}))),
        ),
        (
            "no expiry (as Spring)",
            key.sign(&with(json!({"exp": null}))),
        ),
    ];
    for (i, (case, token)) in accepted.iter().enumerate() {
        let reply = acquire(&server, Some(token), &format!("accepted{i}"), "abc").await;
        assert_eq!(reply.status, StatusCode::OK, "{case}: {}", reply.text);
        assert_eq!(reply.json()["owner"], "alice");
    }
    let lowercase = server
        .send(
            Method::GET,
            "/v1/auth/lock/guarded",
            &[("authorization", &format!("bearer {}", key.sign(&valid)))],
            "",
        )
        .await;
    assert_eq!(lowercase.status, StatusCode::OK, "the scheme in any case");
}

#[tokio::test]
async fn critical_header_extensions_are_401() {
    let (key, _) = keys();
    let jwks = KeyServer::start(&[key]).await;
    let server = lsc_server(JwtSettings::from_jwks(jwks.jwks_url())).await;
    let valid = claims("alice");
    for crit in [&["x-unknown"][..], &["x-unknown", "b64"], &["kid"], &[]] {
        let reply = acquire(
            &server,
            Some(&key.sign_critical(crit, &valid)),
            "critical",
            "abc",
        )
        .await;
        assert_unauthorized(&reply, true);
        let challenge = reply.headers["www-authenticate"].to_str().unwrap();
        assert!(challenge.contains("crit"), "{crit:?}: {challenge}");
    }
    assert_eq!(jwks.fetches(), 0, "refused before its keys are looked up");
    let status = call(
        &server,
        Method::GET,
        "/v1/auth/lock/critical",
        Some(&key.sign(&valid)),
        "",
    )
    .await;
    assert_eq!(
        status.json(),
        json!({"namespace":"auth","lockName":"critical"}),
        "nothing was taken; the same token without crit is accepted"
    );
}

#[tokio::test]
async fn repeated_claims_are_401() {
    let (key, _) = keys();
    let jwks = KeyServer::start(&[key]).await;
    let server = lsc_server(JwtSettings::from_jwks(jwks.jwks_url()).audience("locks")).await;
    let now = now_seconds();
    let valid = [
        ("sub", json!("alice")),
        ("aud", json!("locks")),
        ("exp", json!(now + 300)),
    ];
    // Each would be accepted alone: the repeat itself is what is refused.
    let repeated = [
        ("sub", json!("bob")),
        ("aud", json!("locks")),
        ("exp", json!(now + 600)),
    ];
    for (i, again) in repeated.iter().enumerate() {
        let mut entries = valid.to_vec();
        entries.insert(i + 1, again.clone());
        let reply = acquire(
            &server,
            Some(&key.sign_entries(&entries)),
            "repeated",
            "abc",
        )
        .await;
        assert_unauthorized(&reply, true);
    }
    let reply = acquire(&server, Some(&key.sign_entries(&valid)), "repeated", "abc").await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "without the repeat: {}",
        reply.text
    );
}

#[tokio::test]
async fn unknown_key_ids_refresh_the_keys_at_most_once_per_interval() {
    let (a, b) = keys();
    let jwks = KeyServer::start(&[a]).await;
    let patient =
        lsc_server(JwtSettings::from_jwks(jwks.jwks_url()).min_refresh(Duration::from_secs(3600)))
            .await;
    assert_eq!(
        acquire(&patient, Some(&a.sign(&claims("alice"))), "kid1", "abc")
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(jwks.fetches(), 1);
    jwks.publish(b);
    for _ in 0..3 {
        let reply = acquire(&patient, Some(&b.sign(&claims("alice"))), "kid2", "abc").await;
        assert_unauthorized(&reply, true);
    }
    assert_eq!(
        jwks.fetches(),
        1,
        "unknown key ids do not hammer the key server"
    );

    let eager =
        lsc_server(JwtSettings::from_jwks(jwks.jwks_url()).min_refresh(Duration::ZERO)).await;
    let fetches = jwks.fetches();
    assert_eq!(
        acquire(&eager, Some(&a.sign(&claims("alice"))), "kid3", "abc")
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        acquire(&eager, Some(&b.sign(&claims("bob"))), "kid4", "abc")
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        jwks.fetches(),
        fetches + 1,
        "one fetch: the set already had the rotated key"
    );
    let ghost = acquire(
        &eager,
        Some(&b.sign_as("key-c", &claims("bob"))),
        "kid5",
        "abc",
    )
    .await;
    assert_unauthorized(&ghost, true);
    assert_eq!(
        jwks.fetches(),
        fetches + 2,
        "an unknown key id fetches again"
    );
}

#[tokio::test]
async fn unreachable_keys_are_503_and_cached_keys_outlive_failures() {
    let (key, _) = keys();
    let jwks = KeyServer::start(&[key]).await;
    jwks.failing.store(true, Ordering::SeqCst);
    let server = lsc_server(
        JwtSettings::from_jwks(jwks.jwks_url())
            .cache_ttl(Duration::ZERO)
            .min_refresh(Duration::ZERO),
    )
    .await;
    let token = key.sign(&claims("alice"));
    let reply = acquire(&server, Some(&token), "keys", "abc").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["message"], "Token signing keys unavailable");
    assert!(uuid::Uuid::parse_str(reply.json()["errorId"].as_str().unwrap()).is_ok());

    jwks.failing.store(false, Ordering::SeqCst);
    assert_eq!(
        acquire(&server, Some(&token), "keys", "abc").await.status,
        StatusCode::OK
    );
    jwks.failing.store(true, Ordering::SeqCst);
    let fetches = jwks.fetches();
    let reply = acquire(&server, Some(&token), "keys", "abc").await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "stale keys serve while the key server fails"
    );
    // It did try again (in the background: the answer did not wait for it).
    jwks.wait_for_fetches(fetches + 1).await;

    let nowhere = lsc_server(JwtSettings::from_jwks("http://127.0.0.1:9/jwks")).await;
    let reply = acquire(&nowhere, Some(&token), "keys", "abc").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn keys_found_through_issuer_discovery() {
    let (key, _) = keys();
    let jwks = KeyServer::start(&[key]).await;
    let issuer = jwks.base.clone();
    let server = lsc_server(JwtSettings::from_issuer(&issuer)).await;
    let now = now_seconds();
    let token = key.sign(&json!({"sub":"carol","iss":issuer,"exp":now + 300}));
    let reply = acquire(&server, Some(&token), "discovered", "abc").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.json()["owner"], "carol");
    let foreign = key.sign(&json!({"sub":"carol","iss":"https://elsewhere","exp":now + 300}));
    assert_unauthorized(
        &acquire(&server, Some(&foreign), "discovered2", "abc").await,
        true,
    );
}

#[tokio::test]
async fn jwt_wins_over_disabled() {
    let (key, _) = keys();
    let jwks = KeyServer::start(&[key]).await;
    let mut settings = AuthSettings::jwt(JwtSettings::from_jwks(jwks.jwks_url()));
    settings.disabled = true;
    let auth = Auth::from_settings(&settings).unwrap();
    let server = TestServer::start(Arc::new(MemoryBackend::new()), auth).await;
    assert_unauthorized(&acquire(&server, None, "both", "abc").await, false);
    let reply = acquire(&server, Some(&key.sign(&claims("dave"))), "both", "abc").await;
    assert_eq!(reply.json()["owner"], "dave");
}

#[tokio::test]
async fn disabled_means_anonymous() {
    let server = TestServer::start(
        Arc::new(MemoryBackend::new()),
        Auth::from_settings(&AuthSettings::disabled()).unwrap(),
    )
    .await;
    let reply = acquire(&server, Some("ignored-token"), "anon", "abc").await;
    assert_eq!(reply.json()["owner"], "anonymous");
}

#[tokio::test]
async fn unconfigured_refuses_every_api_call() {
    let server = TestServer::start(
        Arc::new(MemoryBackend::new()),
        Auth::from_settings(&AuthSettings::default()).unwrap(),
    )
    .await;
    for (method, path) in [
        (Method::GET, "/v1/auth/lock/mylock"),
        (Method::POST, "/v1/auth/lock/mylock/acquire"),
        (Method::POST, "/v1/auth/lock/mylock/release"),
        (Method::GET, "/v1/nowhere"),
    ] {
        let reply = call(
            &server,
            method.clone(),
            path,
            None,
            r#"{"instanceId":"abc"}"#,
        )
        .await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{method} {path}");
        let body = reply.json();
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .starts_with("Access denied"),
            "{body}"
        );
        assert!(body["errorId"].is_string());
    }
    assert_eq!(server.get("/health").await.status, StatusCode::OK);
    assert_eq!(server.get("/openapi.yaml").await.status, StatusCode::OK);
}
