//! Configuration of the Firestore backend.

use std::time::Duration;

use crate::error::LockError;
use crate::timeouts::check_timeouts;

/// Every setting of a [`FirestoreBackend`](super::FirestoreBackend) but which project it uses:
/// what [`FirestoreBackend::connect_with`](super::FirestoreBackend::connect_with) (beside the
/// project id) and [`FirestoreBackend::new`](super::FirestoreBackend::new) (beside your client)
/// take.
///
/// Set with `with_*`, read with the bare name. Validated when the backend is made: each
/// collection must be a valid Firestore collection id (non-empty, at most 1500 bytes, no `/`,
/// not `.` or `..`, not of the reserved form `__name__`), and the two collections must differ,
/// so that removing lock documents can never reach fence counters; timeouts must be at least
/// 1 ms. Anything else is [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) naming the setting.
///
/// # Default
/// | setting | default |
/// |---|---|
/// | [`lock_collection`](Self::with_lock_collection) | `locks` |
/// | [`fence_collection`](Self::with_fence_collection) | `fence_counters` |
/// | [`max_transaction_retries`](Self::with_max_transaction_retries) | `10` |
/// | [`connect_timeout`](Self::with_connect_timeout) | 5 s (only for `connect_with`) |
/// | [`operation_timeout`](Self::with_operation_timeout) | 5 s |
///
/// ```
/// use syncguard::firestore::FirestoreConfig;
///
/// let config = FirestoreConfig::new()
///     .with_lock_collection("app_locks")
///     .with_fence_collection("app_fence_counters");
/// assert!(config.validate().is_ok());
/// assert!(FirestoreConfig::new().with_fence_collection("locks").validate().is_err());
/// assert!(FirestoreConfig::new().with_lock_collection("a/b").validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirestoreConfig {
    lock_collection: String,
    fence_collection: String,
    max_transaction_retries: u32,
    operation_timeout: Duration,
    /// Only for the client `connect_with` makes: `None` unless set, so that `new` can tell.
    connect_timeout: Option<Duration>,
}

/// How long making a client may take unless set.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for FirestoreConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// Firestore's limit on document and collection ids, in bytes.
pub(super) const MAX_ID_BYTES: usize = 1500;

impl FirestoreConfig {
    /// The default configuration (see the table above).
    ///
    /// ```
    /// let config = syncguard::firestore::FirestoreConfig::new();
    /// assert_eq!(config.lock_collection(), "locks");
    /// assert_eq!(config.fence_collection(), "fence_counters");
    /// ```
    pub fn new() -> Self {
        Self {
            lock_collection: "locks".to_owned(),
            fence_collection: "fence_counters".to_owned(),
            max_transaction_retries: 10,
            operation_timeout: Duration::from_secs(5),
            connect_timeout: None,
        }
    }

    /// The collection holding lock documents (`{lockId, expiresAtMs, acquiredAtMs, key,
    /// fence}`), one per locked key.
    ///
    /// ```
    /// let config = syncguard::firestore::FirestoreConfig::new().with_lock_collection("app_locks");
    /// assert_eq!(config.lock_collection(), "app_locks");
    /// ```
    #[must_use]
    pub fn with_lock_collection(mut self, name: impl Into<String>) -> Self {
        self.lock_collection = name.into();
        self
    }

    /// The collection holding fence counter documents (`{fence, keyDebug}`). They are never
    /// deleted: deleting one would let fences repeat.
    ///
    /// ```
    /// let config = syncguard::firestore::FirestoreConfig::new().with_fence_collection("app_fences");
    /// assert_eq!(config.fence_collection(), "app_fences");
    /// ```
    #[must_use]
    pub fn with_fence_collection(mut self, name: impl Into<String>) -> Self {
        self.fence_collection = name.into();
        self
    }

    /// How many times one operation runs again when its commit finds a document changed since
    /// it read it (a concurrent operation on the same key committed first), or Firestore
    /// aborted its transaction (`ABORTED`). Each retry reads again and takes the time again,
    /// after a random pause of up to 20 ms for the first retry, the bound doubling with each
    /// retry up to 500 ms (with the default 10 retries, at most about 3 s of pauses in all):
    /// retries are bounded. When they run out (at once with `0`), the operation fails with
    /// [`ErrorCode::ServiceUnavailable`](crate::ErrorCode::ServiceUnavailable), which is retryable.
    /// Other errors are never retried here.
    ///
    /// ```
    /// let config = syncguard::firestore::FirestoreConfig::new().with_max_transaction_retries(0);
    /// assert_eq!(config.max_transaction_retries(), 0);
    /// ```
    #[must_use]
    pub const fn with_max_transaction_retries(mut self, retries: u32) -> Self {
        self.max_transaction_retries = retries;
        self
    }

