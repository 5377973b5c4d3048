//! Which lock a request needs: the [`MakeKey`] trait and the built-in key functions.
//!
//! A key function looks at the request (method, URI, headers, extensions; never the body) and
//! returns the lock key, or a [`NoKey`] naming what the request (or its route) lacks. Requests
//! whose keys are equal run one at a time across every process sharing the backend.
//!
//! | built-in | key of `POST /orders/42/pay` with `Idempotency-Key: abc` |
//! |---|---|
//! | [`resource("order", "id")`][resource] (feature `axum`, route `/orders/{id}/pay`) | `order:42` |
//! | [`route_param("id")`][route_param] (feature `axum`, route `/orders/{id}/pay`) | `/orders/{id}/pay#42` |
//! | [`header("idempotency-key")`](header) | `idempotency-key:abc` |
//! | [`method_and_path()`](method_and_path) | `POST /orders/42/pay` |
//! | [`path_and_header("x-job-id")`](path_and_header) | `/orders/42/pay <value of x-job-id>` (gRPC: method and a metadata field) |
//!
//! Any closure `Fn(&http::Request<B>) -> Option<String>` (or `-> Result<String, NoKey>`, to
//! name what is missing) is a key function too.
//!
//! # A lock per resource
//! [`resource`][resource] is the key for "one request at a time per order": every route that
//! acts on an order names the resource `"order"` and the route parameter that holds its id, so
//! `/orders/{id}/pay` and `/orders/{id}/refund` for order 42 share the lock `order:42`, while
//! `/users/{id}` (resource `"user"`) locks `user:42`, another lock. The rule: **two requests
//! share a lock exactly when they name the same resource and carry the same id.**
//! [`route_param`][route_param] is the explicit choice of a lock per route *and* id, when two
//! routes on one resource may run at once.
//!
//! # Route keys and the router
//! [`resource`][resource] and [`route_param`][route_param] (feature `axum`) read the route axum
//! matched (`axum::extract::MatchedPath`), which axum 0.8 sets when it routes a request, before
//! it calls the route; so the layer must be added *to* the router, where it wraps each route:
//!
//! - **`Router::route_layer`**: every request that matches a route is keyed by it; a request
//!   that matches none is answered 404 without passing the layer. The way to add it.
//! - **`Router::layer`** keys matched requests the same way. It also wraps the router's
//!   fallback, so a request that matches no route reaches the layer without a route: it is
//!   refused (500, [`NoKey::misconfigured`]), not answered 404.
//! - **Around the whole router** (`LockLayer::layer(router)`, or a `ServiceBuilder` around the
//!   router given to `axum::serve`) the layer runs before routing: no request has a route, so
//!   **every request is refused** (500), each with a warning saying so. Key such a layer with
//!   [`header`](header) or [`method_and_path`](method_and_path) instead.
//!
//! A matched route without the parameter is refused the same way (500, naming the route and
//! the parameter), whatever [`Keyless`](crate::Keyless) says: put the layer only on the
//! routes that have it. Under both router methods, a request for a matched path with a method
//! the route does not serve goes through the lock too (axum wraps the route's 405 answer):
//! while the key is held it is answered as contended, not 405. As with any axum layer, only
//! the routes added before `layer`/`route_layer` are wrapped.
//!
//! # When there is no key
//! A request the key function makes no key for is **refused, never run unlocked by
//! mistake**: the layer answers without running the handler and logs a warning; both name
//! what was missing ([`NoKey`]'s text).
//!
//! - The request lacks it ([`NoKey::missing`]: no `Idempotency-Key` header, a closure that
//!   returned `None`): `400 Bad Request` (gRPC `INVALID_ARGUMENT`), unless the layer was told
//!   that such requests run unlocked ([`Keyless::RunUnlocked`](crate::Keyless::RunUnlocked)).
//! - The route cannot give it ([`NoKey::misconfigured`]: a route without the parameter, a
//!   layer added where no route is matched): `500 Internal Server Error` (gRPC `INTERNAL`),
//!   always; put the layer only on the routes that have the parameter.
//!
// The route keys are behind the `axum` feature: linked to docs.rs (built with every feature)
// when it is off, so that docs built without it have no broken link.
#![cfg_attr(
    feature = "axum",
    doc = "[resource]: resource",
    doc = "[route_param]: route_param"
)]
#![cfg_attr(
    not(feature = "axum"),
    doc = concat!("[resource]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/key/fn.resource.html"),
    doc = concat!("[route_param]: https://docs.rs/syncguard-tower/", env!("CARGO_PKG_VERSION"), "/syncguard_tower/key/fn.route_param.html")
)]

mod no_key;
mod request;
#[cfg(feature = "axum")]
mod route;

use http::Request;

pub use no_key::NoKey;
pub use request::{Header, MethodAndPath, PathAndHeader, header, method_and_path, path_and_header};
#[cfg(feature = "axum")]
pub use route::{Resource, RouteParam, resource, route_param};

/// Derives the lock key of a request, or says what the request (or its route) lacks.
///
/// Implemented by the built-ins of this module and by every closure
/// `Fn(&http::Request<B>) -> R` whose `R` is `Option<String>` (`None` is
/// [`NoKey::missing`] of "a lock key") or `Result<String, NoKey>`. Keys are NFC-normalized
/// and limited to 512 UTF-8 bytes by `syncguard`; a request whose key is empty or too long is
/// answered `400 Bad Request` (gRPC `INVALID_ARGUMENT`) without running the handler. What the
/// layer does with a [`NoKey`] is in [the module's documentation](self#when-there-is-no-key).
///
/// ```
/// use http::Request;
/// use syncguard_tower::MakeKey;
/// use syncguard_tower::key::NoKey;
///
/// // Lock per tenant, taken from a header; a request without it is refused, naming it.
/// let per_tenant = |request: &Request<()>| {
///     let tenant = request.headers().get("x-tenant").and_then(|v| v.to_str().ok());
///     let tenant = tenant.ok_or_else(|| NoKey::missing("header `x-tenant`"))?;
///     Ok(format!("tenant:{tenant}"))
/// };
/// let request = Request::builder().header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(per_tenant.make_key(&request).unwrap(), "tenant:acme");
/// let refused = per_tenant.make_key(&Request::new(())).unwrap_err();
/// assert_eq!(refused.to_string(), "the request has no header `x-tenant`");
/// ```
pub trait MakeKey<B> {
    /// The lock key of `request`, or what it lacks.
    fn make_key(&self, request: &Request<B>) -> Result<String, NoKey>;
}

impl<B, F, R> MakeKey<B> for F
where
    F: Fn(&Request<B>) -> R,
    R: KeyResult,
{
    fn make_key(&self, request: &Request<B>) -> Result<String, NoKey> {
        self(request).into_key()
    }
}

/// What a closure used as a key function may return: `Option<String>` or
/// `Result<String, NoKey>`. Sealed.
pub trait KeyResult: sealed::Sealed {
    /// The key, or what is missing.
    fn into_key(self) -> Result<String, NoKey>;
}

impl KeyResult for Option<String> {
    fn into_key(self) -> Result<String, NoKey> {
        self.ok_or_else(|| NoKey::missing("lock key (the layer's key function returned None)"))
    }
}

impl KeyResult for Result<String, NoKey> {
    fn into_key(self) -> Result<String, NoKey> {
        self
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for Option<String> {}
    impl Sealed for Result<String, super::NoKey> {}
}
