//! What the HTTP tests share: a server on loopback, a small HTTP client, a backend that fails
//! on demand ([`flaky_backend`]); and ([`process`]) the built binary run as a process.

#![allow(dead_code, unreachable_pub)] // Each test binary uses a part.

pub mod process;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use syncguard::MemoryBackend;
use syncguard::backend::LockBackend;
use syncguard::conformance::FaultyBackend;
use syncguard_server::{Auth, router};
use tokio::net::TcpListener;

/// A server on 127.0.0.1, for the life of the test (its task ends with the runtime).
pub struct TestServer {
    pub address: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// An answer, with its body as text and (when it is JSON) parsed.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {:?}", self.text))
    }

    /// The `Fencing-Token` header, if any.
    pub fn fence(&self) -> Option<String> {
        self.headers
            .get("fencing-token")
            .map(|value| value.to_str().unwrap().to_owned())
    }

    pub fn fence_value(&self) -> u64 {
        let fence = self.fence().expect("a Fencing-Token header");
        assert_eq!(fence.len(), 15, "15 digits: {fence}");
        fence.parse().expect("digits")
    }

    /// The `expiry` of a lock body.
    pub fn expiry(&self) -> u64 {
        self.json()["expiry"].as_u64().expect("an expiry")
    }
}

impl TestServer {
    /// The server on `backend`, authenticating as `auth` says.
    pub async fn start(backend: Arc<dyn LockBackend>, auth: Auth) -> Self {
        let app = router(backend, auth).expect("the backend stores holders");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            address,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// A client of a server started elsewhere.
    pub fn client_for(address: SocketAddr) -> Self {
        Self {
            address,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// The server on a fresh memory backend, authentication disabled.
    pub async fn memory() -> Self {
        Self::start(Arc::new(MemoryBackend::new()), Auth::disabled()).await
    }

    /// Any request.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.address));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(10), self.client.request(request))
            .await
            .expect("the server answers within 10 s")
            .expect("the request reaches the server");
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            text: String::from_utf8(bytes.to_vec()).unwrap(),
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, &[], "").await
    }

    pub async fn post(&self, path: &str, body: &str) -> Reply {
        self.send(
            Method::POST,
            path,
            &[("content-type", "application/json")],
            body,
        )
        .await
    }

    /// `GET /v1/{ns}/lock/{name}`.
    pub async fn status(&self, ns: &str, name: &str) -> Reply {
        self.get(&format!("/v1/{ns}/lock/{name}")).await
    }

    pub async fn acquire(&self, ns: &str, name: &str, instance: &str, seconds: u64) -> Reply {
        self.post(
            &format!("/v1/{ns}/lock/{name}/acquire"),
            &format!(r#"{{"instanceId":"{instance}","leaseDuration":{seconds}}}"#),
        )
        .await
    }

    pub async fn renew(&self, ns: &str, name: &str, instance: &str, seconds: u64) -> Reply {
        self.post(
            &format!("/v1/{ns}/lock/{name}/renew"),
            &format!(r#"{{"instanceId":"{instance}","leaseDuration":{seconds}}}"#),
        )
        .await
    }

    pub async fn release(&self, ns: &str, name: &str, instance: &str) -> Reply {
        self.post(
            &format!("/v1/{ns}/lock/{name}/release"),
            &format!(r#"{{"instanceId":"{instance}"}}"#),
        )
        .await
    }
}

/// Checks LSC's `{"message":...,"errorId":<uuid>}` shape.
pub fn assert_error_id(body: &Value, message: &str) {
    assert_eq!(body["message"], message, "{body}");
    let error_id = body["errorId"].as_str().expect("an errorId");
    assert!(
        uuid::Uuid::parse_str(error_id).is_ok(),
        "a UUID: {error_id}"
    );
    assert_eq!(
        body.as_object().unwrap().len(),
        2,
        "only message and errorId: {body}"
    );
}

/// The current epoch second.
pub fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A memory backend that fails every call while told to (`fail`, as an unreachable store
/// would), and can be slowed down (`slow`, 700 ms a call). Clones share the switches.
pub fn flaky_backend() -> FaultyBackend {
    FaultyBackend::new(MemoryBackend::new())
}
