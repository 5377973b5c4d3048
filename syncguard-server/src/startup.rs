//! What can stop the server from starting, each with what to do about it.

use syncguard::LockError;

/// Why `syncguard-server` did not start (or stopped serving).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartupError {
    /// `SYNCGUARD_BACKEND_URL` names no backend this server knows.
    #[error(
        "SYNCGUARD_BACKEND_URL `{url}` names no known backend; use `memory:`, `postgres://...`, `redis://...`, `rediss://...` or `firestore://<project>`"
    )]
    UnknownBackend {
        /// The URL, with any password hidden.
        url: String,
    },

    /// The URL names a backend this binary was built without.
    #[error(
        "SYNCGUARD_BACKEND_URL names the {backend} backend, but this server was built without its feature; rebuild with `cargo run -p syncguard-server --features {feature}`"
    )]
    FeatureMissing {
        /// The backend's name.
        backend: &'static str,
        /// The cargo feature that brings it.
        feature: &'static str,
    },

    /// The backend does not store lock holders, which the server needs to tell LSC's
    /// owner + instanceId pairs apart.
    #[error(
        "the {backend} backend does not store lock holders yet (its capabilities().holders is false): syncguard-server keeps each lock's owner and instanceId with the lock through LockBackend::acquire_as, so it cannot run on it; use a backend that does (memory, PostgreSQL, Redis or Firestore)"
    )]
    NoHolders {
        /// The backend's name, from its capabilities.
        backend: &'static str,
    },

    /// Connecting to the backend (or preparing its schema) failed.
    #[error("could not open the {backend} lock backend: {source}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// What went wrong.
        #[source]
        source: LockError,
    },

    /// The authentication settings cannot be used.
    #[error("invalid authentication settings: {0}")]
    Auth(String),

    /// The connection settings cannot be used: a timeout of zero, or a connection limit the
    /// open-file limit cannot hold.
    #[error("invalid connection settings: {0}")]
    Connections(String),

    /// The configuration did not parse.
    #[error(transparent)]
    Config(#[from] clap::Error),

    /// The port could not be bound, or serving failed.
    #[error("could not serve on {address}: {source}")]
    Serve {
        /// The address.
        address: String,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
}
