//! Which lock a request needs: the [`MakeKey`] trait and the built-in key functions.
//!
//! A key function looks at the request (method, URI, headers, extensions; never the body) and
//! returns the lock key, or `None` to let the request through **without** a lock. Requests
//! whose keys are equal run one at a time across every process sharing the backend.
//!
//! | built-in | key of `POST /jobs/42` with `Idempotency-Key: abc` |
//! |---|---|
//! | [`header("idempotency-key")`](header) | `idempotency-key:abc` |
//! | [`method_and_path()`](method_and_path) | `POST /jobs/42` |
//! | [`path_and_header("x-job-id")`](path_and_header) | `/jobs/42 <value of x-job-id>` (gRPC: method and a metadata field) |
//! | [`path_param("id")`][path_param] (feature `axum`, route `/jobs/{id}`) | `/jobs/{id}#42` |
//!
//! Each has `with_prefix` to choose the text before the value. Any closure
//! `Fn(&http::Request<B>) -> Option<String>` is a key function too.
//!
// `path_param` is behind the `axum` feature: linked to docs.rs (built with every feature)
// when it is off, so that docs built without it have no broken link.
#![cfg_attr(feature = "axum", doc = "[path_param]: path_param")]
#![cfg_attr(
    not(feature = "axum"),
    doc = concat!("[path_param]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/key/fn.path_param.html")
)]

use std::borrow::Cow;

use http::Request;
use http::header::HeaderName;

/// Derives the lock key of a request; `None` lets the request through unlocked.
///
/// Implemented for every closure `Fn(&http::Request<B>) -> Option<String>`, and by the
/// built-ins of this module. Keys are NFC-normalized and limited to 512 UTF-8 bytes by
/// `syncguard`; a request whose key is empty or too long is answered `400 Bad Request`
/// (gRPC `INVALID_ARGUMENT`) without running the handler.
///
/// ```
/// use http::Request;
/// use syncguard_tower::MakeKey;
///
/// // Lock per tenant, taken from a header; requests without it run unlocked.
/// let per_tenant = |request: &Request<()>| {
///     let tenant = request.headers().get("x-tenant")?.to_str().ok()?;
///     Some(format!("tenant:{tenant}"))
/// };
/// let request = Request::builder().header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(per_tenant.make_key(&request).as_deref(), Some("tenant:acme"));
/// assert_eq!(per_tenant.make_key(&Request::new(())), None);
/// ```
pub trait MakeKey<B> {
    /// The lock key of `request`, or `None` to run it without a lock.
    fn make_key(&self, request: &Request<B>) -> Option<String>;
}

impl<B, F> MakeKey<B> for F
where
    F: Fn(&Request<B>) -> Option<String>,
{
    fn make_key(&self, request: &Request<B>) -> Option<String> {
        self(request)
    }
}

/// The value of one header, for example an `Idempotency-Key`: see [`header`].
#[derive(Debug, Clone)]
#[must_use]
pub struct Header {
    name: HeaderName,
    prefix: Cow<'static, str>,
}

/// Locks on the value of the header `name`; the key is `"<name>:<value>"` (see
/// [`Header::with_prefix`]). A request without the header, or with an empty value, runs
/// unlocked. Non-UTF-8 bytes are replaced with U+FFFD.
///
/// # Panics
/// If `name` is not a valid header name (a programming error, caught on first use).
///
/// ```
/// use http::Request;
/// use syncguard_tower::{MakeKey, key};
///
/// let idempotency = key::header("Idempotency-Key");
/// let request = Request::builder().header("idempotency-key", "7f3a").body(()).unwrap();
/// assert_eq!(idempotency.make_key(&request).as_deref(), Some("idempotency-key:7f3a"));
/// ```
pub fn header(name: &str) -> Header {
    let name = HeaderName::try_from(name).unwrap_or_else(|error| {
        panic!("syncguard_tower::key::header({name:?}): not a valid header name: {error}")
    });
    let prefix = Cow::Owned(format!("{name}:"));
    Header { name, prefix }
}

