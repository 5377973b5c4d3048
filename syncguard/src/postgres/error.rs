//! sqlx errors → [`LockError`], as the reference's PostgreSQL specification classifies them.

use std::io::ErrorKind;

use sqlx::PgPool;

use crate::error::{BoxError, LockError};

/// Maps a sqlx error; `pool`, when known, tells a pool timeout caused by exhaustion (all
/// connections busy: [`ErrorCode::RateLimited`](crate::ErrorCode::RateLimited)) from one caused by
/// a slow or unreachable
/// server ([`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout)), and names the database
/// a missing one was.
///
/// The message says what happened in our words (with the SQLSTATE for database errors) and
/// what to do; the driver's error is only the [`source`](std::error::Error::source), so that
/// a reporter that walks the chain prints the driver's text once (see [`driver_error`]).
pub(super) fn map_error(error: sqlx::Error, pool: Option<&PgPool>) -> LockError {
    #[cfg(feature = "postgres-tls")]
    if let Some(tls) = crate::tls::rustls_error(&error) {
        return tls_error(tls).with_source(driver_error(error));
    }
    let mapped = match &error {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            if code == "SGFEN" {
                // Raised by syncguard's own acquire function, in syncguard's words: kept as
                // the message, with nothing underneath to repeat it.
                return LockError::internal(db.message());
            }
            classify_sqlstate(&code, pool)
        }
        sqlx::Error::Io(io) => io_error(io),
        sqlx::Error::PoolTimedOut => {
            let exhausted = pool.filter(|pool| {
                pool.size() >= pool.options().get_max_connections() && pool.num_idle() == 0
            });
            if let Some(pool) = exhausted {
                LockError::rate_limited(format!(
                    "all {} pooled PostgreSQL connections stayed busy past the operation timeout; raise max_connections or lower concurrency",
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
        sqlx::Error::Tls(_) => LockError::service_unavailable(
            "PostgreSQL TLS failed; TLS (sslmode=require, verify-ca, verify-full) needs syncguard's `postgres-tls` feature",
        ),
        #[cfg(feature = "postgres-tls")]
        sqlx::Error::Tls(_) => LockError::service_unavailable("PostgreSQL TLS failed"),
        sqlx::Error::Configuration(_) => {
            LockError::invalid_argument("invalid PostgreSQL connection settings")
        }
        _ => LockError::internal("unexpected error from the PostgreSQL driver (sqlx)"),
    };
    mapped.with_source(driver_error(error))
}

/// The error to keep as the source: the one inside sqlx's wrapper when the wrapper's message
/// only repeats it behind a prefix ("error communicating with database: Connection refused
/// ..." over "Connection refused ..."), so that the text appears once in the chain. Database
/// errors come out as sqlx's `PgDatabaseError` (SQLSTATE, detail, constraint), I/O errors
/// as [`std::io::Error`].
pub(super) fn driver_error(error: sqlx::Error) -> BoxError {
    match error {
        sqlx::Error::Database(db) => db.into_error(),
        sqlx::Error::Io(io) => Box::new(io),
        sqlx::Error::Tls(inner)
        | sqlx::Error::Configuration(inner)
        | sqlx::Error::Encode(inner)
        | sqlx::Error::Decode(inner) => match inner.downcast::<sqlx::Error>() {
            // sqlx wraps its own errors too (a bad URL parameter is a configuration error
            // inside a configuration error).
            Ok(nested) => driver_error(*nested),
            Err(inner) => inner,
        },
        other => Box::new(other),
    }
}

/// An I/O error while connecting or talking to the server, in our words (the I/O error is
/// the source).
fn io_error(io: &std::io::Error) -> LockError {
    match io.kind() {
        ErrorKind::TimedOut => LockError::network_timeout("PostgreSQL connection timed out"),
        ErrorKind::ConnectionRefused => LockError::service_unavailable(
            "PostgreSQL refused the connection: is the server running, and is this its port?",
        ),
        ErrorKind::NotFound => LockError::service_unavailable(
            "no PostgreSQL socket at the connection's path: is the server running, and is this its socket directory?",
        ),
        ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe
        | ErrorKind::UnexpectedEof => {
            LockError::service_unavailable("the PostgreSQL connection was closed")
        }
        _ => LockError::service_unavailable("could not communicate with PostgreSQL"),
    }
}

/// A TLS failure, in the handshake mostly: a connection error, so `ServiceUnavailable` as the
/// reference classifies those, with what to check when the certificate was rejected.
#[cfg(feature = "postgres-tls")]
fn tls_error(tls: &rustls::Error) -> LockError {
    let hint = match tls {
        rustls::Error::InvalidCertificate(_) => {
            ": the server's certificate was rejected; give the CA that signed it with \
             sslrootcert=<PEM file>, and connect by a host name (or IP) the certificate names"
        }
        _ => "",
    };
    LockError::service_unavailable(format!("PostgreSQL TLS connection failed{hint}"))
}

/// Classifies a SQLSTATE (see PostgreSQL's Appendix A). The server's message is the source.
fn classify_sqlstate(code: &str, pool: Option<&PgPool>) -> LockError {
    let class = code.get(..2).unwrap_or_default();
    match (code, class) {
        ("28000" | "28P01", _) => {
            LockError::auth_failed(format!("PostgreSQL refused the login (SQLSTATE {code})"))
        }
        ("3D000", _) => LockError::invalid_argument(missing_database(pool)),
        ("57014", _) => LockError::network_timeout(format!(
            "PostgreSQL cancelled the statement (statement_timeout or a cancel request, SQLSTATE {code})"
        )),
        // A missing table, function or column (a table set up before the holder column).
        ("42P01" | "42883" | "42703", _) => LockError::internal(format!(
            "the lock tables, columns or functions are missing or out of date (SQLSTATE {code}); run syncguard::postgres::setup_schema or apply schema.sql"
        )),
        // Insufficient resources, connection exceptions, operator intervention (shutdown,
        // terminated backend), serialization failures and deadlocks: transient.
        (_, "53") => LockError::service_unavailable(format!(
            "PostgreSQL is out of a resource (connections, memory or disk; SQLSTATE {code})"
        )),
        (_, "08") => LockError::service_unavailable(format!(
            "the PostgreSQL connection failed (SQLSTATE {code})"
        )),
        (_, "57") => LockError::service_unavailable(format!(
            "PostgreSQL ended the session or is shutting down (SQLSTATE {code})"
        )),
        (_, "40") => LockError::service_unavailable(format!(
            "PostgreSQL aborted the transaction (serialization failure or deadlock, SQLSTATE {code})"
        )),
        (_, "22" | "23") => {
            LockError::invalid_argument(format!("PostgreSQL rejected the data (SQLSTATE {code})"))
        }
        ("42501", _) => LockError::auth_failed(format!(
            "PostgreSQL denied a privilege on the lock tables or functions (SQLSTATE {code})"
        )),
        _ => LockError::internal(format!("unexpected PostgreSQL error (SQLSTATE {code})")),
    }
}

/// The message for SQLSTATE 3D000: the connection settings name a database the server does
/// not have. A configuration error, not retryable.
fn missing_database(pool: Option<&PgPool>) -> String {
    let options = pool.map(PgPool::connect_options);
    let name = options
        .as_deref()
        .map(|options| options.get_database().unwrap_or(options.get_username()));
    match name {
        Some(name) => format!(
            "PostgreSQL has no database named {name:?}; create it (CREATE DATABASE \"{}\") or fix the database name in the connection URL",
            name.replace('"', "\"\"")
        ),
        None => "PostgreSQL has no database by the name in the connection settings; create it \
                 (CREATE DATABASE) or fix the database name in the connection URL"
            .to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

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
            ("42703", ErrorCode::Internal),
            ("3D000", ErrorCode::InvalidArgument),
            ("XX000", ErrorCode::Internal),
        ];
        for (code, expected) in cases {
            assert_eq!(classify_sqlstate(code, None).code(), expected, "{code}");
        }
    }

    /// `error`'s message and every source's, as anyhow's `{:#}` prints them.
    fn chain(error: &LockError) -> String {
        let mut text = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    }

    #[test]
    fn the_driver_text_appears_once_in_the_chain() {
        let refused = sqlx::Error::Io(std::io::Error::new(
            ErrorKind::ConnectionRefused,
            "driver text",
        ));
        let error = map_error(refused, None);
        assert_eq!(error.code(), ErrorCode::ServiceUnavailable);
        assert!(error.to_string().contains("refused"), "{error}");
        let text = chain(&error);
        assert_eq!(text.matches("driver text").count(), 1, "{text}");
        let source = std::error::Error::source(&error).expect("the driver error is kept");
        assert_eq!(
            source.downcast_ref::<std::io::Error>().map(|io| io.kind()),
            Some(ErrorKind::ConnectionRefused)
        );

        let config = sqlx::Error::Configuration("driver text".into());
        let text = chain(&map_error(config, None));
        assert_eq!(text.matches("driver text").count(), 1, "{text}");
        // As sqlx reports a bad URL parameter: its error inside its error.
        let nested =
            sqlx::Error::Configuration(Box::new(sqlx::Error::Configuration("driver text".into())));
        let text = chain(&map_error(nested, None));
        assert_eq!(text.matches("driver text").count(), 1, "{text}");
        assert_eq!(text.matches("configuration").count(), 0, "{text}");
    }
}
