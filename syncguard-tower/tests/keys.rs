//! Which requests share a lock, and what happens to a request without a key, through an axum
//! router with the layer (`oneshot`): a key function that finds nothing refuses the request,
//! naming what is missing in the answer and in a warning, and never runs the handler unlocked
//! unless the layer says so; `key::resource` locks one resource across its routes, and keeps
//! resources of different kinds apart.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::routing::{get, post};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use syncguard::{LockOptions, MemoryBackend, RetryPolicy};
use syncguard_tower::{HeldLock, Keyless, LockLayer, MakeKey, key};
use tower::ServiceExt;

use support::Recorder;

/// The status and body of `method path` on `app`, with an `Idempotency-Key` if given.
async fn call(
    app: &Router,
    method: &str,
    path: &str,
    idempotency_key: Option<&str>,
) -> (StatusCode, String) {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(key) = idempotency_key {
        request = request.header("idempotency-key", key);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// The `detail` of a problem document.
fn detail(body: &str) -> String {
    let json: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    json["detail"].as_str().unwrap().to_owned()
}

/// A handler that counts its runs and answers the key it holds.
fn counted(runs: &Arc<AtomicUsize>) -> axum::routing::MethodRouter {
    let runs = Arc::clone(runs);
    post(move |lock: HeldLock| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        lock.key().to_owned()
    })
}

/// The issue's case: `key::resource("order", "order_id")` on routes whose parameter is
/// `{id}`, and a route without a parameter. Every request is refused with 500 before its
/// handler, and the answer and a warning name the parameter and the route.
#[tokio::test]
async fn a_route_without_the_keys_parameter_is_refused_naming_it_and_never_runs() {
    let recorder = Recorder::default();
    let _subscriber = recorder.install();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/orders/{id}/refund", counted(&runs))
        .route("/health", get(|| async { "ok" }).post(|| async { "ok" }))
        .route_layer(LockLayer::for_axum(
            MemoryBackend::new(),
            key::resource("order", "order_id"),
        ));

    for (path, route) in [
        ("/orders/42/refund", "/orders/{id}/refund"),
        ("/health", "/health"),
    ] {
        recorder.events.lock().unwrap().clear();
        let (status, body) = call(&app, "POST", path, None).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{path}: {body}");
        let detail = detail(&body);
        assert!(detail.contains("`{order_id}`"), "{detail}");
        assert!(detail.contains(&format!("`{route}`")), "{detail}");
        assert!(
            detail.contains(r#"key::resource("order", "order_id")"#),
            "{detail}"
        );
        let warnings = recorder.layer_warnings();
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        assert!(warnings[0].message().contains("refused"), "{warnings:#?}");
        let reason = warnings[0].fields.get("reason").unwrap();
        assert!(
            reason.contains("`{order_id}`") && reason.contains(&format!("`{route}`")),
            "{reason}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no handler ran");

    // Not even when the layer runs keyless requests unlocked: the route, not the request,
    // lacks the parameter.
    let app = Router::new()
        .route("/orders/{id}/refund", counted(&runs))
        .route_layer(
            LockLayer::for_axum(MemoryBackend::new(), key::resource("order", "order_id"))
                .with_keyless(Keyless::RunUnlocked),
        );
    let (status, body) = call(&app, "POST", "/orders/42/refund", None).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no handler ran");
}

/// A request without the header the key is made of: 400 naming the header, a warning, and the
/// handler does not run; with `Keyless::RunUnlocked` it runs unlocked, and a handler that
/// extracts `HeldLock` gets a 500 naming the cause (as does a route behind no layer).
#[tokio::test]
async fn a_request_without_its_key_is_refused_unless_the_layer_runs_it_unlocked() {
    let recorder = Recorder::default();
    let _subscriber = recorder.install();
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = || LockLayer::for_axum(MemoryBackend::new(), key::header("idempotency-key"));
    let app = Router::new()
        .route("/payments", counted(&runs))
        .layer(layer());

    let (status, body) = call(&app, "POST", "/payments", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        detail(&body).contains("the request has no header `idempotency-key`"),
        "{body}"
    );
    let warnings = recorder.layer_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0]
            .fields
            .get("reason")
            .unwrap()
            .contains("header `idempotency-key`")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(
        call(&app, "POST", "/payments", Some("p1")).await,
        (StatusCode::OK, "idempotency-key:p1".to_owned())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // "No key, no lock", asked for by name.
    recorder.events.lock().unwrap().clear();
    let unlocked_runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&unlocked_runs);
    let app = Router::new()
        .route(
            "/optional",
            post(move |lock: Option<HeldLock>| async move {
                counter.fetch_add(1, Ordering::SeqCst);
                lock.map_or("unlocked".to_owned(), |lock| lock.key().to_owned())
            }),
        )
        .route("/payments", counted(&runs))
        .layer(layer().with_keyless(Keyless::RunUnlocked))
        .route("/outside", counted(&runs));
    assert_eq!(
        call(&app, "POST", "/optional", None).await,
        (StatusCode::OK, "unlocked".to_owned())
    );
    assert_eq!(unlocked_runs.load(Ordering::SeqCst), 1);
    assert!(
        recorder.layer_warnings().is_empty(),
        "{:#?}",
        recorder.layer_warnings()
    );

    // The extractor's rejection names the cause: what the key lacked...
    let (status, body) = call(&app, "POST", "/payments", None).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        body.contains("header `idempotency-key`") && body.contains("Keyless::RunUnlocked"),
        "{body}"
    );
    // ...or that no layer was passed.
    let (status, body) = call(&app, "POST", "/outside", None).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("passed no LockLayer"), "{body}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handlers extracting HeldLock did not run"
    );
    let warnings = recorder.layer_warnings();
    assert_eq!(
        warnings.len(),
        2,
        "one per rejected extraction: {warnings:#?}"
    );
}

