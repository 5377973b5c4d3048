//! Key functions that read the request itself: a header, the method and path, the path and
//! a header (gRPC).

use std::borrow::Cow;

use http::Request;
use http::header::HeaderName;

use super::{MakeKey, NoKey};

/// The value of one header, for example an `Idempotency-Key`: see [`header`].
#[derive(Debug, Clone)]
#[must_use]
pub struct Header {
    name: HeaderName,
    prefix: Cow<'static, str>,
}

/// Locks on the value of the header `name`; the key is `"<name>:<value>"` (see
/// [`Header::with_prefix`]). A request without the header, or with an empty value, has no key
/// ([`NoKey::missing`] "header `<name>`": refused with 400, or run unlocked if the layer says
/// [`Keyless::RunUnlocked`](crate::Keyless::RunUnlocked)). Non-UTF-8 bytes are replaced with
/// U+FFFD.
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
/// assert_eq!(idempotency.make_key(&request).unwrap(), "idempotency-key:7f3a");
/// let refused = idempotency.make_key(&Request::new(())).unwrap_err();
/// let expected = "the request has no header `idempotency-key` (or an empty one)";
/// assert_eq!(refused.to_string(), expected);
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
    /// assert_eq!(key.make_key(&request).unwrap(), "orders:idem:7f3a");
    /// ```
    pub fn with_prefix(mut self, prefix: impl Into<Cow<'static, str>>) -> Self {
        self.prefix = prefix.into();
        self
    }
}

impl<B> MakeKey<B> for Header {
    fn make_key(&self, request: &Request<B>) -> Result<String, NoKey> {
        let value = header_value(request, &self.name)?;
        Ok([&self.prefix, &*value].concat())
    }
}

/// The first value of the header `name`, as text (non-UTF-8 bytes replaced), or what is
/// missing when it is absent or blank.
fn header_value<'r, B>(request: &'r Request<B>, name: &HeaderName) -> Result<Cow<'r, str>, NoKey> {
    let value = request
        .headers()
        .get(name)
        .map(|value| String::from_utf8_lossy(value.as_bytes()));
    value
        .filter(|value| !value.trim().is_empty())
        .ok_or_else(|| NoKey::missing(format!("header `{name}` (or an empty one)")))
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
/// assert_eq!(key::method_and_path().make_key(&request).unwrap(), "POST /jobs/42");
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
    fn make_key(&self, request: &Request<B>) -> Result<String, NoKey> {
        let (method, path) = (request.method().as_str(), request.uri().path());
        Ok([&self.prefix, method, " ", path].concat())
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
/// sets (`x-job-id`). A request without the header has no key, as with [`header`].
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
/// assert_eq!(key.unwrap(), "/jobs.Jobs/Run 42");
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
    fn make_key(&self, request: &Request<B>) -> Result<String, NoKey> {
        let value = header_value(request, &self.name)?;
        Ok([&self.prefix, request.uri().path(), " ", &value].concat())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_key_requests_and_absent_or_blank_ones_name_the_header() {
        let key = header("idempotency-key");
        let with = Request::builder()
            .header("idempotency-key", "abc")
            .body(())
            .unwrap();
        assert_eq!(
            key.make_key(&with).as_deref().ok(),
            Some("idempotency-key:abc")
        );
        let empty = Request::builder()
            .header("idempotency-key", " ")
            .body(())
            .unwrap();
        assert_eq!(
            key.make_key(&empty).unwrap_err().to_string(),
            "the request has no header `idempotency-key` (or an empty one)"
        );
        let none = key.make_key(&Request::new(())).unwrap_err();
        assert!(!none.is_misconfigured());
        assert_eq!(
            none.to_string(),
            "the request has no header `idempotency-key` (or an empty one)"
        );
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
                key.make_key(&request).as_deref().ok(),
                Some("idempotency-key:first"),
                "{others} other headers"
            );
            let without = Request::builder().header("x-other", "v").body(()).unwrap();
            assert!(key.make_key(&without).is_err());
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
            key(&header("idempotency-key").with_prefix(""))
                .as_deref()
                .ok(),
            Some("7f3a")
        );
        assert_eq!(
            key(&method_and_path().with_prefix("api:")).as_deref().ok(),
            Some("api:POST /jobs/7%20a")
        );
        assert_eq!(
            key(&path_and_header("idempotency-key").with_prefix("grpc:"))
                .as_deref()
                .ok(),
            Some("grpc:/jobs/7%20a 7f3a")
        );
        // Bytes that are not UTF-8 are replaced.
        assert_eq!(
            key(&header("x-job-id")).as_deref().ok(),
            Some("x-job-id:\u{fffd}42")
        );
        assert_eq!(
            key(&path_and_header("x-other")).unwrap_err().to_string(),
            "the request has no header `x-other` (or an empty one)"
        );
    }
}