impl Header {
    /// Puts `prefix` before the value instead of `"<name>:"` (an empty prefix keys on the bare
    /// value).
    ///
    /// ```
    /// use http::Request;
    /// use syncguard_tower::{MakeKey, key};
    ///
    /// let key = key::header("idempotency-key").with_prefix("orders:idem:");
    /// let request = Request::builder().header("idempotency-key", "7f3a").body(()).unwrap();
    /// assert_eq!(key.make_key(&request).as_deref(), Some("orders:idem:7f3a"));
    /// ```
    pub fn with_prefix(mut self, prefix: impl Into<Cow<'static, str>>) -> Self {
        self.prefix = prefix.into();
        self
    }
}

impl<B> MakeKey<B> for Header {
    fn make_key(&self, request: &Request<B>) -> Option<String> {
        let value = header_value(request, &self.name)?;
        Some([&self.prefix, &*value].concat())
    }
}

/// The first value of the header `name`, as text (non-UTF-8 bytes replaced); `None` when it
/// is absent or blank.
fn header_value<'r, B>(request: &'r Request<B>, name: &HeaderName) -> Option<Cow<'r, str>> {
    let value = String::from_utf8_lossy(request.headers().get(name)?.as_bytes());
    (!value.trim().is_empty()).then_some(value)
}

/// The method and the path: see [`method_and_path`].
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct MethodAndPath {
    prefix: Cow<'static, str>,
}

/// Locks every request on its method and path (without the query): `"POST /jobs/42"`. Every
/// request gets a lock.
///
/// ```
/// use http::{Method, Request};
/// use syncguard_tower::{MakeKey, key};
///
/// let request = Request::builder().method(Method::POST).uri("/jobs/42?x=1").body(()).unwrap();
/// assert_eq!(key::method_and_path().make_key(&request).as_deref(), Some("POST /jobs/42"));
/// ```
pub fn method_and_path() -> MethodAndPath {
    MethodAndPath::default()
}

impl MethodAndPath {
    /// Puts `prefix` before `"<METHOD> <path>"` (none by default).
    ///
    /// ```
    /// use syncguard_tower::key;
    /// let key = key::method_and_path().with_prefix("api:");
    /// # let _ = key;
    /// ```
    pub fn with_prefix(mut self, prefix: impl Into<Cow<'static, str>>) -> Self {
        self.prefix = prefix.into();
        self
    }
}

impl<B> MakeKey<B> for MethodAndPath {
    fn make_key(&self, request: &Request<B>) -> Option<String> {
        let (method, path) = (request.method().as_str(), request.uri().path());
        Some([&self.prefix, method, " ", path].concat())
    }
}

/// The path and one header: see [`path_and_header`].
#[derive(Debug, Clone)]
#[must_use]
pub struct PathAndHeader {
    name: HeaderName,
    prefix: Cow<'static, str>,
}

/// Locks on the path and the value of the header `name`: `"<path> <value>"`. Made for gRPC,
/// where the path is the method (`/jobs.Jobs/Run`) and the header a metadata entry the client
/// sets (`x-job-id`). A request without the header runs unlocked.
///
/// gRPC message fields travel in the body, which a layer does not read: send the field the
/// lock is about as metadata too, or lock inside the handler with `syncguard::with_lock`.
///
/// # Panics
/// If `name` is not a valid header name.
///
/// ```
/// use http::Request;
/// use syncguard_tower::{MakeKey, key};
///
/// let request = Request::builder()
///     .uri("/jobs.Jobs/Run")
///     .header("x-job-id", "42")
///     .body(())
///     .unwrap();
/// let key = key::path_and_header("x-job-id").make_key(&request);
/// assert_eq!(key.as_deref(), Some("/jobs.Jobs/Run 42"));
/// ```
pub fn path_and_header(name: &str) -> PathAndHeader {
    let name = HeaderName::try_from(name).unwrap_or_else(|error| {
        panic!("syncguard_tower::key::path_and_header({name:?}): not a valid header name: {error}")
    });
    PathAndHeader {
        name,
        prefix: Cow::Borrowed(""),
    }
}

