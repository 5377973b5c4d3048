//! Key functions that read an axum route parameter: a lock per resource ([`resource`]) or per
//! route and parameter ([`route_param`]).
//!
//! Where the layer goes on the router, and what it refuses: see [the key
//! module](super#route-keys-and-the-router).

use std::borrow::Cow;

use axum::extract::{MatchedPath, OriginalUri};
use http::Request;

use super::{MakeKey, NoKey};

/// A lock per resource, named by a route parameter: see [`resource`].
#[derive(Debug, Clone)]
#[must_use]
pub struct Resource {
    resource: Cow<'static, str>,
    param: Cow<'static, str>,
}

/// A lock per resource: the key is `"<resource>:<value of the route parameter param>"`, so
/// `key::resource("order", "id")` locks `/orders/42/pay` and `/orders/42/refund` on the
/// same key, `order:42`.
///
/// **The rule: two requests share a lock exactly when they name the same `resource` and carry
/// the same id.** Give every route that acts on one kind of resource the same name, whatever
/// its parameter is called (`resource("order", "order_id")` on `/shipments/{order_id}` shares
/// `order:42` too), and each kind its own name: `/users/{id}` with `resource("user", "id")`
/// locks `user:42`, never `order:42`. Where two routes on one order may run at once, lock per
/// route with [`route_param`] instead. `resource` may not contain `:`, so that the key's first
/// `:` ends it and no two resources' keys can meet (`"a:b" + "c"` and `"a" + "b:c"`).
///
/// The id is the percent-decoded path segment (or, for `{*param}`, the rest of the path).
/// The layer must be added with `Router::route_layer` (see [the key
/// module](super#route-keys-and-the-router)); a request that reaches the layer without a
/// matched route, or whose route has no `{param}`, is refused with 500, naming the parameter,
/// and a warning is logged.
///
/// # Panics
/// If `resource` is empty or contains `:`, or if `param` is empty or contains `{`, `}` or `/`
/// (programming errors, caught when the layer is built).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use axum::{Router, body::Body, routing::post};
/// use http::Request;
/// use syncguard::MemoryBackend;
/// use syncguard_tower::{HeldLock, LockLayer, key};
/// use tower::ServiceExt;
///
/// async fn key_of(lock: HeldLock) -> String {
///     lock.key().to_owned()
/// }
///
/// let backend = MemoryBackend::new();
/// let app = Router::new()
///     // One order's payment and refund run one at a time, on every replica...
///     .route("/orders/{id}/pay", post(key_of))
///     .route("/orders/{id}/refund", post(key_of))
///     .route_layer(LockLayer::for_axum(backend.clone(), key::resource("order", "id")))
///     // ...and a user with the same id is another resource, another lock.
///     .merge(
///         Router::new()
///             .route("/users/{id}", post(key_of))
///             .route_layer(LockLayer::for_axum(backend, key::resource("user", "id"))),
///     );
///
/// let call = |path: &str| app.clone().oneshot(Request::post(path).body(Body::empty()).unwrap());
/// let body = |response: http::Response<Body>| async move {
///     let bytes = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
///     String::from_utf8(bytes.to_vec()).unwrap()
/// };
/// assert_eq!(body(call("/orders/42/pay").await.unwrap()).await, "order:42");
/// assert_eq!(body(call("/orders/42/refund").await.unwrap()).await, "order:42");
/// assert_eq!(body(call("/users/42").await.unwrap()).await, "user:42");
/// # }
/// ```
pub fn resource(
    resource: impl Into<Cow<'static, str>>,
    param: impl Into<Cow<'static, str>>,
) -> Resource {
    let (resource, param) = (resource.into(), param.into());
    if resource.is_empty() || resource.contains(':') {
        panic!(
            "syncguard_tower::key::resource({resource:?}, {param:?}): the resource name must be non-empty and without ':'"
        );
    }
    check_param(&param, || format!("resource({resource:?}, {param:?})"));
    Resource { resource, param }
}

impl<B> MakeKey<B> for Resource {
    fn make_key(&self, request: &Request<B>) -> Result<String, NoKey> {
        let value = param_value(request, &self.param, || {
            format!("key::resource({:?}, {:?})", self.resource, self.param)
        })?;
        Ok([&*self.resource, ":", &value].concat())
    }
}

/// A lock per route and parameter value: see [`route_param`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RouteParam {
    param: Cow<'static, str>,
    prefix: Cow<'static, str>,
}

/// A lock per route *and* parameter value: the key is `"<route>#<value>"`, for example
/// `"/orders/{id}/pay#42"`, so `/orders/42/pay` and `/orders/42/refund` do **not** exclude
/// each other (their routes differ). The explicit choice where only calls of one route on one
/// resource must not overlap; for one request at a time per resource, use [`resource`].
///
/// Added to the router as [`resource`] is, with the same refusals (see [the key
/// module](super#route-keys-and-the-router)).
///
/// # Panics
/// If `param` is empty or contains `{`, `}` or `/`.
///
/// ```
/// use axum::{Router, routing::post};
/// use syncguard::MemoryBackend;
/// use syncguard_tower::{LockLayer, key};
///
/// // Two runs of one job never overlap; a run and a cancel of it may.
/// let app: Router = Router::new()
///     .route("/jobs/{id}/run", post(|| async { "ran" }))
///     .route("/jobs/{id}/cancel", post(|| async { "cancelled" }))
///     .route_layer(LockLayer::for_axum(MemoryBackend::new(), key::route_param("id")));
/// ```
pub fn route_param(param: impl Into<Cow<'static, str>>) -> RouteParam {
    let param = param.into();
    check_param(&param, || format!("route_param({param:?})"));
    RouteParam {
        param,
        prefix: Cow::Borrowed(""),
    }
}