/// A closure's `None` is refused too; a closure returning `NoKey` names what it missed.
#[tokio::test]
async fn closures_that_find_no_key_are_refused() {
    async fn refused_with(make_key: impl MakeKey<Body> + Clone + Send + Sync + 'static) -> String {
        let app = Router::new()
            .route("/a", post(|| async { "ran" }))
            .layer(LockLayer::for_axum(MemoryBackend::new(), make_key));
        let (status, body) = call(&app, "POST", "/a", None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        detail(&body)
    }

    let unnamed = |request: &Request<Body>| {
        let tenant = request.headers().get("x-tenant")?.to_str().ok()?;
        Some(format!("tenant:{tenant}"))
    };
    let detail = refused_with(unnamed).await;
    assert!(detail.contains("key function returned None"), "{detail}");

    let named = |request: &Request<Body>| {
        let tenant = request
            .headers()
            .get("x-tenant")
            .and_then(|v| v.to_str().ok());
        let tenant = tenant.ok_or_else(|| key::NoKey::missing("header `x-tenant`"))?;
        Ok(format!("tenant:{tenant}"))
    };
    let detail = refused_with(named).await;
    assert!(
        detail.contains("the request has no header `x-tenant`"),
        "{detail}"
    );
}

/// Runs `path` on `app` in a task: a handler of `orders_app` takes 600 ms.
fn spawn_call(app: &Router, path: &'static str) -> tokio::task::JoinHandle<(StatusCode, String)> {
    let app = app.clone();
    tokio::spawn(async move { call(&app, "POST", path, None).await })
}

/// Orders paid and refunded, users updated, under options that `retry` as given: each handler
/// takes 600 ms and answers its key and fence. With the router, the most handlers of order 42
/// that ran at once.
fn orders_app(retry: RetryPolicy) -> (Router, Arc<AtomicUsize>) {
    orders_app_in(retry, false)
}

/// [`orders_app`], the orders' routes in a router nested at `/orders` when `nested`.
fn orders_app_in(retry: RetryPolicy, nested: bool) -> (Router, Arc<AtomicUsize>) {
    let options = LockOptions::builder().retry(retry).build().unwrap();
    let (inside, max_inside) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let most = Arc::clone(&max_inside);
    let order = move |Path(id): Path<String>, lock: HeldLock| {
        let (inside, max_inside) = (Arc::clone(&inside), Arc::clone(&max_inside));
        async move {
            let order_42 = id == "42";
            if order_42 {
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(600)).await;
            if order_42 {
                inside.fetch_sub(1, Ordering::SeqCst);
            }
            format!("{} {}", lock.key(), lock.fence())
        }
    };
    let user = |lock: HeldLock| async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        format!("{} {}", lock.key(), lock.fence())
    };
    let backend = MemoryBackend::new();
    let orders = LockLayer::for_axum(backend.clone(), key::resource("order", "id"))
        .with_options(options.clone());
    let users = LockLayer::for_axum(backend, key::resource("user", "id")).with_options(options);
    let app = if nested {
        let orders = Router::new()
            .route("/{id}/pay", post(order.clone()))
            .route("/{id}/refund", post(order))
            .route_layer(orders);
        Router::new().nest("/orders", orders)
    } else {
        Router::new()
            .route("/orders/{id}/pay", post(order.clone()))
            .route("/orders/{id}/refund", post(order))
            .route_layer(orders)
    };
    let app = app.merge(
        Router::new()
            .route("/users/{id}", post(user))
            .route_layer(users),
    );
    (app, most)
}

