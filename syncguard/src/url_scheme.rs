//! Which backend a connection URL is for, read from its scheme before any I/O: a URL given to
//! the wrong backend is refused at once, naming the backend it is for, instead of failing
//! late (a Redis URL given to PostgreSQL would wait for a PostgreSQL handshake until the
//! connect timeout). Only the scheme is ever quoted: the rest of a URL may hold a password.

use crate::error::LockError;

/// A backend that takes a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UrlBackend {
    Postgres,
    Redis,
}

impl UrlBackend {
    /// The schemes this backend's driver accepts.
    fn schemes(self) -> &'static [&'static str] {
        match self {
            UrlBackend::Postgres => &["postgres", "postgresql"],
            // redis-rs's own list (redis-rs 1, `connection.rs`).
            UrlBackend::Redis => &[
                "redis",
                "rediss",
                "valkey",
                "valkeys",
                "redis+unix",
                "valkey+unix",
                "unix",
                // A Redis Cluster's nodes (syncguard's own forms; the redis-cluster feature).
                "redis-cluster",
                "rediss-cluster",
                "valkey-cluster",
                "valkeys-cluster",
                // Sentinels and the primary they name (syncguard's own forms; the
                // redis-sentinel feature).
                "redis+sentinel",
                "rediss+sentinel",
                "valkey+sentinel",
                "valkeys+sentinel",
            ],
        }
    }

    fn database(self) -> &'static str {
        match self {
            UrlBackend::Postgres => "PostgreSQL",
            UrlBackend::Redis => "Redis",
        }
    }

    fn backend(self) -> &'static str {
        match self {
            UrlBackend::Postgres => "syncguard::postgres::PostgresBackend (feature `postgres`)",
            UrlBackend::Redis => "syncguard::redis::RedisBackend (feature `redis`)",
        }
    }

    fn example(self) -> &'static str {
        match self {
            UrlBackend::Postgres => "postgres://user:password@host:5432/database",
            UrlBackend::Redis => "redis://[user:password@]host[:port][/db]",
        }
    }

    fn other(self) -> Self {
        match self {
            UrlBackend::Postgres => UrlBackend::Redis,
            UrlBackend::Redis => UrlBackend::Postgres,
        }
    }
}

/// The scheme of `url` (what comes before its first `:`), if it has a well-formed one.
fn scheme(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once(':')?;
    let mut chars = scheme.chars();
    let well_formed = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    well_formed.then_some(scheme)
}

/// Checks that `url` is a URL of `backend`'s database, before any I/O.
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) naming the scheme, and the backend to use when the URL is
/// another backend's.
pub(crate) fn check_url_scheme(url: &str, backend: UrlBackend) -> Result<(), LockError> {
    let accepted = backend.schemes().join("://, ") + "://";
    let Some(scheme) = scheme(url) else {
        return Err(LockError::invalid_argument(format!(
            "the {} connection URL has no scheme; expected {} (accepted schemes: {accepted})",
            backend.database(),
            backend.example()
        )));
    };
    let lower = scheme.to_ascii_lowercase();
    if backend.schemes().contains(&lower.as_str()) {
        return Ok(());
    }
    let other = backend.other();
    if other.schemes().contains(&lower.as_str()) {
        return Err(LockError::invalid_argument(format!(
            "\"{scheme}://\" is a {} URL, and this backend is {}'s: use {} for it, or give a \
             {} URL ({accepted})",
            other.database(),
            backend.database(),
            other.backend(),
            backend.database()
        )));
    }
    Err(LockError::invalid_argument(format!(
        "unsupported URL scheme \"{scheme}\" for the {} backend; accepted: {accepted}",
        backend.database()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_backend_takes_its_own_schemes() {
        for url in ["postgres://a@h/db", "postgresql://h", "POSTGRES://h"] {
            assert!(check_url_scheme(url, UrlBackend::Postgres).is_ok(), "{url}");
        }
        for url in [
            "redis://h",
            "rediss://:pw@h:6380/0",
            "redis+unix:///tmp/r.sock",
            "unix:///tmp/r.sock",
            "valkey://h",
            "valkeys://h",
            "valkey+unix:///s",
        ] {
            assert!(check_url_scheme(url, UrlBackend::Redis).is_ok(), "{url}");
        }
    }

    #[test]
    fn another_backends_url_names_that_backend() {
        let error = check_url_scheme("redis://:secret@h:6379", UrlBackend::Postgres).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("Redis URL"), "{message}");
        assert!(message.contains("RedisBackend"), "{message}");
        assert!(!message.contains("secret"), "{message}");
        let error =
            check_url_scheme("postgres://app:secret@db/app", UrlBackend::Redis).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("PostgreSQL URL"), "{message}");
        assert!(message.contains("PostgresBackend"), "{message}");
        assert!(!message.contains("secret"), "{message}");
    }

    #[test]
    fn unknown_and_missing_schemes_are_named() {
        let error = check_url_scheme("mysql://root:pw@h/db", UrlBackend::Postgres).unwrap_err();
        assert_eq!(error.code(), crate::ErrorCode::InvalidArgument);
        assert!(error.to_string().contains("\"mysql\""), "{error}");
        assert!(!error.to_string().contains("pw"), "{error}");
        let error = check_url_scheme("not a url", UrlBackend::Redis).unwrap_err();
        assert!(error.to_string().contains("no scheme"), "{error}");
    }
}
