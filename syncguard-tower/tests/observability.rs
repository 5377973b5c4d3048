//! What the layer tells `tracing` and its callers: the handler runs inside its hold's
//! `syncguard.hold` span, and the layer's warnings and errors name the lock (its key hash, and
//! the key itself only when the options show keys).

mod support;

use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use syncguard::{
    LockBackend, LockError, LockId, LockName, LockOptions, LostReason, MemoryBackend, OnLost,
    RetryPolicy,
};
use syncguard_tower::{HeldLock, Keyless, LockLayer, ReleaseOn, key};
use tower::{ServiceBuilder, ServiceExt, service_fn};

use support::Recorder;

fn request(idempotency_key: Option<&str>) -> Request<Full<Bytes>> {
    let mut request = Request::post("/jobs");
    if let Some(key) = idempotency_key {
        request = request.header("idempotency-key", key);
    }
    request.body(Full::default()).unwrap()
}

async fn text<B: Body<Data = Bytes>>(response: Response<B>) -> String
where
    B::Error: fmt::Debug,
{
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn the_handler_runs_inside_its_holds_span() {
    let recorder = Recorder::default();
    let _subscriber = recorder.install();
    let layer = LockLayer::new(MemoryBackend::new(), key::header("idempotency-key"))
        .with_keyless(Keyless::RunUnlocked);
    let service = ServiceBuilder::new().layer(layer).service(service_fn(
        |request: Request<Full<Bytes>>| async move {
            let lock = request.extensions().get::<HeldLock>().cloned();
            tracing::info!("handler started");
            // Pending once at least: the layer polls the handler again later.
            tokio::time::sleep(Duration::from_millis(20)).await;
            tracing::info!("handler finished");
            let key_hash = lock.map(|lock| lock.name().key_hash().to_owned());
            Ok::<_, Infallible>(Response::new(Full::from(key_hash.unwrap_or_default())))
        },
    ));

    let response = service.clone().oneshot(request(Some("a1"))).await.unwrap();
    let key_hash = text(response).await;
    assert_eq!(
        key_hash,
        LockName::new("idempotency-key:a1", false).key_hash()
    );
    for message in ["handler started", "handler finished"] {
        let event = recorder.event(message);
        let (span, fields) = event.spans.first().expect("the event is in a span");
        assert_eq!(span, "syncguard.hold", "{event:#?}");
        assert_eq!(fields.get("key_hash"), Some(key_hash.as_str()));
        assert_eq!(fields.get("fence"), Some("000000000000001"));
        assert_eq!(
            fields.get("key"),
            None,
            "the raw key is not shown by default"
        );
    }
    // The span says how the hold ended.
    let released = recorder.span_states().into_iter().any(|(name, fields)| {
        name == "syncguard.hold"
            && fields.get("key_hash") == Some(key_hash.as_str())
            && fields.get("outcome") == Some("released")
    });
    assert!(released, "{:#?}", recorder.span_states());

    // A request without a key (run unlocked, as the layer says) holds nothing, and runs in no
    // hold's span.
    recorder.events.lock().unwrap().clear();
    let response = service.oneshot(request(None)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(recorder.event("handler started").spans.is_empty());
    assert!(recorder.event("handler finished").spans.is_empty());
}

/// A layer whose handler has its lock released behind its back, then waits for the loss (or
/// 60 s), with `options`.
fn stolen(
    backend: &MemoryBackend,
    options: LockOptions,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<syncguard_tower::LockBody<Full<Bytes>>>,
    Error = Infallible,
    Future: Send,
> + Clone {
    let thief = backend.clone();
    ServiceBuilder::new()
        .layer(
            LockLayer::new(backend.clone(), key::header("idempotency-key")).with_options(options),
        )
        .service(service_fn(move |request: Request<Full<Bytes>>| {
            let thief = thief.clone();
            async move {
                let lock = request.extensions().get::<HeldLock>().cloned().unwrap();
                assert!(thief.release(lock.lock_id()).await.unwrap().is_released());
                tokio::select! {
                    _ = lock.lost() => {}
                    () = tokio::time::sleep(Duration::from_secs(60)) => {}
                }
                Ok::<_, Infallible>(Response::new(Full::from("done")))
            }
        }))
}

fn short_ttl() -> syncguard::LockOptionsBuilder {
    LockOptions::builder()
        .ttl(Duration::from_millis(300))
        .retry(RetryPolicy::single_attempt())
}

#[tokio::test]
async fn the_layers_loss_warning_names_the_lock_by_its_key_hash() {
    let recorder = Recorder::default();
    let _subscriber = recorder.install();
    let backend = MemoryBackend::new();

    // Cancelled while it runs.
    let service = stolen(&backend, short_ttl().build().unwrap());
    let response = tokio::time::timeout(
        Duration::from_secs(20),
        service.oneshot(request(Some("s1"))),
    )
    .await
    .expect("cancelled long before 60 s")
    .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let hidden = LockName::new("idempotency-key:s1", false);
    let warnings = recorder.layer_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    let warning = &warnings[0];
    assert!(warning.message().contains("cancelling"), "{warning:#?}");
    assert_eq!(
        warning.fields.get("lock"),
        Some(hidden.to_string().as_str())
    );
    assert!(hidden.to_string().contains(hidden.key_hash()));
    assert!(!hidden.to_string().contains("s1"), "no raw key by default");
    assert_eq!(
        warning.fields.get("reason"),
        Some(LostReason::NotHeld.to_string().as_str())
    );

    // Let run on, and answered as lost when it finishes; the options show the key.
    recorder.events.lock().unwrap().clear();
    let options = short_ttl()
        .on_lost(OnLost::Notify)
        .show_key(true)
        .build()
        .unwrap();
    let response = stolen(&backend, options)
        .oneshot(request(Some("s2")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let shown = LockName::new("idempotency-key:s2", true);
    let warnings = recorder.layer_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0]
            .message()
            .contains("before the handler finished")
    );
    assert_eq!(
        warnings[0].fields.get("lock"),
        Some(shown.to_string().as_str())
    );
    assert!(shown.to_string().contains("idempotency-key:s2"));
}

/// A body that never yields a frame: a stream still being produced.
struct Endless;

impl Body for Endless {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Pending
    }
}

#[tokio::test]
async fn a_body_that_loses_its_lock_ends_with_lock_lost_naming_the_lock() {
    let recorder = Recorder::default();
    let _subscriber = recorder.install();
    let backend = MemoryBackend::new();
    let layer = LockLayer::new(backend.clone(), key::header("idempotency-key"))
        .with_options(short_ttl().build().unwrap())
        .with_release(ReleaseOn::BodyEnd);
    let service = ServiceBuilder::new().layer(layer).service(service_fn(
        |request: Request<Full<Bytes>>| async move {
            let lock = request.extensions().get::<HeldLock>().cloned().unwrap();
            let mut response = Response::new(Endless);
            let lock_id = lock.lock_id().as_str().parse().unwrap();
            response.headers_mut().insert("x-lock-id", lock_id);
            Ok::<_, Infallible>(response)
        },
    ));
    let response = service.oneshot(request(Some("b1"))).await.unwrap();
    let lock_id = LockId::parse(response.headers()["x-lock-id"].to_str().unwrap()).unwrap();
    assert!(backend.release(&lock_id).await.unwrap().is_released());

    let mut body = response.into_body();
    let error = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the body ends once the heartbeat notices the loss")
        .expect("an error, not the end")
        .expect_err("an error, not a frame");
    let error = error.downcast::<LockError>().expect("a LockError");
    let name = LockName::new("idempotency-key:b1", false);
    assert_eq!(error.lost_reason(), Some(LostReason::NotHeld), "{error:?}");
    assert_eq!(error.lock(), Some(&name));
    let warnings = recorder.layer_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert_eq!(
        warnings[0].fields.get("lock"),
        Some(name.to_string().as_str())
    );
}