/// A payment of order 42, and its refund 150 ms later, each in a task.
async fn pay_then_refund(app: &Router) -> [tokio::task::JoinHandle<(StatusCode, String)>; 2] {
    let pay = spawn_call(app, "/orders/42/pay");
    tokio::time::sleep(Duration::from_millis(150)).await;
    [pay, spawn_call(app, "/orders/42/refund")]
}

/// The issue's case: `/orders/{id}/pay` and `/orders/{id}/refund` for one order ran at once
/// with fence 1 each. Now the second is answered 423 while the first runs; another order and
/// a user with the same id run meanwhile, each under its own lock.
#[tokio::test]
async fn two_routes_on_one_order_exclude_each_other_and_other_resources_do_not() {
    one_order_at_a_time(false).await;
}

/// The same with the orders' routes in a nested router, whose inner services see the URI
/// without the nest's prefix (the key was read from the wrong segments: `order:pay`).
#[tokio::test]
async fn two_routes_on_one_order_exclude_each_other_in_a_nested_router() {
    one_order_at_a_time(true).await;
}

async fn one_order_at_a_time(nested: bool) {
    let (app, max_inside) = orders_app_in(RetryPolicy::single_attempt(), nested);
    let [pay, refund] = pay_then_refund(&app).await;
    let other_order = spawn_call(&app, "/orders/43/refund");
    let user = spawn_call(&app, "/users/42");

    let (pay, refund) = (pay.await.unwrap(), refund.await.unwrap());
    assert_eq!(
        refund.0,
        StatusCode::LOCKED,
        "the refund of order 42 waits for its payment: {refund:?}, {pay:?}"
    );
    assert_eq!(max_inside.load(Ordering::SeqCst), 1);
    assert_eq!(pay, (StatusCode::OK, "order:42 000000000000001".to_owned()));
    assert_eq!(
        other_order.await.unwrap(),
        (StatusCode::OK, "order:43 000000000000001".to_owned())
    );
    assert_eq!(
        user.await.unwrap(),
        (StatusCode::OK, "user:42 000000000000001".to_owned()),
        "a user is not an order"
    );
}

/// With options that wait, the refund of an order runs after its payment, with the next
/// fence, never beside it.
#[tokio::test]
async fn two_routes_on_one_order_run_one_after_the_other_when_the_layer_waits() {
    let (app, max_inside) = orders_app(RetryPolicy::wait_for(Duration::from_secs(10)));
    let [pay, refund] = pay_then_refund(&app).await;
    let (pay, refund) = (pay.await.unwrap(), refund.await.unwrap());
    assert_eq!(
        max_inside.load(Ordering::SeqCst),
        1,
        "never both at once: {pay:?}, {refund:?}"
    );
    assert_eq!(pay, (StatusCode::OK, "order:42 000000000000001".to_owned()));
    assert_eq!(
        refund,
        (StatusCode::OK, "order:42 000000000000002".to_owned())
    );
}

/// `key::route_param` is the explicit per-route choice: two routes on one id do not exclude
/// each other (their keys hold the route), the same route on one id does.
#[tokio::test]
async fn route_param_locks_per_route_and_id() {
    let app = Router::new()
        .route(
            "/jobs/{id}/run",
            post(|lock: HeldLock| async move { lock.key().to_owned() }),
        )
        .route(
            "/jobs/{id}/cancel",
            post(|lock: HeldLock| async move { lock.key().to_owned() }),
        )
        .route_layer(LockLayer::for_axum(
            MemoryBackend::new(),
            key::route_param("id").with_prefix("billing:"),
        ));
    assert_eq!(
        call(&app, "POST", "/jobs/7/run", None).await,
        (StatusCode::OK, "billing:/jobs/{id}/run#7".to_owned())
    );
    assert_eq!(
        call(&app, "POST", "/jobs/7/cancel", None).await,
        (StatusCode::OK, "billing:/jobs/{id}/cancel#7".to_owned())
    );
}