impl RouteParam {
    /// Puts `prefix` before `"<route>#<value>"` (none by default), for example to keep the
    /// keys of two services sharing a backend apart.
    ///
    /// ```
    /// let key = syncguard_tower::key::route_param("id").with_prefix("billing:");
    /// # let _ = key;
    /// ```
    pub fn with_prefix(mut self, prefix: impl Into<Cow<'static, str>>) -> Self {
        self.prefix = prefix.into();
        self
    }
}

impl<B> MakeKey<B> for RouteParam {
    fn make_key(&self, request: &Request<B>) -> Result<String, NoKey> {
        let value = param_value(request, &self.param, || {
            format!("key::route_param({:?})", self.param)
        })?;
        let route = request
            .extensions()
            .get::<MatchedPath>()
            .map_or("", MatchedPath::as_str);
        Ok([&*self.prefix, route, "#", &value].concat())
    }
}

/// Panics unless `param` can name a route parameter; `call` shows the constructor's call.
fn check_param(param: &str, call: impl FnOnce() -> String) {
    if param.is_empty() || param.contains(['{', '}', '/']) {
        panic!(
            "syncguard_tower::key::{}: the route parameter's name must be non-empty, without '{{', '}}' or '/'",
            call()
        );
    }
}

/// The value of the parameter `param` of the route `request` matched, or why there is none;
/// `key_function` names the key function in that text.
fn param_value<B>(
    request: &Request<B>,
    param: &str,
    key_function: impl FnOnce() -> String,
) -> Result<String, NoKey> {
    let Some(matched) = request.extensions().get::<MatchedPath>() else {
        return Err(NoKey::misconfigured(format!(
            "no route was matched before the LockLayer, so {} has no parameter `{{{param}}}` to read: add the layer with Router::route_layer (under Router::layer, requests that match no route reach it too; around the router, it runs before routing)",
            key_function()
        )));
    };
    // The route template is the whole one, nest prefixes included; so is the original URI, while
    // a nested router's inner services see the URI with the prefix stripped.
    let path = request
        .extensions()
        .get::<OriginalUri>()
        .map_or_else(|| request.uri().path(), |original| original.0.path());
    route_value(matched.as_str(), path, param).ok_or_else(|| {
        NoKey::misconfigured(format!(
            "the route `{}` has no parameter `{{{param}}}`, which {} reads: put the layer only on routes with that parameter, or name the parameter the route has",
            matched.as_str(),
            key_function()
        ))
    })
}

/// The value of `{name}` (or `{*name}`) of `route` in `path`, percent-decoded.
fn route_value(route: &str, path: &str, name: &str) -> Option<String> {
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
fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_params_are_found_and_decoded() {
        assert_eq!(
            route_value("/jobs/{id}/run", "/jobs/42/run", "id").as_deref(),
            Some("42")
        );
        assert_eq!(
            route_value("/jobs/{id}", "/jobs/a%20b%2F", "id").as_deref(),
            Some("a b/")
        );
        assert_eq!(
            route_value("/files/{*path}", "/files/a/b/c", "path").as_deref(),
            Some("a/b/c")
        );
        assert_eq!(route_value("/jobs/{id}", "/jobs/42", "other"), None);
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%4"), "%4");
        assert_eq!(percent_decode("%41%zz"), "A%zz");
    }

    #[test]
    fn without_a_matched_route_the_key_names_the_parameter_and_the_fix() {
        let request = Request::post("/orders/42").body(()).unwrap();
        let refused = resource("order", "id").make_key(&request).unwrap_err();
        assert!(refused.is_misconfigured());
        let text = refused.to_string();
        assert!(text.contains("`{id}`"), "{text}");
        assert!(text.contains(r#"key::resource("order", "id")"#), "{text}");
        assert!(text.contains("Router::route_layer"), "{text}");
        let refused = route_param("id").make_key(&request).unwrap_err();
        assert!(refused.to_string().contains(r#"key::route_param("id")"#));
    }

    /// Bad names are refused when the key function is made, naming the call.
    #[test]
    fn bad_resource_and_parameter_names_panic_with_the_call() {
        for (resource_name, param) in [
            ("", "id"),
            ("order:x", "id"),
            ("order", ""),
            ("order", "{id}"),
            ("order", "a/b"),
        ] {
            let panicked = std::panic::catch_unwind(|| resource(resource_name, param)).unwrap_err();
            let text = panicked.downcast_ref::<String>().unwrap();
            assert!(
                text.contains(&format!("resource({resource_name:?}, {param:?})")),
                "{text}"
            );
        }
        let panicked = std::panic::catch_unwind(|| route_param("")).unwrap_err();
        assert!(
            panicked
                .downcast_ref::<String>()
                .unwrap()
                .contains("route_param(\"\")")
        );
    }
}