    /// How long making the client may take in
    /// [`connect_with`](super::FirestoreBackend::connect_with) (finding credentials, and the
    /// token and channel they give), which it bounds. Only for `connect_with`:
    /// [`new`](super::FirestoreBackend::new) takes a client already made, and refuses a
    /// configuration that sets it.
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = syncguard::firestore::FirestoreConfig::new()
    ///     .with_connect_timeout(Duration::from_secs(10));
    /// assert_eq!(config.connect_timeout(), Duration::from_secs(10));
    /// ```
    #[must_use]
    pub const fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How long one lock operation may take, end to end (its reads, its commit and the
    /// commit's retries on conflict); past it, [`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout). Firestore calls
    /// have no deadline of their own, so without this a partition would hold a caller as long
    /// as TCP does. An acquire cut short may still land: its lock is released in the
    /// background by its lock id (see [timeouts](super#timeouts-and-acquires-in-doubt)).
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = syncguard::firestore::FirestoreConfig::new()
    ///     .with_operation_timeout(Duration::from_secs(2));
    /// assert_eq!(config.operation_timeout(), Duration::from_secs(2));
    /// ```
    #[must_use]
    pub const fn with_operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// How long making the client may take in `connect_with`.
    pub const fn connect_timeout(&self) -> Duration {
        match self.connect_timeout {
            Some(timeout) => timeout,
            None => DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// How long one lock operation may take, end to end.
    pub const fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// The first setting of `self` that only a client syncguard makes can apply, if one is
    /// set: what [`FirestoreBackend::new`](super::FirestoreBackend::new) refuses.
    pub(super) fn connect_only_setting(&self) -> Option<&'static str> {
        self.connect_timeout.map(|_| "with_connect_timeout")
    }

    /// The lock collection name.
    ///
    /// ```
    /// assert_eq!(syncguard::firestore::FirestoreConfig::new().lock_collection(), "locks");
    /// ```
    pub fn lock_collection(&self) -> &str {
        &self.lock_collection
    }

    /// The fence counter collection name.
    ///
    /// ```
    /// assert_eq!(syncguard::firestore::FirestoreConfig::new().fence_collection(), "fence_counters");
    /// ```
    pub fn fence_collection(&self) -> &str {
        &self.fence_collection
    }

    /// How many times an aborted transaction is run again.
    ///
    /// ```
    /// assert_eq!(syncguard::firestore::FirestoreConfig::new().max_transaction_retries(), 10);
    /// ```
    pub const fn max_transaction_retries(&self) -> u32 {
        self.max_transaction_retries
    }

    /// Checks the collection names.
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) saying which name is wrong
    /// and what is accepted.
    ///
    /// ```
    /// use syncguard::firestore::FirestoreConfig;
    ///
    /// let error = FirestoreConfig::new().with_lock_collection("").validate().unwrap_err();
    /// assert!(error.to_string().contains("lock collection"));
    /// ```
    pub fn validate(&self) -> Result<(), LockError> {
        check_timeouts(
            "FirestoreConfig",
            &[
                ("with_connect_timeout", self.connect_timeout()),
                ("with_operation_timeout", self.operation_timeout),
            ],
        )?;
        check_collection("lock collection", &self.lock_collection)?;
        check_collection("fence collection", &self.fence_collection)?;
        if self.lock_collection == self.fence_collection {
            return Err(LockError::invalid_argument(format!(
                "the fence collection must differ from the lock collection (both are {:?}); \
                 removing lock documents must never reach fence counters",
                self.lock_collection
            )));
        }
        Ok(())
    }
}

fn check_collection(what: &str, name: &str) -> Result<(), LockError> {
    if let Some(problem) = id_problem(name) {
        return Err(LockError::invalid_argument(format!(
            "{what} {name:?} is not a valid Firestore collection id: {problem}; use a plain name \
             such as \"locks\""
        )));
    }
    Ok(())
}

/// Why `id` cannot be a Firestore document or collection id, if it cannot.
pub(super) fn id_problem(id: &str) -> Option<&'static str> {
    if id.is_empty() {
        Some("it is empty")
    } else if id.len() > MAX_ID_BYTES {
        Some("it is longer than 1500 bytes")
    } else if id.contains('/') {
        Some("it contains '/'")
    } else if id == "." || id == ".." {
        Some("'.' and '..' are reserved")
    } else if id.len() >= 4 && id.starts_with("__") && id.ends_with("__") {
        Some("ids of the form __name__ are reserved")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(FirestoreConfig::new().validate().is_ok());
        for bad in ["", "a/b", ".", "..", "__x__", &"c".repeat(1501)] {
            let error = FirestoreConfig::new()
                .with_lock_collection(bad)
                .validate()
                .unwrap_err();
            assert_eq!(error.code(), crate::ErrorCode::InvalidArgument, "{bad:?}");
            assert!(
                FirestoreConfig::new()
                    .with_fence_collection(bad)
                    .validate()
                    .is_err()
            );
        }
        let same = FirestoreConfig::new()
            .with_lock_collection("x")
            .with_fence_collection("x");
        assert!(same.validate().unwrap_err().to_string().contains("differ"));
        let error = FirestoreConfig::new()
            .with_operation_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(
            error.to_string().contains("with_operation_timeout"),
            "{error}"
        );
        assert!(id_problem("__").is_none());
        assert!(id_problem("job:42").is_none());
    }
}
