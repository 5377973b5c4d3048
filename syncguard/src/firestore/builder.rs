//! [`FirestoreBackendBuilder`]: a backend that makes its own client.

use firestore::FirestoreDb;

use super::error::map_error;
use super::{FirestoreBackend, FirestoreConfig};
use crate::error::LockError;

/// Builds a [`FirestoreBackend`] that makes its own client; from
/// [`FirestoreBackend::builder`].
///
/// ```no_run
/// use syncguard::firestore::{FirestoreBackend, FirestoreConfig};
///
/// #[tokio::main]
/// async fn main() -> Result<(), syncguard::LockError> {
///     let config = FirestoreConfig::new()
///         .with_lock_collection("app_locks")
///         .with_fence_collection("app_fence_counters");
///     let backend = FirestoreBackend::builder("my-project")
///         .config(config)
///         .build()
///         .await?;
///     println!("{:?}", backend.config());
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct FirestoreBackendBuilder {
    project_id: String,
    config: FirestoreConfig,
}

impl FirestoreBackendBuilder {
    /// What [`FirestoreBackend::builder`] starts from: the default configuration, for
    /// `project_id`.
    pub(super) fn new(project_id: &str) -> Self {
        Self {
            project_id: project_id.to_owned(),
            config: FirestoreConfig::default(),
        }
    }

    /// The collections and transaction behaviour (default [`FirestoreConfig::new`]).
    ///
    /// ```
    /// use syncguard::firestore::{FirestoreBackend, FirestoreConfig};
    ///
    /// let builder = FirestoreBackend::builder("my-project")
    ///     .config(FirestoreConfig::new().with_max_transaction_retries(3));
    /// # let _ = builder;
    /// ```
    pub fn config(mut self, config: FirestoreConfig) -> Self {
        self.config = config;
        self
    }

    /// Validates the configuration, then creates a client for the project (Application
    /// Default Credentials, or the emulator named by `FIRESTORE_EMULATOR_HOST`) and the
    /// backend on it.
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for an invalid
    /// configuration or an empty project id
    /// (before any I/O); [`ErrorCode::AuthFailed`](crate::ErrorCode::AuthFailed) when no usable
    /// credentials are found; other client errors mapped as for operations.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::firestore::FirestoreBackend::builder("my-project")
    ///     .build()
    ///     .await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub async fn build(self) -> Result<FirestoreBackend, LockError> {
        self.config.validate()?;
        if self.project_id.is_empty() {
            return Err(LockError::invalid_argument(
                "the Firestore project id is empty; pass your Google Cloud project id",
            ));
        }
        let db = FirestoreDb::new(&self.project_id)
            .await
            .map_err(map_error)?;
        FirestoreBackend::new(db, self.config)
    }
}
