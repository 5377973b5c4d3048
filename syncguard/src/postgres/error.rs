//! sqlx errors → [`LockError`], as the reference's PostgreSQL specification classifies them.

use std::io::ErrorKind;

use sqlx::PgPool;

use crate::LockError;

/// Maps a sqlx error; `pool`, when known, tells a pool timeout caused by exhaustion (all
/// connections busy: [`LockError::RateLimited`]) from one caused by a slow or unreachable
/// server ([`LockError::NetworkTimeout`]).
pub(super) fn map_error(error: sqlx::Error, pool: Option<&PgPool>) -> LockError {
    #[cfg(feature = "postgres-tls")]
    if let Some(tls) = crate::tls::rustls_error(&error) {
        return tls_error(tls).with_source(error);
    }
    let mapped = match &error {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            let message = db.message().to_owned();
            classify_sqlstate(&code, message)
        }
        sqlx::Error::Io(io) => match io.kind() {
            ErrorKind::TimedOut => LockError::network_timeout("PostgreSQL connection timed out"),
            _ => LockError::service_unavailable(format!("PostgreSQL connection failed: {io}")),
        },
        sqlx::Error::PoolTimedOut => {
            let exhausted = pool.filter(|pool| {
                pool.size() >= pool.options().get_max_connections() && pool.num_idle() == 0
            });
            if let Some(pool) = exhausted {
                LockError::rate_limited(format!(
                    "all {} pooled PostgreSQL connections stayed busy past the acquire timeout; raise max_connections or lower concurrency",
                    pool.options().get_max_connections()
                ))
            } else {
                LockError::network_timeout(
                    "timed out waiting for a PostgreSQL connection (server slow or unreachable)",
                )
            }
        }
        sqlx::Error::PoolClosed => LockError::service_unavailable("the PostgreSQL pool is closed"),
        // Without `postgres-tls`, sqlx fails here whenever sslmode asks for TLS.
        #[cfg(not(feature = "postgres-tls"))]
        sqlx::Error::Tls(tls) => LockError::service_unavailable(format!(
            "PostgreSQL TLS failed: {tls}; TLS (sslmode=require, verify-ca, verify-full) needs syncguard's `postgres-tls` feature"
        )),
        #[cfg(feature = "postgres-tls")]
        sqlx::Error::Tls(tls) => {
            LockError::service_unavailable(format!("PostgreSQL TLS failed: {tls}"))
        }
        sqlx::Error::Configuration(_) => {
            LockError::invalid_argument("invalid PostgreSQL connection settings")
        }
        _ => LockError::internal(format!("unexpected PostgreSQL error: {error}")),
    };
    mapped.with_source(error)
}

/// A TLS failure, in the handshake mostly: a connection error, so `ServiceUnavailable` as the
/// reference classifies those, with what to check when the certificate was rejected.
#[cfg(feature = "postgres-tls")]
fn tls_error(tls: &rustls::Error) -> LockError {
    let hint = match tls {
        rustls::Error::InvalidCertificate(_) => {
            "; the server's certificate was rejected: give the CA that signed it with \
             sslrootcert=<PEM file>, and connect by a host name (or IP) the certificate names"
        }
        _ => "",
    };
    LockError::service_unavailable(format!("PostgreSQL TLS connection failed: {tls}{hint}"))
}

/// Classifies a SQLSTATE (see PostgreSQL's Appendix A).
fn classify_sqlstate(code: &str, message: String) -> LockError {
    let class = code.get(..2).unwrap_or_default();
    match (code, class) {
        ("28000" | "28P01", _) => LockError::auth_failed(message),
        ("57014", _) => LockError::network_timeout(format!("statement timed out: {message}")),
        ("SGFEN", _) => LockError::internal(message),
        ("42P01" | "42883", _) => LockError::internal(format!(
            "{message}: the lock tables or functions are missing; run syncguard::postgres::setup_schema or apply schema.sql"
        )),
        // Insufficient resources, connection exceptions, operator intervention (shutdown,
        // terminated backend), serialization failures and deadlocks: transient.
        (_, "53" | "08" | "57" | "40") => LockError::service_unavailable(message),
        (_, "22" | "23") => LockError::invalid_argument(message),
        ("42501", _) => LockError::auth_failed(message),
        _ => LockError::internal(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn tls_failures_say_what_to_do() {
        // What sqlx says when an sslmode needs TLS and it was built without.
        let unavailable = sqlx::Error::Tls(
            "TLS upgrade required by connect options but SQLx was built without TLS support enabled"
                .into(),
        );
        let error = map_error(unavailable, None);
        assert_eq!(error.code(), ErrorCode::ServiceUnavailable);
        #[cfg(not(feature = "postgres-tls"))]
        assert!(error.to_string().contains("`postgres-tls`"), "{error}");

        // What a rejected certificate looks like: rustls' error inside an I/O error.
        #[cfg(feature = "postgres-tls")]
        {
            let rejected =
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
            let error = map_error(
                sqlx::Error::Io(std::io::Error::new(ErrorKind::InvalidData, rejected)),
                None,
            );
            assert_eq!(error.code(), ErrorCode::ServiceUnavailable);
            assert!(error.to_string().contains("sslrootcert"), "{error}");
        }
    }

    #[test]
    fn sqlstates_map_as_the_reference_says() {
        let cases = [
            ("53000", ErrorCode::ServiceUnavailable),
            ("53300", ErrorCode::ServiceUnavailable),
            ("08006", ErrorCode::ServiceUnavailable),
            ("57P01", ErrorCode::ServiceUnavailable),
            ("40001", ErrorCode::ServiceUnavailable),
            ("57014", ErrorCode::NetworkTimeout),
            ("28000", ErrorCode::AuthFailed),
            ("28P01", ErrorCode::AuthFailed),
            ("42501", ErrorCode::AuthFailed),
            ("22001", ErrorCode::InvalidArgument),
            ("23505", ErrorCode::InvalidArgument),
            ("SGFEN", ErrorCode::Internal),
            ("42P01", ErrorCode::Internal),
            ("XX000", ErrorCode::Internal),
        ];
        for (code, expected) in cases {
            assert_eq!(
                classify_sqlstate(code, String::new()).code(),
                expected,
                "{code}"
            );
        }
    }
}
