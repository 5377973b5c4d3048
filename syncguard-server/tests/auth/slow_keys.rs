//! A slow key server: the JWKS answers seconds after it is asked, and valid tokens are still
//! answered at once, whether the cache is refreshing an old set or fetching for a token that
//! names a key id the set lacks; and made-up key ids cause no more fetches than the
//! refresh interval allows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use http::Method;
use syncguard_server::JwtSettings;
use tokio::task::JoinSet;

use super::keys::{KeyServer, keys};
use super::support::{Reply, TestServer};
use super::{assert_unauthorized, call, claims, lsc_server};

/// How long the slow key server takes to answer.
const SLOW: Duration = Duration::from_millis(2500);
/// What "at once" means here, on a loaded 2-core machine: well under [`SLOW`].
const PROMPT: Duration = Duration::from_millis(1500);

/// A status call with `token`, and how long its answer took.
async fn timed_status(server: &TestServer, token: &str) -> (Reply, Duration) {
    let started = Instant::now();
    let reply = call(server, Method::GET, "/v1/auth/lock/slow", Some(token), "").await;
    (reply, started.elapsed())
}

/// `count` status calls with `token` at once, each answered (in the order they end).
async fn concurrent_statuses(
    server: &Arc<TestServer>,
    token: &str,
    count: usize,
) -> Vec<(Reply, Duration)> {
    let mut calls = JoinSet::new();
    for _ in 0..count {
        let server = Arc::clone(server);
        let token = token.to_owned();
        calls.spawn(async move { timed_status(&server, &token).await });
    }
    calls.join_all().await
}

fn assert_prompt_ok(replies: &[(Reply, Duration)], what: &str) {
    for (reply, took) in replies {
        assert_eq!(reply.status, StatusCode::OK, "{what}: {}", reply.text);
        assert!(
            *took < PROMPT,
            "{what}: a valid token waited {took:?} for the slow key server"
        );
    }
}

#[tokio::test]
async fn a_slow_refresh_does_not_hold_up_valid_tokens() {
    let (a, b) = keys();
    let jwks = KeyServer::start(&[a]).await;
    let server = Arc::new(
        lsc_server(
            JwtSettings::from_jwks(jwks.jwks_url())
                .cache_ttl(Duration::from_secs(1))
                .min_refresh(Duration::ZERO),
        )
        .await,
    );
    let valid = a.sign(&claims("alice"));
    assert_eq!(timed_status(&server, &valid).await.0.status, StatusCode::OK);
    assert_eq!(jwks.fetches(), 1);

    jwks.answer_after(SLOW);
    jwks.publish(b);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // The set is now older than the cache time: the first of these starts a refresh that
    // takes SLOW; all are answered from the old set meanwhile.
    let replies = concurrent_statuses(&server, &valid, 16).await;
    assert_prompt_ok(&replies, "during a slow refresh");
    jwks.wait_for_fetches(2).await;
    let replies = concurrent_statuses(&server, &valid, 4).await;
    assert_prompt_ok(&replies, "later during the same refresh");

    // Once the refresh ends, the new set is in use: a token of the key it added verifies
    // without another fetch.
    tokio::time::sleep(SLOW).await;
    let rotated = b.sign(&claims("bob"));
    let (reply, _) = timed_status(&server, &rotated).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(jwks.fetches(), 2, "one refresh for all those requests");
}

#[tokio::test]
async fn an_unknown_key_id_waits_alone_and_refetches_are_rate_limited() {
    let (a, _) = keys();
    let jwks = KeyServer::start(&[a]).await;
    let min_refresh = Duration::from_secs(3);
    let server = Arc::new(
        lsc_server(JwtSettings::from_jwks(jwks.jwks_url()).min_refresh(min_refresh)).await,
    );
    let valid = a.sign(&claims("alice"));
    // Signed before the clock matters: RSA signing is slow without optimizations.
    let forgeries: Vec<String> = (0..60)
        .map(|i| a.sign_as(&format!("made-up-{i}"), &claims("mallory")))
        .collect();
    let late_forgery = a.sign_as("made-up-late", &claims("mallory"));
    assert_eq!(timed_status(&server, &valid).await.0.status, StatusCode::OK);
    assert_eq!(jwks.fetches(), 1);
    jwks.answer_after(SLOW);
    // Past the refresh interval: a made-up key id may now cause one fetch.
    tokio::time::sleep(min_refresh + Duration::from_millis(100)).await;

    // Made-up key ids from anyone, for longer than the slow fetch: 20 at once, then one
    // every 100 ms for 4 s.
    let flood_start = Instant::now();
    let mut forged = JoinSet::new();
    for (i, token) in (0_u64..).zip(forgeries) {
        let server = Arc::clone(&server);
        let send_after = Duration::from_millis(100 * i.saturating_sub(19));
        forged.spawn(async move {
            tokio::time::sleep(send_after).await;
            timed_status(&server, &token).await
        });
    }
    jwks.wait_for_fetches(2).await;
    // Valid tokens meanwhile, several times during the fetch the forgeries caused.
    for round in 0..4 {
        let replies = concurrent_statuses(&server, &valid, 4).await;
        assert_prompt_ok(&replies, &format!("round {round} of valid tokens"));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let forged = forged.join_all().await;
    for (reply, _) in &forged {
        assert_unauthorized(reply, true);
    }
    let waited_for_the_fetch = forged.iter().filter(|(_, took)| *took > PROMPT).count();
    assert!(
        waited_for_the_fetch >= 1,
        "the forgery that caused the fetch waited for it"
    );
    assert!(
        flood_start.elapsed() < SLOW + min_refresh,
        "the flood ended within the interval after the fetch (test too slow to judge)"
    );
    assert_eq!(
        jwks.fetches(),
        2,
        "one fetch for every made-up key id, however slow the key server"
    );

    // Within the interval after that fetch, another made-up key id fetches nothing and is
    // refused at once.
    let (reply, took) = timed_status(&server, &late_forgery).await;
    assert_unauthorized(&reply, true);
    assert!(took < PROMPT, "refused at once: {took:?}");
    assert_eq!(jwks.fetches(), 2);
}
