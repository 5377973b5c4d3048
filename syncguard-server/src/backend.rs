//! Which lock backend the server runs on: `SYNCGUARD_BACKEND_URL`.
//!
//! | URL | backend | feature |
//! |---|---|---|
//! | unset, `memory:` | [`MemoryBackend`](syncguard::MemoryBackend): one process, lost on restart | always |
//! | `postgres://...`, `postgresql://...` | `PostgresBackend` (the lock tables are created at startup unless `SYNCGUARD_SETUP_SCHEMA=false`) | `postgres` (`postgres-tls` for `sslmode=require` and stricter) |
//! | `redis://...`, `rediss://...` | `RedisBackend` | `redis` (`redis-tls` for `rediss://`) |
//! | `firestore://<project>` | `FirestoreBackend` (Application Default Credentials, or the emulator named by `FIRESTORE_EMULATOR_HOST`) | `firestore` |
//! | `postgres://...` with `SYNCGUARD_LSC_TABLE=<table>` | `LscTableBackend` on LockServiceCentral's own table (its side tables, and the table if missing, are created at startup unless `SYNCGUARD_SETUP_SCHEMA=false`) | `postgres` |
//!
//! Whatever the backend, the server needs it to store lock holders (its
//! `capabilities().holders`): [`require_holders`] refuses one that does not, with a message
//! saying so. The check reads the capability, never the backend's name, so a backend that
//! gains holders needs no change here. Several server processes on one PostgreSQL, Redis or
//! Firestore share their locks: the holder lives in storage, not in a process.

use std::sync::Arc;

use syncguard::MemoryBackend;
use syncguard::backend::LockBackend;

use crate::config::BackendSettings;
use crate::startup::StartupError;

/// The backend a URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendUrl {
    /// `memory:` (or no URL).
    Memory,
    /// `postgres://...` or `postgresql://...`.
    Postgres(String),
    /// `redis://...` or `rediss://...`.
    Redis(String),
    /// `firestore://<project>`.
    Firestore {
        /// The Google Cloud project.
        project: String,
    },
}

impl BackendUrl {
    /// Reads a `SYNCGUARD_BACKEND_URL`.
    ///
    /// ```
    /// use syncguard_server::BackendUrl;
    ///
    /// assert_eq!(BackendUrl::parse("memory:")?, BackendUrl::Memory);
    /// assert_eq!(
    ///     BackendUrl::parse("firestore://my-project")?,
    ///     BackendUrl::Firestore { project: "my-project".into() }
    /// );
    /// assert!(BackendUrl::parse("mysql://db").is_err());
    /// # Ok::<(), syncguard_server::StartupError>(())
    /// ```
    ///
    /// # Errors
    /// [`StartupError::UnknownBackend`] for any other scheme.
    pub fn parse(url: &str) -> Result<Self, StartupError> {
        let url = url.trim();
        let scheme = url.split_once(':').map_or(url, |(scheme, _)| scheme);
        match scheme.to_ascii_lowercase().as_str() {
            "" | "memory" => Ok(Self::Memory),
            "postgres" | "postgresql" => Ok(Self::Postgres(url.to_owned())),
            "redis" | "rediss" => Ok(Self::Redis(url.to_owned())),
            "firestore" => {
                let project = url["firestore:".len()..].trim_start_matches('/');
                let project = project.trim_end_matches('/');
                if project.is_empty() || project.contains('/') {
                    return Err(StartupError::UnknownBackend {
                        url: "firestore URL without a project: use firestore://<project>"
                            .to_owned(),
                    });
                }
                Ok(Self::Firestore {
                    project: project.to_owned(),
                })
            }
            _ => Err(StartupError::UnknownBackend { url: redact(url) }),
        }
    }

    /// The backend's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Postgres(_) => "postgres",
            Self::Redis(_) => "redis",
            Self::Firestore { .. } => "firestore",
        }
    }
}

/// `url` without the password of its user info, for messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***{}", &rest[at..])
        }
        None => url.to_owned(),
    }
}

/// Refuses a backend that does not store lock holders.
///
/// # Errors
/// [`StartupError::NoHolders`] naming the backend.
pub fn require_holders(backend: &dyn LockBackend) -> Result<(), StartupError> {
    let capabilities = backend.capabilities();
    if capabilities.holders {
        Ok(())
    } else {
        Err(StartupError::NoHolders {
            backend: capabilities.backend,
        })
    }
}