impl PathAndHeader {
    /// Puts `prefix` before `"<path> <value>"` (none by default).
    ///
    /// ```
    /// let key = syncguard_tower::key::path_and_header("x-job-id").with_prefix("grpc:");
    /// # let _ = key;
    /// ```
    pub fn with_prefix(mut self, prefix: impl Into<Cow<'static, str>>) -> Self {
        self.prefix = prefix.into();
        self
    }
}

impl<B> MakeKey<B> for PathAndHeader {
    fn make_key(&self, request: &Request<B>) -> Option<String> {
        let value = header_value(request, &self.name)?;
        Some([&self.prefix, request.uri().path(), " ", &value].concat())
    }
}

#[cfg(feature = "axum")]
pub use path_param::{PathParam, path_param};

#[cfg(feature = "axum")]
mod path_param {
    use std::borrow::Cow;

    use axum::extract::MatchedPath;
    use http::Request;

    use super::MakeKey;

    /// One axum route parameter: see [`path_param`].
    #[derive(Debug, Clone)]
    #[must_use]
    pub struct PathParam {
        name: Cow<'static, str>,
        prefix: Option<Cow<'static, str>>,
    }

    /// Locks on the axum route parameter `name` (`{name}` or `{*name}` in the route); the key
    /// is `"<route>#<value>"`, for example `"/jobs/{id}#42"` (see [`PathParam::with_prefix`]).
    ///
    /// The key comes from the route axum matched ([`MatchedPath`]), which axum 0.8 sets when
    /// it routes a request, before it calls the route; so the layer must be added *to* the
    /// router, where it wraps each route:
    ///
    /// - **`Router::route_layer`** (as below): every request that matches a route is keyed
    ///   by it; a request that matches none is answered 404 without passing the layer.
    /// - **`Router::layer`** locks matched requests the same way. It also wraps the router's
    ///   fallback, so a request that matches no route passes the layer without a route, runs
    ///   unlocked and is answered 404 (with a warning logged).
    /// - **Around the whole router** (`LockLayer::layer(router)`, or a `ServiceBuilder` around
    ///   the router given to `axum::serve`) the layer runs before routing: no request has a
    ///   route, so **every request runs unlocked**, each with a warning. Key such a layer with
    ///   [`header`](super::header) or [`method_and_path`](super::method_and_path) instead.
    ///
    /// Under both router methods, a request for a matched path with a method the route does
    /// not serve goes through the lock too (axum wraps the route's 405 answer): while the key
    /// is held it is answered as contended, not 405. As with any axum layer, only the routes
    /// added before `layer`/`route_layer` are wrapped. A matched route without the parameter
    /// `name` runs unlocked.
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use syncguard::MemoryBackend;
    /// use syncguard_tower::{LockLayer, key};
    ///
    /// let app: Router = Router::new()
    ///     .route("/jobs/{id}/run", post(|| async { "ran" }))
    ///     .route_layer(LockLayer::for_axum(MemoryBackend::new(), key::path_param("id")));
    /// ```
    pub fn path_param(name: impl Into<Cow<'static, str>>) -> PathParam {
        PathParam {
            name: name.into(),
            prefix: None,
        }
    }

    impl PathParam {
        /// Puts `prefix` before the value instead of `"<route>#"`; routes that give the same
        /// prefix share their locks (`"job:"` on `/jobs/{id}/run` and `/jobs/{id}/cancel`).
        ///
        /// ```
        /// let key = syncguard_tower::key::path_param("id").with_prefix("job:");
        /// # let _ = key;
        /// ```
        pub fn with_prefix(mut self, prefix: impl Into<Cow<'static, str>>) -> Self {
            self.prefix = Some(prefix.into());
            self
        }
    }

    impl<B> MakeKey<B> for PathParam {
        fn make_key(&self, request: &Request<B>) -> Option<String> {
            let Some(matched) = request.extensions().get::<MatchedPath>() else {
                tracing::warn!(
                    param = %self.name,
                    "syncguard_tower::key::path_param found no matched route, so the request runs unlocked: it matched no route, or the LockLayer wraps the router from outside (add it with Router::route_layer instead)"
                );
                return None;
            };
            let value = super::route_param(matched.as_str(), request.uri().path(), &self.name)?;
            Some(match &self.prefix {
                Some(prefix) => [prefix, &*value].concat(),
                None => [matched.as_str(), "#", &value].concat(),
            })
        }
    }
}

