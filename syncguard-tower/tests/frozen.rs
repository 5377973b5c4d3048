//! A request whose whole runtime freezes (a GC pause, `SIGSTOP`, a thread blocked by mistake)
//! past its lock's lease: when the runtime wakes, neither the handler nor a `BodyEnd` body
//! takes another step, whatever order the runtime then wakes things in.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use syncguard::MemoryBackend;
use syncguard_tower::{LockLayer, ReleaseOn, key};
use tower::{ServiceBuilder, ServiceExt, service_fn};

const TTL: Duration = Duration::from_secs(1);
const FREEZE_AFTER: Duration = Duration::from_millis(200);
const FREEZE_FOR: Duration = Duration::from_millis(2_500);
const STEP_EVERY: Duration = Duration::from_millis(10);

type Steps = Arc<Mutex<Vec<Instant>>>;

fn layer(backend: &MemoryBackend, release: ReleaseOn) -> LockLayer<key::MethodAndPath> {
    let layer = LockLayer::new(backend.clone(), key::method_and_path());
    let options = layer.options().to_builder().ttl(TTL).build().unwrap();
    layer.with_options(options).with_release(release)
}

/// Runs `scenario` on a current-thread runtime of its own, frozen `FREEZE_AFTER` after the
/// start for `FREEZE_FOR`; returns what it returned and when the freeze ended.
fn frozen<T>(scenario: impl Future<Output = T>) -> (T, Instant) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let freezer = tokio::spawn(async {
            tokio::time::sleep(FREEZE_AFTER).await;
            // Blocks the runtime's only thread: no timer, task or I/O of this runtime runs.
            std::thread::sleep(FREEZE_FOR);
            Instant::now()
        });
        let output = scenario.await;
        (output, freezer.await.unwrap())
    })
}

fn steps_after(steps: &Steps, after: Instant) -> usize {
    steps
        .lock()
        .unwrap()
        .iter()
        .filter(|step| **step >= after)
        .count()
}

#[test]
fn a_frozen_handler_takes_no_step_past_its_lease() {
    let backend = MemoryBackend::new();
    let steps = Steps::default();
    let service = ServiceBuilder::new()
        .layer(layer(&backend, ReleaseOn::ResponseFuture))
        .service(service_fn({
            let steps = Arc::clone(&steps);
            move |_: Request<Full<Bytes>>| {
                let steps = Arc::clone(&steps);
                async move {
                    for _ in 0..600 {
                        steps.lock().unwrap().push(Instant::now());
                        tokio::time::sleep(STEP_EVERY).await;
                    }
                    Ok::<_, Infallible>(Response::new(Full::from("done")))
                }
            }
        }));
    let request = Request::post("/jobs/1").body(Full::default()).unwrap();
    let (response, woke) = frozen(service.oneshot(request));
    let response = response.unwrap();
    assert_ne!(response.status(), StatusCode::OK, "the lock was lost");
    assert!(
        !steps.lock().unwrap().is_empty(),
        "the handler ran before the freeze"
    );
    assert_eq!(
        steps_after(&steps, woke),
        0,
        "the handler took a step after its runtime woke, past its lease"
    );
}

/// A body of a chunk every `STEP_EVERY`, noting when each was made.
struct Ticking {
    steps: Steps,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Body for Ticking {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        std::task::ready!(self.sleep.as_mut().poll(cx));
        self.steps.lock().unwrap().push(Instant::now());
        let next = tokio::time::Instant::now() + STEP_EVERY;
        self.sleep.as_mut().reset(next);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b".")))))
    }
}

#[test]
fn a_frozen_body_sends_nothing_past_its_lease() {
    let backend = MemoryBackend::new();
    let steps = Steps::default();
    let service = ServiceBuilder::new()
        .layer(layer(&backend, ReleaseOn::BodyEnd))
        .service(service_fn({
            let steps = Arc::clone(&steps);
            move |_: Request<Full<Bytes>>| {
                let body = Ticking {
                    steps: Arc::clone(&steps),
                    sleep: Box::pin(tokio::time::sleep(STEP_EVERY)),
                };
                async move { Ok::<_, Infallible>(Response::new(body)) }
            }
        }));
    let request = Request::post("/jobs/1").body(Full::default()).unwrap();
    let (collected, woke) = frozen(async {
        let response = service.oneshot(request).await.unwrap();
        response.into_body().collect().await
    });
    assert!(
        collected.is_err(),
        "the body ends in an error: its lock was lost"
    );
    assert!(
        !steps.lock().unwrap().is_empty(),
        "the body streamed before the freeze"
    );
    assert_eq!(
        steps_after(&steps, woke),
        0,
        "the body made a chunk after its runtime woke, past its lease"
    );
}
