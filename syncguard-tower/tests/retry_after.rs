//! The `Retry-After` of a contended answer, through an axum router with the layer
//! (`oneshot`): when the holder is likely done, from the holds the layer has seen, bounded by
//! `with_max_retry_after` and by the holder's lease as the refusal reported it (no second
//! call to the backend); not the lease alone, which the holder's heartbeat renews.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use syncguard::conformance::FaultyBackend;
use syncguard::{LockOptions, MemoryBackend};
use syncguard_tower::protocol::Http;
use syncguard_tower::{LockLayer, key};
use tower::ServiceExt;

/// `POST /orders/{id}/pay`, a 1.5 s handler under the layer's default options (ttl 30 s).
fn app(
    layer: impl FnOnce(LockLayer<key::Resource, Http, Body>) -> LockLayer<key::Resource, Http, Body>,
) -> Router {
    let locks = LockLayer::for_axum(MemoryBackend::new(), key::resource("order", "id"));
    Router::new()
        .route(
            "/orders/{id}/pay",
            post(|| async {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                "paid"
            }),
        )
        .route_layer(layer(locks))
}

/// The status and `Retry-After` (if any) of a payment of order 42.
async fn pay(app: &Router) -> (StatusCode, Option<u64>) {
    let request = Request::post("/orders/42/pay").body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().unwrap().parse().unwrap());
    (response.status(), retry_after)
}

/// A payment in progress, and a second one 300 ms into it: the second's answer.
async fn contended(app: &Router) -> (StatusCode, Option<u64>) {
    let first = tokio::spawn({
        let app = app.clone();
        async move { pay(&app).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = pay(app).await;
    assert_eq!(first.await.unwrap(), (StatusCode::OK, None));
    second
}

/// The case: a 1.5 s handler made the layer answer `Retry-After: 31` (the 30 s ttl,
/// renewed by the heartbeat, plus the tolerance). Before any hold has ended the hint is the
/// 5 s bound; once one has, the mean hold (1.5 s, rounded up to 2), and a client that waits
/// that long gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_follows_the_holds_not_the_lease() {
    let app = app(|layer| layer);
    assert_eq!(
        contended(&app).await,
        (StatusCode::LOCKED, Some(5)),
        "the default bound, not 31"
    );

    // One hold of 1.5 s has ended: the next contender is told the mean hold (rounded up to 2),
    // never less than is left of the holder's by then.
    let started = tokio::time::Instant::now();
    let first = tokio::spawn({
        let app = app.clone();
        async move { pay(&app).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, retry_after) = pay(&app).await;
    let answered = started.elapsed();
    assert_eq!(status, StatusCode::LOCKED);
    let retry_after = retry_after.expect("a Retry-After");
    assert_eq!(retry_after, 2, "the 1.5 s mean hold, rounded up");
    // A client that waits as told comes back after the holder's 1.5 s (the layer counts the
    // hold from when the backend took the lock, no sooner than this test's start).
    assert!(
        answered + Duration::from_secs(retry_after) >= Duration::from_millis(1500),
        "told {retry_after} s at {answered:?}: back before the hold ends"
    );
    tokio::time::sleep_until(started + answered + Duration::from_secs(retry_after)).await;
    assert_eq!(first.await.unwrap(), (StatusCode::OK, None));
    assert_eq!(pay(&app).await, (StatusCode::OK, None));
}

/// `with_max_retry_after` bounds the hint, at least at a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_is_a_setting() {
    let one_second = app(|layer| layer.with_max_retry_after(Duration::from_secs(1)));
    assert_eq!(contended(&one_second).await, (StatusCode::LOCKED, Some(1)));
    let zero = app(|layer| layer.with_max_retry_after(Duration::ZERO));
    assert_eq!(
        contended(&zero).await,
        (StatusCode::LOCKED, Some(1)),
        "a zero bound is a second"
    );
}

/// A refused request costs the backend one acquire and nothing else: the hint comes from the
/// refusal's holder expiry. With no hold of the layer ended yet, it follows the holder's lease
/// (its ttl, which no heartbeat renews here, plus the 1 s tolerance, rounded up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_makes_no_lookup_and_its_hint_follows_the_holders_lease() {
    let backend = FaultyBackend::new(MemoryBackend::new());
    let locks = LockLayer::for_axum(backend.clone(), key::resource("order", "id"))
        .with_max_retry_after(Duration::from_secs(60));
    let app = Router::new()
        .route("/orders/{id}/pay", post(|| async { "paid" }))
        .route_layer(locks);

    for (order, lease_secs) in [(7, 3), (8, 9)] {
        let holder = LockOptions::builder()
            .ttl(Duration::from_secs(lease_secs))
            .heartbeat(false)
            .build()
            .unwrap();
        let _held = syncguard::acquire(&backend, &format!("order:{order}"), &holder)
            .await
            .unwrap();
        let reads = backend.reads();
        let request = Request::post(format!("/orders/{order}/pay"))
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::LOCKED);
        assert_eq!(backend.reads(), reads, "the refusal looked the holder up");
        let retry_after: u64 = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        // The lease plus the tolerance, less the moments since it was taken, rounded up.
        assert!(
            (lease_secs..=lease_secs + 1).contains(&retry_after),
            "a {lease_secs} s lease: Retry-After {retry_after}"
        );
    }
}