/// The value of `{name}` (or `{*name}`) of `route` in `path`, percent-decoded.
#[cfg(feature = "axum")]
fn route_param(route: &str, path: &str, name: &str) -> Option<String> {
    let mut path_segments = path.split('/');
    for template in route.split('/') {
        let segment = path_segments.next();
        let Some(inner) = template.strip_prefix('{').and_then(|t| t.strip_suffix('}')) else {
            continue;
        };
        if let Some(wildcard) = inner.strip_prefix('*') {
            if wildcard == name {
                let rest: Vec<&str> = segment.into_iter().chain(path_segments).collect();
                return Some(percent_decode(&rest.join("/")));
            }
            return None;
        }
        if inner == name {
            return segment.map(percent_decode);
        }
    }
    None
}

/// `text` with its `%XX` escapes decoded (invalid ones kept as they are), as UTF-8 with
/// invalid sequences replaced.
#[cfg(feature = "axum")]
fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "axum")]
    fn route_params_are_found_and_decoded() {
        assert_eq!(
            route_param("/jobs/{id}/run", "/jobs/42/run", "id").as_deref(),
            Some("42")
        );
        assert_eq!(
            route_param("/jobs/{id}", "/jobs/a%20b%2F", "id").as_deref(),
            Some("a b/")
        );
        assert_eq!(
            route_param("/files/{*path}", "/files/a/b/c", "path").as_deref(),
            Some("a/b/c")
        );
        assert_eq!(route_param("/jobs/{id}", "/jobs/42", "other"), None);
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%4"), "%4");
        assert_eq!(percent_decode("%41%zz"), "A%zz");
    }

    #[test]
    fn headers_key_requests_and_absent_ones_run_unlocked() {
        let key = header("idempotency-key");
        let with = Request::builder()
            .header("idempotency-key", "abc")
            .body(())
            .unwrap();
        assert_eq!(key.make_key(&with).as_deref(), Some("idempotency-key:abc"));
        let empty = Request::builder()
            .header("idempotency-key", " ")
            .body(())
            .unwrap();
        assert_eq!(key.make_key(&empty), None);
        assert_eq!(key.make_key(&Request::new(())), None);
    }

    /// A repeated header keys on its first value, however many other headers come before it.
    #[test]
    fn header_keys_take_the_first_value_with_few_or_many_headers() {
        let key = header("idempotency-key");
        for others in [0, 3, 40] {
            let mut request = Request::builder();
            for i in 0..others {
                request = request.header(format!("x-other-{i}"), "v");
            }
            let request = request
                .header("Idempotency-Key", "first")
                .header("idempotency-key", "second")
                .body(())
                .unwrap();
            assert_eq!(
                key.make_key(&request).as_deref(),
                Some("idempotency-key:first"),
                "{others} other headers"
            );
            let without = Request::builder().header("x-other", "v").body(()).unwrap();
            assert_eq!(key.make_key(&without), None);
        }
    }

    #[test]
    fn built_in_keys_are_made_of_their_parts() {
        let request = Request::post("/jobs/7%20a?x=1")
            .header("idempotency-key", "7f3a")
            .header(
                "x-job-id",
                http::HeaderValue::from_bytes(b"\xff42").unwrap(),
            )
            .body(())
            .unwrap();
        let key = |key: &dyn MakeKey<()>| key.make_key(&request);
        assert_eq!(
            key(&header("idempotency-key").with_prefix("")).as_deref(),
            Some("7f3a")
        );
        assert_eq!(
            key(&method_and_path().with_prefix("api:")).as_deref(),
            Some("api:POST /jobs/7%20a")
        );
        assert_eq!(
            key(&path_and_header("idempotency-key").with_prefix("grpc:")).as_deref(),
            Some("grpc:/jobs/7%20a 7f3a")
        );
        // Bytes that are not UTF-8 are replaced.
        assert_eq!(
            key(&header("x-job-id")).as_deref(),
            Some("x-job-id:\u{fffd}42")
        );
        assert_eq!(key(&path_and_header("x-other")), None);
    }
}
