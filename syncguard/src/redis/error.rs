//! Mapping of redis-rs and deadpool errors to [`LockError`].
//!
//! The message says what happened in our words and what to do; the driver's error is only
//! the [`source`](std::error::Error::source), unwrapped from redis-rs's [`RedisError`] (whose
//! text is its source's), so that a reporter that walks the chain prints the driver's text
//! once (see [`driver_error`]).

use std::error::Error;
use std::io;
use std::sync::Arc;

use deadpool_redis::{HookError, PoolError, TimeoutType};
use redis::{ErrorKind, ParsingError, RedisError, ServerError, ServerErrorKind, Value};

use crate::error::{BoxError, LockError};

/// Maps a redis-rs error (seed 004): connection errors → `ServiceUnavailable`, NOAUTH /
/// WRONGPASS / NOPERM → `AuthFailed`, WRONGTYPE, our scripts' BADDATA and script errors on bad data →
/// `InvalidArgument`, timeouts → `NetworkTimeout`, anything else → `Internal`.
pub(crate) fn map_redis_error(error: RedisError) -> LockError {
    #[cfg(feature = "redis-tls")]
    if let Some(tls) = crate::tls::rustls_error(&error) {
        return tls_error(tls).with_source(driver_error(error));
    }
    let code = error.code().unwrap_or("");
    let kind = error.kind();
    let mapped = if error.is_timeout() {
        LockError::network_timeout(
            "Redis did not answer in time; the operation may or may not have been applied, \
             check the server load or raise the operation timeout",
        )
    } else if kind == ErrorKind::AuthenticationFailed
        || kind == ErrorKind::Server(ServerErrorKind::NoPerm)
        || matches!(code, "NOAUTH" | "WRONGPASS" | "NOPERM")
    {
        LockError::auth_failed(format!(
            "Redis refused the client ({}); the user needs GET, SET, DEL, INCR, TIME, EVALSHA \
             and SCRIPT LOAD",
            code_or_category(&error)
        ))
    } else if kind == ErrorKind::Server(ServerErrorKind::CrossSlot) {
        // Never from a cluster connection, whose calls each stay in one slot.
        LockError::invalid_argument(
            "this Redis is a cluster node and refused keys in different hash slots \
             (CROSSSLOT): connect with a redis-cluster://host:port[,host:port...] URL \
             (feature redis-cluster), which uses the cluster layout",
        )
    } else if matches!(
        kind,
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
    ) {
        LockError::service_unavailable(
            "the Redis Cluster serves this key on another node (MOVED/ASK) and the redirection \
             was not followed in time; retry later, and connect with a redis-cluster:// URL \
             (feature redis-cluster) if this backend connects to one node of a cluster",
        )
    } else if kind == ErrorKind::Server(ServerErrorKind::NoScript) {
        LockError::service_unavailable(
            "Redis lost the syncguard scripts again right after they were loaded (repeated \
             SCRIPT FLUSH or failover); retry later",
        )
    } else if error.is_connection_refusal() {
        LockError::service_unavailable(
            "Redis refused the connection: is the server running, and is this its address \
             and port?",
        )
    } else if kind == ErrorKind::Io
        || error.is_connection_dropped()
        || matches!(
            kind,
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        )
        || matches!(code, "BUSY" | "OOM" | "MISCONF")
    {
        LockError::service_unavailable(format!(
            "Redis is unreachable or not serving ({}); retry later and check that the server \
             is up and writable",
            code_or_category(&error)
        ))
    } else if matches!(code, "WRONGTYPE" | "BADDATA")
        || (matches!(kind, ErrorKind::Server(_) | ErrorKind::Extension)
            && error
                .detail()
                .is_some_and(|detail| detail.contains("script")))
    {
        LockError::invalid_argument(
            "Redis rejected the data stored under a lock key (wrong type or not SyncGuard lock \
             JSON); another program writes under this key prefix, use a prefix of your own",
        )
    } else if is_missing_database(&error) {
        missing_database(None)
    } else {
        LockError::internal(format!(
            "unexpected Redis error ({})",
            code_or_category(&error)
        ))
    };
    mapped.with_source(driver_error(error))
}

