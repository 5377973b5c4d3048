//! A tonic service whose `jobs.Jobs/Run` runs one call at a time per job across replicas: the
//! layer locks on the method and the `x-job-id` metadata, and a second call for a running job
//! gets `ABORTED` with `grpc-retry-pushback-ms`. A call for a job whose earlier call has
//! completed runs again: the lock is mutual exclusion per key, not a record of completed jobs.
//!
//! ```sh
//! cargo run -p syncguard-examples --example tonic-jobs --features tonic-jobs
//! ```
//!
//! The service and its messages are written by hand with `prost` derives (no protoc); with a
//! `.proto` file and `tonic-build`, the generated server takes the same layer.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use syncguard::{LockOptions, MemoryBackend, RetryPolicy};
use syncguard_tower::{HeldLock, LockLayer, key};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// `message RunJob { string job_id = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
struct RunJob {
    #[prost(string, tag = "1")]
    job_id: String,
}

/// `message JobRun { string fence = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
struct JobRun {
    #[prost(string, tag = "1")]
    fence: String,
}

/// The handler of `Run`: exclusive per job id while it runs.
async fn run(request: Request<RunJob>) -> Result<Response<JobRun>, Status> {
    let lock = request
        .extensions()
        .get::<HeldLock>()
        .cloned()
        .ok_or_else(|| Status::invalid_argument("send the job id as x-job-id metadata"))?;
    tokio::time::sleep(Duration::from_millis(500)).await; // the work
    Ok(Response::new(JobRun {
        fence: lock.fence().to_string(),
    }))
}

/// `service Jobs { rpc Run(RunJob) returns (JobRun); }`, routed by hand.
#[derive(Clone)]
struct Jobs;

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
        Box::pin(async move {
            if request.uri().path() != "/jobs.Jobs/Run" {
                return Ok(Status::unimplemented("unknown method").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<JobRun, RunJob>::default());
            Ok(grpc.unary(tower::service_fn(run), request).await)
        })
    }
}

async fn call(url: String, job_id: &str) -> Result<String, Box<dyn std::error::Error>> {
    let channel = tonic::transport::Endpoint::from_shared(url)?
        .connect()
        .await?;
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await?;
    let mut request = Request::new(RunJob {
        job_id: job_id.to_owned(),
    });
    request.metadata_mut().insert("x-job-id", job_id.parse()?);
    let path = PathAndQuery::from_static("/jobs.Jobs/Run");
    let codec = ProstCodec::<RunJob, JobRun>::default();
    Ok(match client.unary(request, path, codec).await {
        Ok(response) => format!("OK, fence {}", response.get_ref().fence),
        Err(status) => {
            let pushback = status
                .metadata()
                .get("grpc-retry-pushback-ms")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned();
            format!(
                "{:?}: {} (pushback {pushback} ms)",
                status.code(),
                status.message()
            )
        }
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // syncguard reports what needs attention (a lost lock, a failed release) as `tracing`
    // events: without a subscriber nobody sees them.
    tracing_subscriber::fmt::init();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(2))
        .retry(RetryPolicy::single_attempt()) // a running job answers ABORTED at once
        .build()?;
    let layer = LockLayer::for_grpc(MemoryBackend::new(), key::path_and_header("x-job-id"))
        .with_options(options);
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(Jobs)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    println!("serving on {url}");

    let (a, b, c) = tokio::join!(
        call(url.clone(), "7"),
        call(url.clone(), "7"),
        call(url.clone(), "8")
    );
    println!("job 7: {}\njob 7: {}\njob 8: {}", a?, b?, c?);
    println!("job 7 again: {}", call(url, "7").await?);
    // Release what is still held (the dropped guards' pending releases too) before exiting.
    syncguard::shutdown(std::time::Duration::from_secs(5)).await;
    Ok(())
}
