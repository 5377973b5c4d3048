//! What the JWT tests sign with and verify against: RSA keys generated per run, and a key
//! server on loopback (a JWKS and an OpenID discovery document).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use rsa::pkcs1::EncodeRsaPrivateKey;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// An RSA key pair, as jsonwebtoken signs with it and as a JWKS publishes it.
pub(crate) struct TestKey {
    encoding: EncodingKey,
    kid: String,
}

impl TestKey {
    fn generate(kid: &str) -> Self {
        let private = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).unwrap();
        let der = private.to_pkcs1_der().unwrap();
        Self {
            encoding: EncodingKey::from_rsa_der(der.as_bytes()),
            kid: kid.to_owned(),
        }
    }

    fn jwk(&self) -> Jwk {
        let mut jwk = Jwk::from_encoding_key(&self.encoding, Algorithm::RS256).unwrap();
        jwk.common.key_id = Some(self.kid.clone());
        jwk
    }

    /// A token with these claims, signed with this key (and naming it).
    pub(crate) fn sign(&self, claims: &Value) -> String {
        self.sign_as(&self.kid, claims)
    }

    /// A token signed with this key but naming key `kid`.
    pub(crate) fn sign_as(&self, kid: &str, claims: &Value) -> String {
        self.sign_with(self.header(kid), claims)
    }

    /// A token signed with this key whose header lists `crit` as critical extensions.
    pub(crate) fn sign_critical(&self, crit: &[&str], claims: &Value) -> String {
        let mut header = self.header(&self.kid);
        header.crit = Some(crit.iter().map(|name| (*name).to_owned()).collect());
        // What an extension named in `crit` would say.
        header.extras.insert("x-unknown", true);
        self.sign_with(header, claims)
    }

    /// A token signed with this key whose claims are `entries` in this order, a name given
    /// twice included (which a JSON object cannot hold).
    pub(crate) fn sign_entries(&self, entries: &[(&str, Value)]) -> String {
        struct Entries<'a>(&'a [(&'a str, Value)]);
        impl Serialize for Entries<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(self.0.len()))?;
                for (name, value) in self.0 {
                    map.serialize_entry(name, value)?;
                }
                map.end()
            }
        }
        encode(&self.header(&self.kid), &Entries(entries), &self.encoding).unwrap()
    }

    fn header(&self, kid: &str) -> Header {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.to_owned());
        header
    }

    fn sign_with(&self, header: Header, claims: &Value) -> String {
        encode(&header, claims, &self.encoding).unwrap()
    }
}

/// Two keys, generated once per test binary (RSA key generation is slow without
/// optimizations): `a` is published from the start, `b` only where a test publishes it.
pub(crate) fn keys() -> &'static (TestKey, TestKey) {
    static KEYS: OnceLock<(TestKey, TestKey)> = OnceLock::new();
    KEYS.get_or_init(|| {
        // With every feature on, jsonwebtoken has two crypto providers and picks none; the
        // server installs its pure-Rust one, and so do the tests before they sign.
        let _ = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.install_default();
        let b = std::thread::spawn(|| TestKey::generate("key-b"));
        let a = TestKey::generate("key-a");
        (a, b.join().unwrap())
    })
}

/// A key server: `/jwks` and `/.well-known/openid-configuration`, counting JWKS fetches,
/// failing or answering slowly on demand.
#[derive(Clone)]
pub(crate) struct KeyServer {
    pub(crate) base: String,
    set: Arc<Mutex<JwkSet>>,
    fetches: Arc<AtomicUsize>,
    pub(crate) failing: Arc<AtomicBool>,
    /// How long the JWKS takes to answer, in milliseconds.
    delay_ms: Arc<AtomicU64>,
}

impl KeyServer {
    pub(crate) async fn start(keys: &[&TestKey]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = Self {
            base: format!("http://{}", listener.local_addr().unwrap()),
            set: Arc::new(Mutex::new(JwkSet {
                keys: keys.iter().map(|key| key.jwk()).collect(),
            })),
            fetches: Arc::new(AtomicUsize::new(0)),
            failing: Arc::new(AtomicBool::new(false)),
            delay_ms: Arc::new(AtomicU64::new(0)),
        };
        let app = Router::new()
            .route("/jwks", get(serve_jwks))
            .route("/.well-known/openid-configuration", get(serve_discovery))
            .with_state(server.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        server
    }

    pub(crate) fn jwks_url(&self) -> String {
        format!("{}/jwks", self.base)
    }

    pub(crate) fn publish(&self, key: &TestKey) {
        self.set.lock().unwrap().keys.push(key.jwk());
    }

    pub(crate) fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// From now on, the JWKS answers `delay` after each request arrives (counted at once).
    pub(crate) fn answer_after(&self, delay: Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap();
        self.delay_ms.store(millis, Ordering::SeqCst);
    }

    /// Waits (up to 5 s) until the JWKS was requested `count` times in all.
    pub(crate) async fn wait_for_fetches(&self, count: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.fetches() < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the JWKS was requested {} times, not {count}",
                self.fetches()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn serve_jwks(State(server): State<KeyServer>) -> Response {
    server.fetches.fetch_add(1, Ordering::SeqCst);
    let delay = server.delay_ms.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(delay)).await;
    if server.failing.load(Ordering::SeqCst) {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let set = server.set.lock().unwrap().clone();
    Json(set).into_response()
}

async fn serve_discovery(State(server): State<KeyServer>) -> Response {
    Json(json!({"issuer": server.base, "jwks_uri": server.jwks_url()})).into_response()
}