/// Opens the backend `settings.url` names, checks that it stores holders, and (on
/// PostgreSQL, when `settings.setup_schema`) creates its tables. With `settings.lsc_table` on
/// a `postgres://` URL, the server runs on LockServiceCentral's own table of that name
/// (`LscTableBackend`), with its fence trigger unless `settings.lsc_fence_trigger` is off.
///
/// # Errors
/// [`StartupError::UnknownBackend`], [`StartupError::FeatureMissing`] (the URL names a
/// backend this binary was built without, or `lsc_table` without the `postgres` feature),
/// [`StartupError::Backend`] (connecting failed, an invalid table name, `lsc_table` with a URL
/// that is not `postgres://`, or the fence trigger wanted, missing, and not to be installed
/// because the schema setup is off), [`StartupError::NoHolders`].
pub async fn open_backend(
    settings: &BackendSettings,
) -> Result<Arc<dyn LockBackend>, StartupError> {
    let parsed = BackendUrl::parse(&settings.url)?;
    if let Some(table) = settings
        .lsc_table
        .as_deref()
        .map(str::trim)
        .filter(|table| !table.is_empty())
    {
        return open_lsc_table(&parsed, table, settings).await;
    }
    let backend: Arc<dyn LockBackend> = match parsed {
        BackendUrl::Memory => Arc::new(MemoryBackend::new()),
        #[cfg(feature = "postgres")]
        BackendUrl::Postgres(url) => {
            let failed = |source| StartupError::Backend {
                backend: "postgres",
                source,
            };
            let backend = syncguard::PostgresBackend::connect(&url)
                .await
                .map_err(failed)?;
            // Before any DDL: a backend the server cannot use is left as it was.
            require_holders(&backend)?;
            if settings.setup_schema {
                syncguard::postgres::setup_schema(backend.pool(), backend.config())
                    .await
                    .map_err(failed)?;
            }
            Arc::new(backend)
        }
        #[cfg(feature = "redis")]
        BackendUrl::Redis(url) => Arc::new(syncguard::RedisBackend::connect(&url).await.map_err(
            |source| StartupError::Backend {
                backend: "redis",
                source,
            },
        )?),
        #[cfg(feature = "firestore")]
        BackendUrl::Firestore { project } => Arc::new(
            syncguard::FirestoreBackend::connect(&project)
                .await
                .map_err(|source| StartupError::Backend {
                    backend: "firestore",
                    source,
                })?,
        ),
        #[allow(unreachable_patterns)] // Reached when a backend's feature is off.
        other => {
            return Err(StartupError::FeatureMissing {
                backend: other.name(),
                feature: other.name(),
            });
        }
    };
    require_holders(&*backend)?;
    Ok(instrumented(backend))
}

/// The LSC-table backend on `table`, for a `postgres://` URL.
async fn open_lsc_table(
    url: &BackendUrl,
    table: &str,
    settings: &BackendSettings,
) -> Result<Arc<dyn LockBackend>, StartupError> {
    const NAME: &str = "postgres-lsc-table";
    let BackendUrl::Postgres(url) = url else {
        return Err(StartupError::Backend {
            backend: NAME,
            source: syncguard::LockError::invalid_argument(
                "SYNCGUARD_LSC_TABLE needs a postgres:// SYNCGUARD_BACKEND_URL",
            ),
        });
    };
    #[cfg(feature = "postgres")]
    {
        let failed = |source| StartupError::Backend {
            backend: NAME,
            source,
        };
        let backend = crate::lsc_table::LscTableBackend::connect(url, table)
            .await
            .map_err(failed)?;
        if settings.setup_schema {
            backend.setup().await.map_err(failed)?;
            if settings.lsc_fence_trigger {
                backend.install_fence_trigger().await.map_err(failed)?;
            }
        } else if settings.lsc_fence_trigger
            && !backend.has_fence_trigger().await.map_err(failed)?
        {
            // Tokens that could repeat after an LSC holder are worse than not starting.
            return Err(failed(syncguard::LockError::invalid_argument(format!(
                "LSC's table `{table}` has no fence trigger, so LSC's acquisitions would not advance the fencing tokens: start once with SYNCGUARD_SETUP_SCHEMA=true to install it, or set SYNCGUARD_LSC_FENCE_TRIGGER=false to accept tokens that order this server's acquisitions only"
            ))));
        }
        if !settings.lsc_fence_trigger {
            tracing::warn!(
                table,
                "SYNCGUARD_LSC_FENCE_TRIGGER=false: fencing tokens order this server's acquisitions only, not LSC's"
            );
        }
        let backend: Arc<dyn LockBackend> = Arc::new(backend);
        require_holders(&*backend)?;
        Ok(instrumented(backend))
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (url, table, settings);
        Err(StartupError::FeatureMissing {
            backend: NAME,
            feature: "postgres",
        })
    }
}

/// The backend with OpenTelemetry spans and metrics (feature `opentelemetry`), recorded with
/// the global providers the process installs.
#[cfg(feature = "opentelemetry")]
fn instrumented(backend: Arc<dyn LockBackend>) -> Arc<dyn LockBackend> {
    Arc::new(syncguard::telemetry::with_opentelemetry(backend))
}

#[cfg(not(feature = "opentelemetry"))]
fn instrumented(backend: Arc<dyn LockBackend>) -> Arc<dyn LockBackend> {
    backend
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(BackendUrl::parse("").unwrap(), BackendUrl::Memory);
        assert_eq!(BackendUrl::parse("MEMORY:").unwrap(), BackendUrl::Memory);
        assert_eq!(
            BackendUrl::parse("postgres://u:p@h/db").unwrap().name(),
            "postgres"
        );
        assert_eq!(BackendUrl::parse("rediss://h").unwrap().name(), "redis");
        assert!(BackendUrl::parse("firestore://").is_err());
    }

    #[test]
    fn passwords_are_hidden() {
        let error = BackendUrl::parse("mysql://app:secret@db:3306/x").unwrap_err();
        let message = error.to_string();
        assert!(!message.contains("secret"), "{message}");
        assert!(message.contains("mysql://app:***@db:3306/x"), "{message}");
    }

    #[tokio::test]
    async fn lsc_table_needs_postgres() {
        let settings = BackendSettings::new("memory:").lsc_table("locks");
        let Err(error) = open_backend(&settings).await else {
            panic!("an LSC table needs PostgreSQL");
        };
        assert!(error.to_string().contains("postgres"), "{error}");
        // Blank counts as unset.
        let blank = BackendSettings::new("memory:").lsc_table(" ");
        assert!(open_backend(&blank).await.is_ok());
    }

    #[tokio::test]
    async fn memory_has_holders() {
        let backend = open_backend(&BackendSettings::new("memory:"))
            .await
            .unwrap();
        assert!(backend.capabilities().holders);
    }
}
