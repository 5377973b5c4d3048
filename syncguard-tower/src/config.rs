//! What the services and requests of one layer share: the backend, the lock options, when to
//! release, what to do without a key, and how to answer a held key.
//!
//! Near the leaf of the crate's modules: [`layer`](crate::LockLayer) builds it, the service,
//! the response future, the body and the rejections read it, and it imports only
//! `retry_after` (a leaf).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use syncguard::{LockBackend, LockName, LockOptions, RetryPolicy};

use crate::retry_after::{DEFAULT_MAX_RETRY_AFTER, HoldTimes};

/// When the layer releases a request's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ReleaseOn {
    /// When the inner service's response future completes, that is once the handler has
    /// returned the response head (status and headers). The default.
    ///
    /// The lock is released (and the release awaited, for up to a second) before the response
    /// is handed on, so a client that sends the next request with the same key after reading
    /// the response finds the lock free. **A streaming body is sent after the release,
    /// unlocked**: if producing the body is part of the critical section (a body that streams
    /// the output of the work), use [`BodyEnd`](Self::BodyEnd).
    #[default]
    ResponseFuture,
    /// When the response body has been sent in full (it reported its end), or when it is
    /// dropped unfinished (the client went away). The lock, its heartbeat and loss detection
    /// cover the whole stream: with [`OnLost::Cancel`](syncguard::OnLost::Cancel) a loss while
    /// streaming ends the body with an error, which aborts the response (HTTP/1 closes the
    /// connection, HTTP/2 resets the stream), because the status has already been sent.
    BodyEnd,
}

/// What the layer does with a request its key function made no key for, because the request
/// lacks what the key is made of ([`NoKey::missing`](crate::key::NoKey::missing)).
///
/// A route that cannot give a key ([`NoKey::misconfigured`](crate::key::NoKey::misconfigured))
/// is refused whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Keyless {
    /// Refuse it without running the handler: `400 Bad Request` (gRPC `INVALID_ARGUMENT`) and
    /// a warning, both naming what is missing. The default: no request runs unlocked by
    /// mistake.
    #[default]
    Refuse,
    /// Run it **without a lock** ("no key, no lock"), for keys that are optional, such as an
    /// `Idempotency-Key` that clients may leave out. Logged at debug level; a handler that
    /// extracts [`HeldLock`](crate::HeldLock) gets a rejection naming what was missing
    /// (extract `Option<HeldLock>` in handlers that serve such requests).
    RunUnlocked,
}

/// The protocol a layer answers in, set by its constructor to match the layer's type
/// ([`Http`](crate::protocol::Http) or `Grpc`), with the answer to a key held elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answers {
    /// HTTP statuses and problem documents.
    Http { contended: StatusCode },
    /// gRPC statuses.
    #[cfg(feature = "grpc")]
    Grpc { contended: tonic::Code },
}

/// Settings shared by every service of one layer, and by their requests.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) backend: Arc<dyn LockBackend>,
    /// How every request's lock is taken and kept (ttl, waiting, heartbeat, hold cap, what a
    /// loss does); the key is each request's own.
    pub(crate) options: LockOptions,
    pub(crate) release: ReleaseOn,
    pub(crate) keyless: Keyless,
    /// The protocol of the answers, as the layer's type says, and its answer to a key held
    /// elsewhere.
    pub(crate) answers: Answers,
    /// The bound of a contended answer's `Retry-After`.
    pub(crate) max_retry_after: Duration,
    /// The holds this layer ended, for the `Retry-After` hint.
    pub(crate) holds: Arc<HoldTimes>,
}

impl Config {
    pub(crate) fn new(backend: Arc<dyn LockBackend>) -> Self {
        Self {
            backend,
            options: default_options(),
            release: ReleaseOn::default(),
            keyless: Keyless::default(),
            answers: Answers::Http {
                contended: StatusCode::LOCKED,
            },
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
            holds: Arc::default(),
        }
    }

    /// How logs name the lock on `key` (as its guard would, once taken): the hash of the
    /// normalized key, and the key itself only if the options show keys.
    pub(crate) fn lock_name(&self, key: &str) -> LockName {
        let show_key = self.options.show_key();
        match syncguard::backend::key::normalize_key(key) {
            Ok(normalized) => LockName::new(&normalized, show_key),
            Err(_) => LockName::new(key, show_key),
        }
    }
}

/// The layer's default options: syncguard's defaults, except that a held key is answered at
/// once instead of waited for.
pub(crate) fn default_options() -> LockOptions {
    LockOptions::builder()
        .retry(RetryPolicy::single_attempt())
        .build()
        .expect("syncguard's default ttl is valid")
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("backend", &self.backend.capabilities().backend)
            .field("options", &self.options)
            .field("release", &self.release)
            .field("keyless", &self.keyless)
            .field("answers", &self.answers)
            .field("max_retry_after", &self.max_retry_after)
            .finish()
    }
}

/// What the services of one layer share: each request clones it once (axum clones the service
/// for every request), so it is one reference count, not one per field.
pub(crate) struct Layered<K> {
    pub(crate) make_key: Arc<K>,
    pub(crate) config: Arc<Config>,
}
