//! Backend-independent `#[locked]` scenarios, run by each backend's test file, and the
//! connections to the test services.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use syncguard::{
    ErrorCode, LockBackend, LockError, LockId, LockOptions, LostReason, RetryPolicy, locked,
};

pub fn service_url(variable: &str, install: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| {
        panic!(
            "{variable} is not set: run `bash scripts/test-all.sh`, which installs {install} and \
             starts it on a free port"
        )
    })
}

pub async fn postgres() -> syncguard::postgres::PostgresBackend {
    use syncguard::postgres::{PostgresBackend, setup_schema};
    let url = service_url(
        "SYNCGUARD_TEST_POSTGRES_URL",
        "PostgreSQL (apt-get install postgresql)",
    );
    let backend = PostgresBackend::connect(&url)
        .await
        .expect("connect to PostgreSQL");
    setup_schema(backend.pool(), backend.config())
        .await
        .expect("setup_schema");
    backend
}

pub async fn redis() -> syncguard::RedisBackend {
    let url = service_url(
        "SYNCGUARD_TEST_REDIS_URL",
        "redis-server (apt-get install redis-server)",
    );
    syncguard::RedisBackend::connect(&url)
        .await
        .expect("connect to Redis")
}

/// A key no other test run uses.
pub fn unique(label: &str) -> String {
    format!("e2e:{label}:{}", LockId::generate())
}

/// Holds the lock for longer than its 500 ms ttl (the heartbeat keeps it) and records how
/// many holders were inside at once.
#[locked(key = "{key}", backend = backend, ttl = "500ms", wait = "30s", retry_delay = "20ms", guard = lock)]
async fn hold<B: LockBackend + Clone + 'static>(
    backend: &B,
    key: &str,
    inside: &AtomicUsize,
    overlaps: &AtomicUsize,
    hold_for: Duration,
) -> Result<u64, LockError> {
    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
        overlaps.fetch_add(1, Ordering::SeqCst);
    }
    tokio::time::sleep(hold_for).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(lock.fence().get())
}

/// Calls on one key run one at a time, each outliving the ttl, with increasing fences; calls
/// on different keys overlap.
pub async fn locked_calls_exclude_and_outlive_the_ttl<B: LockBackend + Clone + 'static>(
    backend: B,
) {
    let key = unique("same");
    let (inside, overlaps) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let (backend, key) = (backend.clone(), key.clone());
            let (inside, overlaps) = (Arc::clone(&inside), Arc::clone(&overlaps));
            tokio::spawn(async move {
                hold(
                    &backend,
                    &key,
                    &inside,
                    &overlaps,
                    Duration::from_millis(1200),
                )
                .await
            })
        })
        .collect();
    let mut fences = Vec::new();
    for call in calls {
        fences.push(
            call.await
                .unwrap()
                .expect("each call gets the lock in turn"),
        );
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    fences.sort_unstable();
    assert_eq!(fences, [1, 2, 3]);
    assert!(
        !backend.is_locked(&key).await.unwrap(),
        "released at the end"
    );

    let (inside, overlaps) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let (backend, key) = (backend.clone(), unique(&format!("different{i}")));
            let (inside, overlaps, max_inside) = (
                Arc::clone(&inside),
                Arc::clone(&overlaps),
                Arc::clone(&max_inside),
            );
            tokio::spawn(async move {
                let watch = async {
                    loop {
                        max_inside.fetch_max(inside.load(Ordering::SeqCst), Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                };
                tokio::select! {
                    result = hold(&backend, &key, &inside, &overlaps, Duration::from_millis(800)) => result,
                    () = watch => unreachable!(),
                }
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(
        max_inside.load(Ordering::SeqCst),
        3,
        "different keys run together"
    );
}

#[locked(key = "{key}", backend = backend, ttl = "600ms", guard = lock)]
async fn stolen<B: LockBackend + Clone + 'static>(backend: &B, key: &str) -> Result<(), LockError> {
    // Another client releases the lock behind this holder's back.
    assert!(backend.release(lock.lock_id()).await?.is_released());
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(())
}

/// A lock lost mid-call cancels the body and surfaces as `LockLost`.
pub async fn lost_lock_cancels_the_locked_body<B: LockBackend + Clone + 'static>(backend: B) {
    let error = tokio::time::timeout(Duration::from_secs(20), stolen(&backend, &unique("stolen")))
        .await
        .expect("cancelled long before the body's 60 s")
        .unwrap_err();
    assert_eq!(error.lost_reason(), Some(LostReason::NotHeld), "{error}");
    let lock = error.lock().expect("the error names the lock");
    assert_eq!(lock.key(), None, "keys are not shown by default");
    assert!(error.to_string().contains(lock.key_hash()), "{error}");
}

#[locked(key = "{key}", backend = backend, wait = false)]
async fn once<B: LockBackend + Clone + 'static>(backend: &B, key: &str) -> Result<(), LockError> {
    Ok(())
}

#[locked(key = "{key}", backend = backend, wait = "300ms", retry_delay = "50ms", show_key = true)]
async fn briefly<B: LockBackend + Clone + 'static>(
    backend: &B,
    key: &str,
) -> Result<(), LockError> {
    Ok(())
}

