//! The `Retry-After` of a contended answer, through an axum router with the layer
//! (`oneshot`): when the holder is likely done, from the holds the layer has seen, bounded by
//! `with_max_retry_after`; not the holder's lease, which its heartbeat renews.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use syncguard::MemoryBackend;
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
/// 5 s bound; once one has, what is likely left of it (1.2 s, rounded up), and a client that
/// waits that long gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_follows_the_holds_not_the_lease() {
    let app = app(|layer| layer);
    assert_eq!(
        contended(&app).await,
        (StatusCode::LOCKED, Some(5)),
        "the default bound, not 31"
    );

    // One hold of 1.5 s has ended: the next contender is told what is likely left of the
    // next one (1.2 s, rounded up to 2), never less than is left of it by then.
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
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
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
