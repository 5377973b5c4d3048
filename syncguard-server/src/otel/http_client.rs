//! The exporters' HTTP client, on the server's own hyper and rustls stack.

/// The largest collector answer read: an export answer is a few bytes (a partial-success
/// notice at most).
const MAX_RESPONSE: usize = 64 * 1024;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{Bytes, HttpClient, HttpError};
use tokio::runtime::Handle;

/// The exporters' HTTP client: hyper and rustls on *ring*, the stack the server already has.
///
/// The SDK's batch span processor and periodic metric reader export from threads of their own
/// (`futures_executor::block_on`), outside any Tokio runtime, where hyper cannot run; so each
/// request runs as a task on the server's runtime, and the export thread awaits its result.
#[derive(Debug, Clone)]
pub(super) struct RuntimeHttpClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    runtime: Handle,
    timeout: Duration,
}

/// The connector every exporter's client shares: HTTPS (webpki roots, rustls on *ring*) or
/// plain HTTP, HTTP/1.1.
pub(super) fn https_connector() -> Result<HttpsConnector<HttpConnector>, rustls::Error> {
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(Arc::new(rustls::crypto::ring::default_provider()))?
        .https_or_http()
        .enable_http1()
        .build())
}

impl RuntimeHttpClient {
    /// A client that sends on `runtime` and gives up on an answer after `timeout`.
    pub(super) fn new(
        connector: &HttpsConnector<HttpConnector>,
        runtime: &Handle,
        timeout: Duration,
    ) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector.clone()),
            runtime: runtime.clone(),
            timeout,
        }
    }

    async fn send(
        client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, HttpError> {
        let response = client.request(request.map(Full::new)).await?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_RESPONSE).collect().await?.to_bytes();
        Ok(Response::from_parts(parts, body))
    }
}

// The trait is declared with `#[async_trait]`; this is the signature that macro gives it,
// written out rather than taking the macro crate for one method.
impl HttpClient for RuntimeHttpClient {
    fn send_bytes<'client, 'future>(
        &'client self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'future>>
    where
        'client: 'future,
        Self: 'future,
    {
        let timeout = self.timeout;
        let client = self.client.clone();
        // The timer too belongs to the runtime: made on the export thread, it would panic.
        let task = self
            .runtime
            .spawn(async move { tokio::time::timeout(timeout, Self::send(client, request)).await });
        Box::pin(async move {
            match task.await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => {
                    Err(format!("no answer from the collector within {timeout:?}").into())
                }
                // The runtime is shutting down.
                Err(error) => Err(Box::new(error) as HttpError),
            }
        })
    }
}
