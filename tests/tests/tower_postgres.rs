//! `syncguard-tower` end to end on PostgreSQL: an axum server and a hyper client over loopback
//! HTTP.

mod support;

use std::time::Duration;

use syncguard::LockBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_layer_on_postgres() {
    one_key_at_a_time_over_http(support::postgres().await).await;
}

/// Concurrent requests with one key: one runs (outliving its 500 ms ttl thanks to the
/// heartbeat), the others get 423 with Retry-After; other keys run meanwhile; the next request
/// after the first finished gets the key and a higher fence.
async fn one_key_at_a_time_over_http<B: LockBackend + 'static>(backend: B) {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use syncguard_tower::{HeldLock, LockLayer, key};

    let prefix = format!("{}:", support::unique("tower"));
    let app = Router::new()
        .route(
            "/jobs",
            post(|lock: HeldLock| async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                lock.fence().get().to_string()
            }),
        )
        .layer(
            LockLayer::new(backend, key::header("idempotency-key").with_prefix(prefix))
                .with_ttl(Duration::from_millis(500)),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let post = |key: &str| {
        let request = Request::post(format!("{base}/jobs"))
            .header("idempotency-key", key)
            .body(Body::empty())
            .unwrap();
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let (parts, body) = response.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            (parts, String::from_utf8(body.to_vec()).unwrap())
        }
    };

    let started = std::time::Instant::now();
    let calls: Vec<_> = ["same", "same", "same", "same", "other"]
        .into_iter()
        .map(|key| tokio::spawn(post(key)))
        .collect();
    let mut ok_fences = Vec::new();
    let mut locked = 0;
    for call in calls {
        let (parts, body) = call.await.unwrap();
        match parts.status {
            StatusCode::OK => ok_fences.push(body.parse::<u64>().unwrap()),
            StatusCode::LOCKED => {
                locked += 1;
                let seconds: u64 = parts.headers["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!((1..=2).contains(&seconds), "Retry-After {seconds}");
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!((ok_fences.len(), locked), (2, 3), "one per key ran");
    assert!(
        started.elapsed() < Duration::from_millis(2900),
        "the two keys ran in parallel"
    );
    let (parts, body) = post("same").await;
    assert_eq!(parts.status, StatusCode::OK, "{body}");
    assert!(body.parse::<u64>().unwrap() > 1, "the fence grew: {body}");
}