/// A key held elsewhere: a call that may not wait gets `Contended` naming the lock by its key
/// hash, one that waits gets `AcquisitionTimeout` (naming the key too, with `show_key`), and
/// `try_acquire` gets `None`; once released, all of them get the lock.
pub async fn contention_is_reported_by_each_entry_point<B: LockBackend + Clone + 'static>(
    backend: B,
) {
    let key = unique("held");
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(10))
        .retry(RetryPolicy::single_attempt())
        .build()
        .unwrap();
    let held = syncguard::acquire(&backend, &key, &options).await.unwrap();
    let held_fence = held.fence();

    let error = once(&backend, &key).await.unwrap_err();
    assert_eq!(
        error.code(),
        ErrorCode::Contended,
        "a single attempt on a held key: {error:?}"
    );
    let lock = error.lock().expect("names its lock");
    assert_eq!(lock.key_hash(), held.name().key_hash());
    assert_eq!(lock.key(), None);
    assert!(error.is_contended() && error.is_retryable());

    let error = briefly(&backend, &key).await.unwrap_err();
    assert_eq!(
        error.code(),
        ErrorCode::AcquisitionTimeout,
        "a wait that ran out: {error:?}"
    );
    let lock = error.lock().expect("names its lock");
    assert!(error.attempts().unwrap() > 1, "it retried: {error}");
    assert_eq!(
        lock.key(),
        Some(key.as_str()),
        "show_key = true names the key"
    );
    assert!(error.to_string().contains(&key), "{error}");

    let busy = syncguard::try_acquire(&backend, &key, &options)
        .await
        .unwrap();
    assert!(busy.is_none(), "try_acquire reports contention as None");
    let error = syncguard::acquire(&backend, &key, &options)
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Contended, "{error}");

    assert!(held.release().await.unwrap());
    once(&backend, &key).await.unwrap();
    briefly(&backend, &key).await.unwrap();
    let guard = syncguard::try_acquire(&backend, &key, &options)
        .await
        .unwrap()
        .expect("free once released");
    assert!(guard.fence() > held_fence, "the fence grew");
    assert!(guard.release().await.unwrap());
}

/// Concurrent requests with one key: one runs (outliving its 500 ms ttl thanks to the
/// heartbeat), the others get 423 with Retry-After; other keys run meanwhile; the next request
/// after the first finished gets the key and a higher fence.
pub async fn one_key_at_a_time_over_http<B: LockBackend + 'static>(backend: B) {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use syncguard_tower::{HeldLock, LockLayer, key};

    let prefix = format!("{}:", unique("tower"));
    let app = Router::new()
        .route(
            "/jobs",
            post(|lock: HeldLock| async move {
                let first_expiry = lock.expires_at_ms();
                tokio::time::sleep(Duration::from_millis(1500)).await;
                // The heartbeat kept the lock past its ttl, and the handle shows it.
                let kept = lock.is_held()
                    && lock.held_for() >= Duration::from_millis(1500)
                    && lock.expires_at_ms() > first_expiry
                    && lock.ttl() == Duration::from_millis(500)
                    && lock.key().starts_with("e2e:tower:");
                if kept {
                    (StatusCode::OK, lock.fence().get().to_string())
                } else {
                    (StatusCode::INTERNAL_SERVER_ERROR, format!("{lock:?}"))
                }
            }),
        )
        .layer(
            LockLayer::for_axum(backend, key::header("idempotency-key").with_prefix(prefix))
                .with_options(
                    LockOptions::builder()
                        .ttl(Duration::from_millis(500))
                        .retry(RetryPolicy::single_attempt())
                        .build()
                        .unwrap(),
                ),
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

/// `Retry-After` from the holds the layer has seen, not the holder's lease: under the default
/// 30 s ttl (renewed by the heartbeat), a 1.5 s handler made the layer answer 31. A contender
/// 300 ms into a hold is told 5 s (the default bound) before any hold has ended, then at most
/// 2 s (the 1.5 s mean hold, rounded up), and a client that waits that long gets in. The
/// holder's lease comes with the backend's refusal (no lookup).
pub async fn retry_after_follows_the_holds_over_http<B: LockBackend + 'static>(backend: B) {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use http::{Request, StatusCode};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use syncguard_tower::{LockLayer, key};

    // A resource of this run's own (no `:` in a resource name).
    let resource = format!("e2e-order-{}", LockId::generate());
    let app = Router::new()
        .route(
            "/orders/{id}/pay",
            post(|| async {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                "paid"
            }),
        )
        .route_layer(LockLayer::for_axum(backend, key::resource(resource, "id")));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/orders/42/pay", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let pay = move || {
        let request = Request::post(&url).body(Body::empty()).unwrap();
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let retry_after = response.headers().get("retry-after");
            let retry_after =
                retry_after.map(|value| value.to_str().unwrap().parse::<u64>().unwrap());
            (response.status(), retry_after)
        }
    };

    for bound in [Some(5), None] {
        let first = tokio::spawn(pay());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (status, retry_after) = pay().await;
        assert_eq!(status, StatusCode::LOCKED);
        let retry_after = retry_after.expect("a Retry-After");
        match bound {
            Some(bound) => assert_eq!(retry_after, bound, "no hold has ended yet"),
            None => {
                assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
                tokio::time::sleep(Duration::from_secs(retry_after)).await;
                assert_eq!(pay().await, (StatusCode::OK, None), "in after Retry-After");
            }
        }
        assert_eq!(first.await.unwrap(), (StatusCode::OK, None));
    }
}
