//! The process-wide default backend, used by `#[locked]` when no backend is named.

use std::sync::{Arc, OnceLock};

use crate::backend::LockBackend;
use crate::error::{LockError, Result};

static DEFAULT_BACKEND: OnceLock<Arc<dyn LockBackend>> = OnceLock::new();

/// Sets the process-wide default backend, used by `#[locked]` when no backend is named.
/// Call it once at startup.
///
/// ```
/// use syncguard::MemoryBackend;
///
/// syncguard::set_default_backend(MemoryBackend::new())?;
/// assert!(syncguard::default_backend().is_ok());
/// // A second call is refused and changes nothing.
/// assert!(syncguard::set_default_backend(MemoryBackend::new()).is_err());
/// # Ok::<(), syncguard::LockError>(())
/// ```
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) if a default backend was
/// already set; the first one stays.
pub fn set_default_backend<B: LockBackend + 'static>(backend: B) -> Result<()> {
    DEFAULT_BACKEND.set(Arc::new(backend)).map_err(|_| {
        LockError::invalid_argument(
            "a default lock backend is already set; set it once, at startup",
        )
    })
}

/// The process-wide default backend.
///
/// # Errors
/// [`ErrorCode::NoDefaultBackend`](crate::ErrorCode::NoDefaultBackend) if [`set_default_backend`]
/// was not called.
pub fn default_backend() -> Result<Arc<dyn LockBackend>> {
    DEFAULT_BACKEND
        .get()
        .cloned()
        .ok_or_else(LockError::no_default_backend)
}
