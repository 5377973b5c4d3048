//! How the layer keeps a request's lock: the heartbeat runs in the request's own task while
//! the handler runs, a task takes over only while a `ReleaseOn::BodyEnd` body streams, and the
//! release is awaited before the response (or the body's end) is handed on.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use syncguard::{LockBackend, MemoryBackend};
use syncguard_tower::{LockLayer, ReleaseOn, key};
use tower::{ServiceBuilder, ServiceExt, service_fn};

const TTL: Duration = Duration::from_millis(300);
/// Past the ttl and the 1 s liveness tolerance: only extends keep a lock this long.
const SEVERAL_TTLS: Duration = Duration::from_millis(1600);

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

fn layer(backend: &MemoryBackend, release: ReleaseOn) -> LockLayer<key::MethodAndPath> {
    let layer = LockLayer::new(backend.clone(), key::method_and_path());
    let options = layer.options().to_builder().ttl(TTL).build().unwrap();
    layer.with_options(options).with_release(release)
}

fn request() -> Request<Full<Bytes>> {
    Request::post("/jobs/1").body(Full::default()).unwrap()
}

#[tokio::test]
async fn a_long_handler_keeps_its_lock_from_its_own_task() {
    let backend = MemoryBackend::new();
    let tasks = alive_tasks();
    let service = ServiceBuilder::new()
        .layer(layer(&backend, ReleaseOn::ResponseFuture))
        .service(service_fn({
            let backend = backend.clone();
            move |_: Request<Full<Bytes>>| {
                let backend = backend.clone();
                async move {
                    tokio::time::sleep(SEVERAL_TTLS).await;
                    let held = backend.is_locked("POST /jobs/1").await.unwrap();
                    Ok::<_, Infallible>(Response::new(Full::from(format!(
                        "held: {held}, tasks: {}",
                        alive_tasks()
                    ))))
                }
            }
        }));
    let response = service.oneshot(request()).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, format!("held: true, tasks: {tasks}"));
    // Released, and the release awaited, before the response was handed on.
    assert!(!backend.is_locked("POST /jobs/1").await.unwrap());
    assert_eq!(alive_tasks(), tasks);
}

/// A body of `left` one-byte chunks, each ready at once.
struct Chunks {
    left: u32,
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_body_keeps_its_lock_while_a_slow_client_reads() {
    let backend = MemoryBackend::new();
    let tasks = alive_tasks();
    let service = ServiceBuilder::new()
        .layer(layer(&backend, ReleaseOn::BodyEnd))
        .service(service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Chunks { left: 4 }))
        }));
    let mut body = service.oneshot(request()).await.unwrap().into_body();
    // Nobody polls the body between reads: a task keeps the lock meanwhile.
    assert_eq!(alive_tasks(), tasks + 1);
    let pause = SEVERAL_TTLS / 4;
    for _ in 0..4 {
        tokio::time::sleep(pause).await;
        assert!(backend.is_locked("POST /jobs/1").await.unwrap());
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "x");
    }
    assert!(backend.is_locked("POST /jobs/1").await.unwrap());
    assert!(body.frame().await.is_none());
    // The end is reported once the release is done.
    assert!(!backend.is_locked("POST /jobs/1").await.unwrap());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while alive_tasks() > tasks {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the heartbeat task outlived the body"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_body_that_has_ended_is_not_held_even_under_body_end() {
    let backend = MemoryBackend::new();
    let tasks = alive_tasks();
    let service = ServiceBuilder::new()
        .layer(layer(&backend, ReleaseOn::BodyEnd))
        .service(service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::<Bytes>::default()))
        }));
    let response = service.oneshot(request()).await.unwrap();
    assert!(response.body().is_end_stream());
    assert!(!backend.is_locked("POST /jobs/1").await.unwrap());
    assert_eq!(alive_tasks(), tasks);
}
