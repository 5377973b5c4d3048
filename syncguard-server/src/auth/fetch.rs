//! Fetching a JSON document (a JWKS, an OpenID discovery document) over HTTP or HTTPS, with
//! a deadline and a size limit.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;

/// The longest a fetch may take, connection included.
pub(crate) const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest document read.
const MAX_DOCUMENT: usize = 1 << 20;

/// An HTTP(S) client for small JSON documents. HTTPS trusts the Mozilla root certificates
/// (webpki-roots) with rustls on *ring*.
#[derive(Clone)]
pub(crate) struct JsonFetcher {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

impl JsonFetcher {
    pub(crate) fn new() -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(provider)
            .map_err(|error| format!("cannot set up TLS for fetching keys: {error}"))?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// GETs `url` and parses its JSON body as `T`.
    pub(crate) async fn get<T: DeserializeOwned>(&self, url: &str) -> Result<T, String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|error| format!("`{url}` is not a URL: {error}"))?;
        let request = http::Request::get(uri)
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::new())
            .map_err(|error| format!("cannot build a request for `{url}`: {error}"))?;
        let fetch = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|error| format!("GET {url} failed: {error}"))?;
            let status = response.status();
            if !status.is_success() {
                return Err(format!("GET {url} answered {status}"));
            }
            let body = Limited::new(response.into_body(), MAX_DOCUMENT)
                .collect()
                .await
                .map_err(|error| format!("reading {url} failed: {error}"))?
                .to_bytes();
            serde_json::from_slice(&body)
                .map_err(|error| format!("{url} is not the expected JSON: {error}"))
        };
        tokio::time::timeout(FETCH_TIMEOUT, fetch)
            .await
            .map_err(|_| format!("GET {url} took longer than {FETCH_TIMEOUT:?}"))?
    }
}
