//! The layer in an axum server, driven over real HTTP on loopback by a hyper client.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Extension;
use axum::routing::{get, post};
use axum::{Router, ServiceExt};
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use syncguard::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, Lookup, ReleaseOutcome,
};
use syncguard::telemetry::{LockEvent, Operation, with_telemetry};
use syncguard::{
    LockBackend, LockError, LockId, LockInfo, LockOptions, MemoryBackend, OnLost, RetryPolicy,
};
use syncguard_tower::protocol::Http;
use syncguard_tower::{HeldLock, Keyless, LockLayer, ReleaseOn, key};
use tower::Layer;

struct Server {
    base: String,
    client: Client<HttpConnector, Body>,
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

async fn serve(app: Router) -> Server {
    let (listener, server) = listen().await;
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    server
}

/// A loopback listener, and the client of the server that will serve on it.
async fn listen() -> (tokio::net::TcpListener, Server) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = Server {
        base: format!("http://{address}"),
        client: Client::builder(TokioExecutor::new()).build_http(),
    };
    (listener, server)
}

impl Server {
    async fn post(&self, path: &str, idempotency_key: Option<&str>) -> Answer {
        let mut request = Request::post(format!("{}{path}", self.base));
        if let Some(key) = idempotency_key {
            request = request.header("idempotency-key", key);
        }
        let response = self
            .client
            .request(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }
}

/// The layer's default options (a held key answered at once) with `ttl`.
fn ttl(ttl: Duration) -> LockOptions {
    LockOptions::builder()
        .ttl(ttl)
        .retry(RetryPolicy::single_attempt())
        .build()
        .unwrap()
}

fn retry_after(answer: &Answer) -> u64 {
    answer.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// A handler that counts how many run at once and sleeps.
#[derive(Clone, Default)]
struct Probe {
    inside: Arc<AtomicUsize>,
    max_inside: Arc<AtomicUsize>,
    runs: Arc<AtomicUsize>,
}

impl Probe {
    async fn run(&self, sleep: Duration) {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inside.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(sleep).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

fn job_app(
    backend: impl LockBackend + 'static,
    probe: Probe,
    sleep: Duration,
    layer: impl FnOnce(LockLayer<key::Header, Http, Body>) -> LockLayer<key::Header, Http, Body>,
) -> Router {
    job_router(probe, sleep).layer(layer(LockLayer::for_axum(
        backend,
        key::header("idempotency-key"),
    )))
}

/// `POST /jobs`: runs the probe and answers the fence it holds, or "unlocked".
fn job_router(probe: Probe, sleep: Duration) -> Router {
    Router::new().route(
        "/jobs",
        post(move |lock: Option<HeldLock>| async move {
            probe.run(sleep).await;
            lock.map_or("unlocked".to_owned(), |lock| lock.fence().to_string())
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_runs_once_and_the_others_get_423_with_retry_after() {
    one_key_runs_once(MemoryBackend::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_only_answers_with_futures_gets_the_same_answers() {
    // The telemetry decorator answers nothing at once: every call goes through its futures,
    // as to a network backend, and is reported.
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let backend = with_telemetry(MemoryBackend::new(), move |event: &LockEvent| {
        if matches!(event.operation, Operation::Acquire | Operation::Release) {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    one_key_runs_once(backend).await;
    // 6 acquire attempts (the key taken twice, contended four times) and 2 releases.
    assert_eq!(calls.load(Ordering::SeqCst), 8);
}

async fn one_key_runs_once(backend: impl LockBackend + 'static) {
    let probe = Probe::default();
    let server = serve(job_app(
        backend,
        probe.clone(),
        Duration::from_millis(800),
        |l| l.with_options(ttl(Duration::from_secs(5))),
    ))
    .await;
    one_key_runs_once_on(Arc::new(server), &probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_around_the_whole_router_gives_the_same_answers() {
    let probe = Probe::default();
    let router = job_router(probe.clone(), Duration::from_millis(800));
    let app = LockLayer::for_axum(MemoryBackend::new(), key::header("idempotency-key"))
        .with_options(ttl(Duration::from_secs(5)))
        .layer(router.with_state(()));
    let (listener, server) = listen().await;
    tokio::spawn(async move {
        axum::serve(
            listener,
            ServiceExt::<Request<Body>>::into_make_service(app),
        )
        .await
        .unwrap()
    });
    let server = Arc::new(server);
    one_key_runs_once_on(Arc::clone(&server), &probe).await;
    // No route matches: the 404 is answered under the lock, which is released after it.
    assert_eq!(
        server.post("/nowhere", Some("same")).await.status,
        StatusCode::NOT_FOUND
    );
    let answer = server.post("/jobs", Some("same")).await;
    assert_eq!(
        answer.body, "000000000000004",
        "the 404 took fence 3 and let go"
    );
    // A request without the key is refused, naming the header, and never runs.
    let runs = probe.runs.load(Ordering::SeqCst);
    let answer = server.post("/jobs", None).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
    assert!(
        answer.body.contains("header `idempotency-key`"),
        "{}",
        answer.body
    );
    assert_eq!(probe.runs.load(Ordering::SeqCst), runs);
}

/// Five concurrent requests with one key to `server`, whose `POST /jobs` runs `probe` for
/// longer than it takes to send them: one runs, four get 423; then the key is free again.
async fn one_key_runs_once_on(server: Arc<Server>, probe: &Probe) {
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let server = Arc::clone(&server);
            tokio::spawn(async move { server.post("/jobs", Some("same")).await })
        })
        .collect();
    let mut ok = 0;
    let mut locked = 0;
    for call in calls {
        let answer = call.await.unwrap();
        match answer.status {
            StatusCode::OK => ok += 1,
            StatusCode::LOCKED => {
                locked += 1;
                let seconds = retry_after(&answer);
                assert!((1..=6).contains(&seconds), "Retry-After {seconds}");
                assert_eq!(answer.headers["content-type"], "application/problem+json");
                assert!(answer.body.contains(r#""status":423"#), "{}", answer.body);
                assert!(answer.body.contains(r#""retryAfter":"#), "{}", answer.body);
            }
            other => panic!("unexpected {other}: {}", answer.body),
        }
    }
    assert_eq!((ok, locked), (1, 4));
    assert_eq!(
        probe.runs.load(Ordering::SeqCst),
        1,
        "rejected requests never ran"
    );
    // Released when the response was ready: the next request with the key goes through.
    let answer = server.post("/jobs", Some("same")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, "000000000000002", "the fence grew");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_keys_run_in_parallel_and_keyless_requests_run_unlocked_when_told() {
    let probe = Probe::default();
    let server = Arc::new(
        serve(job_app(
            MemoryBackend::new(),
            probe.clone(),
            Duration::from_millis(800),
            |l| l.with_keyless(Keyless::RunUnlocked),
        ))
        .await,
    );
    let started = Instant::now();
    let calls: Vec<_> = (0..4)
        .map(|i| {
            let server = Arc::clone(&server);
            tokio::spawn(async move { server.post("/jobs", Some(&format!("key{i}"))).await })
        })
        .collect();
    for call in calls {
        let answer = call.await.unwrap();
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(answer.body, "000000000000001");
    }
    assert_eq!(
        probe.max_inside.load(Ordering::SeqCst),
        4,
        "all four ran at once"
    );
    assert!(
        started.elapsed() < Duration::from_millis(3000),
        "{:?}",
        started.elapsed()
    );

    let (a, b) = tokio::join!(server.post("/jobs", None), server.post("/jobs", None));
    assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "unlocked"));
    assert_eq!((b.status, b.body.as_str()), (StatusCode::OK, "unlocked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_reads_the_lock_from_the_extension_and_the_extractor() {
    let app = Router::new()
        .route(
            "/jobs/{id}",
            post(
                |lock: HeldLock, Extension(same): Extension<HeldLock>| async move {
                    assert_eq!(lock.fence(), same.fence());
                    assert_eq!(lock.lock_id(), same.lock_id());
                    assert!(!lock.is_lost());
                    // The accessors of a LockGuard, through its handle.
                    assert!(lock.is_held() && lock.lost_reason().is_none());
                    assert_eq!(lock.ttl(), syncguard::LockOptions::DEFAULT_TTL);
                    assert!(lock.expires_at_ms() > syncguard::backend::time::now_ms());
                    assert!(lock.held_for() < syncguard::LockOptions::DEFAULT_TTL);
                    assert_eq!(lock.handle().fence(), lock.fence());
                    assert_eq!(lock.name().key(), None, "keys are not shown by default");
                    assert!(!lock.lost_token().is_cancelled());
                    format!(
                        "{} {} {}",
                        lock.key(),
                        lock.fence(),
                        lock.lock_id().as_str().len()
                    )
                },
            ),
        )
        .route(
            "/free",
            get(|lock: HeldLock| async move { lock.fence().to_string() }),
        )
        .route_layer(LockLayer::new(
            MemoryBackend::new(),
            key::resource("job", "id"),
        ));
    let server = serve(app).await;
    let answer = server.post("/jobs/42", None).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body, "job:42 000000000000001 22");
    let answer = server.post("/jobs/42", None).await;
    assert_eq!(answer.body, "job:42 000000000000002 22");
    // A route without the parameter is refused before its handler, naming the parameter.
    let response = server
        .client
        .request(
            Request::get(format!("{}/free", server.base))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert!(
        body.contains("`{id}`") && body.contains("`/free`"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_params_serialize_one_job_and_not_the_others() {
    let probe = Probe::default();
    let handler_probe = probe.clone();
    let app = Router::new()
        .route(
            "/jobs/{id}/run",
            post(move || async move {
                handler_probe.run(Duration::from_millis(600)).await;
                "ran"
            }),
        )
        .route_layer(
            LockLayer::new(MemoryBackend::new(), key::resource("job", "id"))
                .with_contended_status(StatusCode::CONFLICT),
        );
    let server = serve(app).await;
    let (a, b, c) = tokio::join!(
        server.post("/jobs/1/run", None),
        server.post("/jobs/1/run", None),
        server.post("/jobs/2/run", None)
    );
    let mut statuses = [a.status, b.status];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::OK, StatusCode::CONFLICT]);
    assert_eq!(c.status, StatusCode::OK);
    assert_eq!(probe.max_inside.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_handler_keeps_its_lock_through_several_ttls() {
    let probe = Probe::default();
    let server = Arc::new(
        serve(job_app(
            MemoryBackend::new(),
            probe.clone(),
            Duration::from_millis(2000),
            |l| l.with_options(ttl(Duration::from_millis(300))),
        ))
        .await,
    );
    let long = tokio::spawn({
        let server = Arc::clone(&server);
        async move { server.post("/jobs", Some("long")).await }
    });
    // Well past several ttls (and the 1 s tolerance), the key is still held.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let contender = server.post("/jobs", Some("long")).await;
    assert_eq!(contender.status, StatusCode::LOCKED, "{}", contender.body);
    assert!((1..=2).contains(&retry_after(&contender)));
    let answer = long.await.unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(probe.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_lets_a_second_request_run_after_the_first() {
    let probe = Probe::default();
    let server = serve(job_app(
        MemoryBackend::new(),
        probe.clone(),
        Duration::from_millis(300),
        |l| {
            let wait = RetryPolicy::wait_for(Duration::from_secs(10));
            l.with_options(LockOptions::builder().retry(wait).build().unwrap())
        },
    ))
    .await;
    let (a, b) = tokio::join!(
        server.post("/jobs", Some("w")),
        server.post("/jobs", Some("w"))
    );
    assert_eq!((a.status, b.status), (StatusCode::OK, StatusCode::OK));
    let mut fences = [a.body, b.body];
    fences.sort();
    assert_eq!(fences, ["000000000000001", "000000000000002"]);
    assert_eq!(probe.max_inside.load(Ordering::SeqCst), 1);
}

/// `RetryPolicy::wait_for` in the layer's options: a request for a held key waits in the
/// layer, without running, and runs once the key is free; a wait that runs out is a 423.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_that_wait_run_the_request_once_the_key_is_free() {
    let backend = MemoryBackend::new();
    let waiting = |wait: Duration| {
        let options = LockOptions::builder()
            .retry(RetryPolicy::wait_for(wait))
            .build()
            .unwrap();
        LockLayer::for_axum(backend.clone(), key::header("idempotency-key")).with_options(options)
    };
    let probe = Probe::default();
    let patient = Arc::new(
        serve(job_router(probe.clone(), Duration::ZERO).layer(waiting(Duration::from_secs(10))))
            .await,
    );
    let hasty =
        serve(job_router(probe.clone(), Duration::ZERO).layer(waiting(Duration::from_millis(300))))
            .await;

    // Another replica holds the key.
    let held = syncguard::acquire(&backend, "idempotency-key:w", &LockOptions::default())
        .await
        .unwrap();
    let started = Instant::now();
    let answer = hasty.post("/jobs", Some("w")).await;
    assert_eq!(answer.status, StatusCode::LOCKED, "{}", answer.body);
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!((1..=31).contains(&retry_after(&answer)));

    let started = Instant::now();
    let request = tokio::spawn({
        let patient = Arc::clone(&patient);
        async move { patient.post("/jobs", Some("w")).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        probe.runs.load(Ordering::SeqCst),
        0,
        "the request waits without running"
    );
    assert!(held.release().await.unwrap());
    let answer = request.await.unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(
        answer.body, "000000000000002",
        "it ran under the lock, after the holder"
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(probe.runs.load(Ordering::SeqCst), 1);
}

/// An app whose handler has its lock released behind its back, then would sleep 60 s.
fn stolen_app(backend: MemoryBackend, on_lost: OnLost, finished: Arc<AtomicBool>) -> Router {
    let thief = backend.clone();
    Router::new()
        .route(
            "/jobs",
            post(move |lock: HeldLock| async move {
                assert!(thief.release(lock.lock_id()).await.unwrap().is_released());
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(60)) => {}
                    // Under OnLost::Notify the handler notices and finishes a little later.
                    () = async {
                        lock.lost().await;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    } => {}
                }
                finished.store(true, Ordering::SeqCst);
                format!("lost: {}", lock.is_lost())
            }),
        )
        .layer(
            LockLayer::for_axum(backend, key::header("idempotency-key")).with_options(
                ttl(Duration::from_millis(300))
                    .to_builder()
                    .on_lost(on_lost)
                    .build()
                    .unwrap(),
            ),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_cancels_the_handler_with_503() {
    let finished = Arc::new(AtomicBool::new(false));
    let server = serve(stolen_app(
        MemoryBackend::new(),
        OnLost::Cancel,
        Arc::clone(&finished),
    ))
    .await;
    let started = Instant::now();
    let answer = server.post("/jobs", Some("stolen")).await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body
    );
    assert!(answer.body.contains("lost"), "{}", answer.body);
    assert!(started.elapsed() < Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !finished.load(Ordering::SeqCst),
        "the handler was dropped, not finished"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_only_notifies_when_asked_and_still_fails_the_request() {
    let finished = Arc::new(AtomicBool::new(false));
    let server = serve(stolen_app(
        MemoryBackend::new(),
        OnLost::Notify,
        Arc::clone(&finished),
    ))
    .await;
    let answer = server.post("/jobs", Some("stolen")).await;
    assert!(finished.load(Ordering::SeqCst), "the handler ran on");
    // Its answer is not passed off as made under the lock.
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body
    );
    assert!(answer.body.contains("lost"), "{}", answer.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_blocked_past_its_lease_does_not_answer_success() {
    let backend = MemoryBackend::new();
    let thief = backend.clone();
    let app = Router::new()
        .route(
            "/jobs",
            // Blocks its thread: the heartbeat, run from this request's task, cannot run.
            post(|| async {
                std::thread::sleep(Duration::from_millis(1800));
                "done"
            }),
        )
        .layer(
            LockLayer::for_axum(backend, key::header("idempotency-key"))
                .with_options(ttl(Duration::from_millis(300))),
        );
    let server = serve(app).await;
    let answer = server.post("/jobs", Some("blocked")).await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body
    );
    assert!(answer.body.contains("lost"), "{}", answer.body);
    // Rightly so: another client could take the lock while the handler was blocked.
    let lease = thief
        .acquire("idempotency-key:blocked", Duration::from_secs(5))
        .await
        .unwrap()
        .lease()
        .expect("the lapsed lock is free");
    assert!(thief.release(&lease.lock_id).await.unwrap().is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_ends_a_hanging_handler() {
    let probe = Probe::default();
    let server = serve(job_app(
        MemoryBackend::new(),
        probe,
        Duration::from_secs(60),
        |l| {
            let options = ttl(Duration::from_millis(200)).to_builder();
            l.with_options(
                options
                    .max_hold(Duration::from_millis(500))
                    .build()
                    .unwrap(),
            )
        },
    ))
    .await;
    let started = Instant::now();
    let answer = server.post("/jobs", Some("hang")).await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body
    );
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_key_is_a_400_and_never_runs() {
    let probe = Probe::default();
    let server = serve(job_app(
        MemoryBackend::new(),
        probe.clone(),
        Duration::ZERO,
        |l| l,
    ))
    .await;
    let answer = server.post("/jobs", Some(&"x".repeat(600))).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
    assert_eq!(probe.runs.load(Ordering::SeqCst), 0);
}

/// A backend that is always down.
struct Down;

impl LockBackend for Down {
    fn acquire<'a>(
        &'a self,
        _: &'a str,
        _: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(async { Err(LockError::service_unavailable("connection refused")) })
    }
    fn release<'a>(&'a self, _: &'a LockId) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        Box::pin(async { Err(LockError::service_unavailable("connection refused")) })
    }
    fn extend<'a>(
        &'a self,
        _: &'a LockId,
        _: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(async { Err(LockError::service_unavailable("connection refused")) })
    }
    fn is_locked<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async { Err(LockError::service_unavailable("connection refused")) })
    }
    fn lookup<'a>(&'a self, _: Lookup<'a>) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(async { Err(LockError::service_unavailable("connection refused")) })
    }
    fn capabilities(&self) -> Capabilities {
        MemoryBackend::new().capabilities()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_failure_is_a_503_and_the_handler_never_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/jobs",
            post(move || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                "ran"
            }),
        )
        .layer(LockLayer::new(Down, key::header("idempotency-key")));
    let server = serve(app).await;
    let answer = server.post("/jobs", Some("k")).await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body
    );
    assert_eq!(retry_after(&answer), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // Without a key the request is refused before the backend is asked, and never runs.
    assert_eq!(
        server.post("/jobs", None).await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A handler whose body streams 6 chunks, 100 ms apart.
fn streaming_app(release: ReleaseOn) -> Router {
    Router::new()
        .route(
            "/jobs",
            post(|| async {
                let (tx, rx) =
                    tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(1);
                tokio::spawn(async move {
                    for i in 0..6 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if tx.send(Ok(Bytes::from(format!("{i}")))).await.is_err() {
                            return;
                        }
                    }
                });
                let stream = futures_stream(rx);
                Body::from_stream(stream)
            }),
        )
        .layer(
            LockLayer::for_axum(MemoryBackend::new(), key::header("idempotency-key"))
                .with_release(release),
        )
}

fn futures_stream<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_core::Stream<Item = T> + Send + 'static {
    struct Rx<T>(tokio::sync::mpsc::Receiver<T>);
    impl<T> futures_core::Stream for Rx<T> {
        type Item = T;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<T>> {
            self.0.poll_recv(cx)
        }
    }
    Rx(rx)
}

async fn stream_then_contend(release: ReleaseOn) -> (StatusCode, String, StatusCode) {
    let server = serve(streaming_app(release)).await;
    let request = Request::post(format!("{}/jobs", server.base))
        .header("idempotency-key", "stream")
        .body(Body::empty())
        .unwrap();
    let response = server.client.request(request).await.unwrap();
    // The head has arrived; the body is still streaming.
    let during = server.post("/jobs", Some("stream")).await.status;
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8(body.to_vec()).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = server.post("/jobs", Some("stream")).await;
    (during, body, after.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_on_body_end_holds_the_lock_while_the_body_streams() {
    let (during, body, after) = stream_then_contend(ReleaseOn::BodyEnd).await;
    assert_eq!(body, "012345");
    assert_eq!(during, StatusCode::LOCKED);
    assert_eq!(after, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_on_response_frees_the_key_before_the_body_streams() {
    let (during, body, after) = stream_then_contend(ReleaseOn::ResponseFuture).await;
    assert_eq!(body, "012345");
    assert_eq!(during, StatusCode::OK);
    assert_eq!(after, StatusCode::OK);
}

/// `key::route_param` as its docs say axum 0.8 runs it: under `Router::route_layer` and
/// `Router::layer` a matched request is locked on its route and parameter (a 405 for a method
/// the route does not serve too); a request that matches no route is a plain 404 under
/// `route_layer`, and refused (500) under `layer`, which wraps the fallback; a layer around the
/// whole router runs before routing, so every request is refused, never run unlocked.
#[tokio::test]
async fn route_param_locks_under_route_layer_and_layer_and_refuses_around_the_router() {
    use tower::ServiceExt as _;

    fn jobs() -> Router {
        Router::new().route(
            "/jobs/{id}",
            post(|lock: Option<HeldLock>| async move {
                match lock {
                    Some(lock) => format!("locked {}", lock.key()),
                    None => "unlocked".to_owned(),
                }
            }),
        )
    }
    async fn call<S>(app: S, method: &str, path: &str) -> (StatusCode, String)
    where
        S: tower::Service<Request<Body>, Error = std::convert::Infallible>,
        S::Response: axum::response::IntoResponse,
    {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let response =
            axum::response::IntoResponse::into_response(app.oneshot(request).await.unwrap());
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    let backend = MemoryBackend::new();
    let layer = || LockLayer::for_axum(backend.clone(), key::route_param("id"));
    let routed = [
        (
            "route_layer",
            jobs().route_layer(layer()),
            StatusCode::NOT_FOUND,
        ),
        (
            "layer",
            jobs().layer(layer()),
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
    ];
    for (how, app, unmatched) in routed {
        assert_eq!(
            call(app.clone(), "POST", "/jobs/7").await,
            (StatusCode::OK, "locked /jobs/{id}#7".to_owned()),
            "{how}"
        );
        assert_eq!(
            call(app.clone(), "POST", "/nowhere").await.0,
            unmatched,
            "{how}"
        );
        assert_eq!(
            call(app.clone(), "GET", "/jobs/7").await.0,
            StatusCode::METHOD_NOT_ALLOWED,
            "{how}"
        );
        // While another owner holds the job, both the request and the 405 are refused.
        let options = LockOptions::builder()
            .retry(RetryPolicy::single_attempt())
            .build()
            .unwrap();
        let held = syncguard::acquire(&backend, "/jobs/{id}#7", &options)
            .await
            .unwrap();
        assert_eq!(
            call(app.clone(), "POST", "/jobs/7").await.0,
            StatusCode::LOCKED,
            "{how}"
        );
        assert_eq!(
            call(app.clone(), "GET", "/jobs/7").await.0,
            StatusCode::LOCKED,
            "{how}"
        );
        assert_eq!(
            call(app, "POST", "/jobs/8").await,
            (StatusCode::OK, "locked /jobs/{id}#8".to_owned()),
            "{how}"
        );
        held.release().await.unwrap();
    }

    // Around the whole router, the layer runs before routing: refused, naming the fix, even
    // under Keyless::RunUnlocked (a route that cannot give a key is no optional key).
    for keyless in [Keyless::Refuse, Keyless::RunUnlocked] {
        let around = layer().with_keyless(keyless).layer(jobs());
        let (status, body) = call(around, "POST", "/jobs/7").await;
        assert_eq!(
            status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{keyless:?}: {body}"
        );
        assert!(body.contains("Router::route_layer"), "{body}");
    }
}

/// A handler's `HeldLock` derefs to syncguard's `LockHandle`, with every accessor of a guard,
/// and the options and types a layer's user names come from `syncguard`, which this crate
/// re-exports at the version it was built with.
#[tokio::test]
async fn a_held_lock_derefs_to_a_lock_handle_of_the_re_exported_syncguard() {
    use syncguard_tower::syncguard::{
        Backoff, Fence, Jitter, LockHandle, LockOptions, LockOptionsBuilder, LostReason, OnLost,
        RetryPolicy,
    };

    fn held(handle: &LockHandle) -> bool {
        handle.is_held()
    }

    let builder: LockOptionsBuilder = LockOptions::builder();
    let options = builder
        .ttl(LockOptions::DEFAULT_TTL)
        .retry(
            RetryPolicy::wait_for(Duration::from_secs(1))
                .with_backoff(Backoff::Fixed)
                .with_jitter(Jitter::None),
        )
        .on_lost(OnLost::Notify)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/jobs/{id}",
            post(|lock: HeldLock| async move {
                let fence: Fence = lock.fence();
                assert!(held(&lock), "a &HeldLock is a &LockHandle");
                let _: Option<LostReason> = lock.lost_reason();
                fence.to_string()
            }),
        )
        .route_layer(
            LockLayer::for_axum(
                syncguard_tower::syncguard::MemoryBackend::new(),
                key::resource("job", "id"),
            )
            .with_options(options),
        );
    let server = serve(app).await;
    assert_eq!(server.post("/jobs/1", None).await.body, "000000000000001");
}