/// Whether `error` is the server's answer to a `SELECT` of a database it does not have (the
/// database index at the end of the URL).
fn is_missing_database(error: &RedisError) -> bool {
    error.code() == Some("ERR")
        && error
            .detail()
            .is_some_and(|detail| detail.contains(OUT_OF_RANGE))
}

/// What Redis answers a `SELECT` of a database it does not have.
const OUT_OF_RANGE: &str = "DB index is out of range";

/// A database the server does not have: `db` when the URL is known.
fn missing_database(db: Option<i64>) -> LockError {
    let which = match db {
        Some(db) => format!("database {db} (the /{db} at the end of the URL)"),
        None => "database of the index the URL names (the /<index> at its end)".to_owned(),
    };
    LockError::invalid_argument(format!(
        "the Redis server has no {which}: it answered \"DB index is out of range\"; use a \
         database index the server has, from 0 to its `databases` setting minus one (0 to 15 \
         by default), or leave it out for database 0"
    ))
}

/// `error` saying which database is missing, when it is a missing database (see
/// [`missing_database`]); otherwise `error` itself.
pub(super) fn naming_database(error: LockError, db: i64) -> LockError {
    let mut next: Option<&(dyn Error + 'static)> = error.source();
    while let Some(cause) = next {
        let answer: Option<BoxError> = match (
            cause.downcast_ref::<ServerError>(),
            cause.downcast_ref::<RedisError>(),
        ) {
            (Some(server), _) => (server.code() == "ERR"
                && server
                    .details()
                    .is_some_and(|detail| detail.contains(OUT_OF_RANGE)))
            .then(|| Box::new(server.clone()) as BoxError),
            (None, Some(redis)) => is_missing_database(redis).then(|| driver_error(redis.clone())),
            (None, None) => None,
        };
        if let Some(answer) = answer {
            return missing_database(Some(db)).with_source(answer);
        }
        next = cause.source();
    }
    error
}

/// The error to keep as the source: the one inside redis-rs's error, whose text is exactly
/// its source's (a refused connection would print "Connection refused (os error 111)" twice
/// otherwise). A server's reply comes out as [`ServerError`] (with its code), a malformed
/// reply as [`ParsingError`], an I/O error as [`io::Error`] (of the same kind, the same OS
/// error, and the same error inside); redis-rs's errors without a source are kept whole.
pub(crate) fn driver_error(error: RedisError) -> BoxError {
    let Some(inner) = error.source() else {
        return Box::new(error);
    };
    if let Some(server) = inner.downcast_ref::<ServerError>() {
        return Box::new(server.clone());
    }
    if let Some(parsing) = inner.downcast_ref::<ParsingError>() {
        return Box::new(parsing.clone());
    }
    // redis-rs shares the error of a failed connection or conversion among the clones of
    // its error, in an `Arc`.
    if let Some(shared) = inner.downcast_ref::<Arc<dyn Error + Send + Sync>>() {
        return match shared.downcast_ref::<io::Error>() {
            Some(io) => Box::new(match io.raw_os_error() {
                Some(code) => io::Error::from_raw_os_error(code),
                // `io::Error` is transparent: its text and source are the shared error's.
                None => io::Error::new(io.kind(), Arc::clone(shared)),
            }),
            None => Box::new(Arc::clone(shared)),
        };
    }
    Box::new(error)
}

/// A TLS failure, in the handshake mostly: a connection error (`ServiceUnavailable`), with
/// what to check when the certificate was rejected.
#[cfg(feature = "redis-tls")]
fn tls_error(tls: &rustls::Error) -> LockError {
    let hint = match tls {
        rustls::Error::InvalidCertificate(_) => {
            "; the server's certificate was rejected: for a private CA, give its certificate \
             to RedisConfig::with_tls_root_certs, and connect by a host name (or IP) the \
             certificate names"
        }
        _ => "",
    };
    LockError::service_unavailable(format!("Redis TLS connection failed{hint}"))
}

fn code_or_category(error: &RedisError) -> &str {
    error.code().unwrap_or_else(|| error.category())
}

/// Maps a deadpool pool error: timeouts → `NetworkTimeout`, backend errors as the redis error,
/// a closed pool → `ServiceUnavailable`.
pub(crate) fn map_pool_error(error: PoolError) -> LockError {
    match error {
        PoolError::Backend(error) | PoolError::PostCreateHook(HookError::Backend(error)) => {
            map_redis_error(error)
        }
        other => pool_error(&other),
    }
}

/// [`map_pool_error`] for an error shared by several callers (a failed batch).
pub(crate) fn pool_error(error: &PoolError) -> LockError {
    match error {
        PoolError::Backend(error) | PoolError::PostCreateHook(HookError::Backend(error)) => {
            map_redis_error(error.clone())
        }
        PoolError::Timeout(kind) => {
            let what = match kind {
                TimeoutType::Wait => "waiting for a free pooled connection",
                TimeoutType::Create => "opening a new pooled connection",
                TimeoutType::Recycle => "checking a pooled connection",
            };
            LockError::network_timeout(format!(
                "Redis pool timed out {what}; raise the pool size or its timeouts, or check the \
                 server"
            ))
            .with_source(PoolError::Timeout(*kind))
        }
        PoolError::Closed => LockError::service_unavailable("the Redis connection pool was closed")
            .with_source(PoolError::Closed),
        PoolError::PostCreateHook(HookError::Message(message)) => {
            LockError::internal("a hook of the Redis connection pool failed")
                .with_source(message.to_string())
        }
        PoolError::NoRuntimeSpecified => {
            LockError::internal("the Redis connection pool has no async runtime")
                .with_source(PoolError::NoRuntimeSpecified)
        }
    }
}

/// One operation's slot in a batch reply: `{-100, "CODE message"}` is the error that operation
/// met (mapped as the same error of a single-operation script), anything else its reply.
pub(crate) fn error_from_reply(reply: Value) -> Result<Value, LockError> {
    if let Value::Array(items) = &reply
        && let [Value::Int(-100), Value::BulkString(text)] = items.as_slice()
    {
        let text = String::from_utf8_lossy(text);
        let (code, detail) = text.split_once(' ').unwrap_or((&text, ""));
        return Err(map_redis_error(redis::make_extension_error(
            code.to_owned(),
            Some(detail.to_owned()),
        )));
    }
    Ok(reply)
}

/// A reply that does not match what the script returns.
pub(crate) fn unexpected_reply(script: &str, reply: &Value) -> LockError {
    LockError::internal(format!(
        "unexpected reply {reply:?} from the syncguard {script} script; is another program \
         loading scripts with the same SHA-1?"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    fn server(code: &str, detail: &str) -> RedisError {
        redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
    }

    #[test]
    fn classification() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(map_redis_error(io).code(), ErrorCode::ServiceUnavailable);
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(map_redis_error(timeout).code(), ErrorCode::NetworkTimeout);
        for code in ["NOAUTH", "WRONGPASS"] {
            let err = map_redis_error(server(code, "nope"));
            assert_eq!(err.code(), ErrorCode::AuthFailed, "{code}");
            assert!(err.source().is_some());
        }
        assert_eq!(
            map_redis_error(server("WRONGTYPE", "Operation against a key")).code(),
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            map_redis_error(server("BUSY", "Redis is busy running a script")).code(),
            ErrorCode::ServiceUnavailable
        );
        assert_eq!(
            map_redis_error(server("WEIRD", "something")).code(),
            ErrorCode::Internal
        );
    }

    #[cfg(feature = "redis-tls")]
    #[test]
    fn a_rejected_certificate_says_so() {
        let rejected = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, rejected);
        let err = map_redis_error(RedisError::from(io));
        assert_eq!(err.code(), ErrorCode::ServiceUnavailable);
        assert!(err.to_string().contains("tls_root_certs"), "{err}");
        // rustls' words once, as the source; still found behind it.
        let text = chain(&err);
        assert_eq!(text.matches("UnknownIssuer").count(), 1, "{text}");
        assert!(crate::tls::rustls_error(err.source().unwrap()).is_some());
    }

    #[test]
    fn batch_slots() {
        let wrong = Value::Array(vec![
            Value::Int(-100),
            Value::BulkString(b"WRONGTYPE Operation against a key".to_vec()),
        ]);
        let err = error_from_reply(wrong).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert!(err.source().unwrap().to_string().contains("WRONGTYPE"));
        let bad = Value::Array(vec![
            Value::Int(-100),
            Value::BulkString(b"BADDATA syncguard: not lock JSON".to_vec()),
        ]);
        assert_eq!(
            error_from_reply(bad).unwrap_err().code(),
            ErrorCode::InvalidArgument
        );
        let odd = Value::Array(vec![Value::Int(-100), Value::BulkString(b"WEIRD".to_vec())]);
        assert_eq!(
            error_from_reply(odd).unwrap_err().code(),
            ErrorCode::Internal
        );
        // Replies of operations pass through.
        for reply in [
            Value::Int(0),
            Value::Int(-2),
            Value::Array(vec![Value::Int(1), Value::Int(5)]),
        ] {
            assert_eq!(error_from_reply(reply.clone()).unwrap(), reply);
        }
    }

    /// `error`'s message and every source's, as anyhow's `{:#}` prints them.
    fn chain(error: &LockError) -> String {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    }

    #[test]
    fn the_driver_text_appears_once_in_the_chain() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "driver text");
        let error = map_redis_error(RedisError::from(refused));
        assert_eq!(error.code(), ErrorCode::ServiceUnavailable);
        assert!(error.to_string().contains("refused"), "{error}");
        let text = chain(&error);
        assert_eq!(text.matches("driver text").count(), 1, "{text}");
        let source = error.source().expect("the driver error is kept");
        assert_eq!(
            source.downcast_ref::<io::Error>().map(io::Error::kind),
            Some(io::ErrorKind::ConnectionRefused)
        );

        // The operating system's error comes out as itself.
        let os = RedisError::from(io::Error::from_raw_os_error(111));
        let error = map_redis_error(os);
        let source = error.source().unwrap().downcast_ref::<io::Error>();
        assert_eq!(source.and_then(io::Error::raw_os_error), Some(111));
        let text = chain(&error);
        assert_eq!(text.matches("os error").count(), 1, "{text}");

        // A server's reply, with its code.
        let error = map_redis_error(server("NOPERM", "driver text"));
        let text = chain(&error);
        assert_eq!(text.matches("driver text").count(), 1, "{text}");
        let source = error.source().unwrap().downcast_ref::<ServerError>();
        assert_eq!(source.map(ServerError::code), Some("NOPERM"));

        // Through the pool.
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "driver text");
        for error in [
            map_pool_error(PoolError::Backend(RedisError::from(refused))),
            pool_error(&PoolError::PostCreateHook(HookError::Backend(server(
                "NOPERM",
                "driver text",
            )))),
        ] {
            let text = chain(&error);
            assert_eq!(text.matches("driver text").count(), 1, "{text}");
        }
    }

    #[test]
    fn pool_errors() {
        let err = map_pool_error(PoolError::Timeout(TimeoutType::Wait));
        assert_eq!(err.code(), ErrorCode::NetworkTimeout);
        assert!(err.source().is_some());
        assert_eq!(
            map_pool_error(PoolError::Closed).code(),
            ErrorCode::ServiceUnavailable
        );
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(
            map_pool_error(PoolError::Backend(io)).code(),
            ErrorCode::ServiceUnavailable
        );
    }
}
