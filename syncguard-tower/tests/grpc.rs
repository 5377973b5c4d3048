//! The layer in a tonic server, driven over real gRPC (HTTP/2) on loopback by a tonic client.
//! The service and its messages are written by hand, so no protoc is needed.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use syncguard::{LockBackend, LockOptions, MemoryBackend, RetryPolicy};
use syncguard_tower::{HeldLock, LockLayer, key};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::Server;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

#[derive(Clone, PartialEq, prost::Message)]
struct RunJob {
    #[prost(string, tag = "1")]
    job_id: String,
    /// Test hook: release the lock behind the handler's back, then hang.
    #[prost(bool, tag = "2")]
    steal: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
struct JobRun {
    #[prost(string, tag = "1")]
    fence: String,
}

/// `jobs.Jobs/Run`, served by hand the way generated code would.
#[derive(Clone)]
struct Jobs {
    backend: MemoryBackend,
    runs: Arc<AtomicUsize>,
}

impl NamedService for Jobs {
    const NAME: &'static str = "jobs.Jobs";
}

impl tower::Service<http::Request<Body>> for Jobs {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let jobs = self.clone();
        Box::pin(async move {
            if request.uri().path() != "/jobs.Jobs/Run" {
                return Ok(Status::unimplemented("no such method").into_http());
            }
            let handler = tower::service_fn(move |request: tonic::Request<RunJob>| {
                let jobs = jobs.clone();
                async move {
                    jobs.runs.fetch_add(1, Ordering::SeqCst);
                    let lock = request
                        .extensions()
                        .get::<HeldLock>()
                        .cloned()
                        .ok_or_else(|| Status::internal("no lock"))?;
                    if request.get_ref().steal {
                        let _ = jobs.backend.release(lock.lock_id()).await.unwrap();
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Ok::<_, Status>(tonic::Response::new(JobRun {
                        fence: lock.fence().to_string(),
                    }))
                }
            });
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<JobRun, RunJob>::default());
            Ok(grpc.unary(handler, request).await)
        })
    }
}

struct Fixture {
    url: String,
    runs: Arc<AtomicUsize>,
}

async fn serve<B: LockBackend + 'static>(lock_backend: B, jobs_backend: MemoryBackend) -> Fixture {
    let runs = Arc::new(AtomicUsize::new(0));
    let jobs = Jobs {
        backend: jobs_backend,
        runs: Arc::clone(&runs),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let options = LockOptions::builder()
        .ttl(Duration::from_millis(400))
        .retry(RetryPolicy::single_attempt())
        .build()
        .unwrap();
    let layer =
        LockLayer::for_grpc(lock_backend, key::path_and_header("x-job-id")).with_options(options);
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(jobs)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    Fixture { url, runs }
}

async fn run_job(url: &str, job_id: &str, steal: bool) -> Result<tonic::Response<JobRun>, Status> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.unwrap();
    let mut request = tonic::Request::new(RunJob {
        job_id: job_id.to_owned(),
        steal,
    });
    request
        .metadata_mut()
        .insert("x-job-id", job_id.parse().unwrap());
    client
        .unary(
            request,
            PathAndQuery::from_static("/jobs.Jobs/Run"),
            ProstCodec::<RunJob, JobRun>::default(),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_is_aborted_and_other_jobs_run() {
    let backend = MemoryBackend::new();
    let fixture = serve(backend.clone(), backend).await;
    let (a, b, c) = tokio::join!(
        run_job(&fixture.url, "7", false),
        run_job(&fixture.url, "7", false),
        run_job(&fixture.url, "8", false)
    );
    let (ok, aborted) = match (a, b) {
        (Ok(ok), Err(aborted)) | (Err(aborted), Ok(ok)) => (ok, aborted),
        other => panic!("expected one OK and one ABORTED, got {other:?}"),
    };
    assert_eq!(ok.get_ref().fence, "000000000000001");
    assert_eq!(aborted.code(), Code::Aborted, "{aborted:?}");
    assert!(aborted.message().contains("retry"), "{aborted:?}");
    let pushback: u64 = aborted
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1000..=2000).contains(&pushback), "{pushback}");
    assert_eq!(
        c.unwrap().get_ref().fence,
        "000000000000001",
        "another job ran"
    );
    assert_eq!(
        fixture.runs.load(Ordering::SeqCst),
        2,
        "the aborted call never ran"
    );
    // The lock was released with the response: the job runs again, with the next fence.
    let again = run_job(&fixture.url, "7", false).await.unwrap();
    assert_eq!(again.get_ref().fence, "000000000000002");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_is_unavailable() {
    let backend = MemoryBackend::new();
    let fixture = serve(backend.clone(), backend).await;
    let status = tokio::time::timeout(Duration::from_secs(20), run_job(&fixture.url, "9", true))
        .await
        .expect("cancelled long before the handler's 60 s")
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("lost"), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_key_is_invalid_argument() {
    // A key over 512 bytes answers INVALID_ARGUMENT without running the handler.
    let backend = MemoryBackend::new();
    let fixture = serve(backend.clone(), backend).await;
    let status = run_job(&fixture.url, &"x".repeat(600), false)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(fixture.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_its_key_is_invalid_argument_naming_the_metadata() {
    // The layer keys on `x-job-id`; a call whose entry is empty has no key, and never runs.
    let backend = MemoryBackend::new();
    let fixture = serve(backend.clone(), backend).await;
    let status = run_job(&fixture.url, "", false).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("`x-job-id`"), "{status:?}");
    assert_eq!(fixture.runs.load(Ordering::SeqCst), 0);
}

/// A gRPC layer answers a held key with the code `with_contended_code` sets (the setter exists
/// on gRPC layers only: see the `protocol` module's compile-fail examples).
#[tokio::test]
async fn a_held_key_gets_the_layers_contended_code() {
    use tower::{ServiceBuilder, ServiceExt};

    let backend = MemoryBackend::new();
    let held = syncguard::acquire(&backend, "job:1", &LockOptions::default())
        .await
        .unwrap();
    let service = ServiceBuilder::new()
        .layer(
            LockLayer::for_grpc(backend.clone(), |_: &http::Request<Body>| {
                Some("job:1".to_owned())
            })
            .with_contended_code(Code::FailedPrecondition),
        )
        .service(tower::service_fn(|_: http::Request<Body>| async {
            Ok::<_, Infallible>(http::Response::new(Body::empty()))
        }));
    let response = service
        .oneshot(http::Request::new(Body::empty()))
        .await
        .unwrap();
    let status = Status::from_header_map(response.headers()).expect("a gRPC status");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    held.release().await.unwrap();
}
