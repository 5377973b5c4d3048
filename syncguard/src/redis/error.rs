//! Mapping of redis-rs and deadpool errors to [`LockError`], the driver error kept as source.

use deadpool_redis::{PoolError, TimeoutType};
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::LockError;

/// Maps a redis-rs error (seed 004): connection errors → `ServiceUnavailable`, NOAUTH /
/// WRONGPASS / NOPERM → `AuthFailed`, WRONGTYPE, our scripts' BADDATA and script errors on bad data →
/// `InvalidArgument`, timeouts → `NetworkTimeout`, anything else → `Internal`.
pub(crate) fn map_redis_error(error: RedisError) -> LockError {
    #[cfg(feature = "redis-tls")]
    if let Some(tls) = crate::tls::rustls_error(&error) {
        return tls_error(tls).with_source(error);
    }
    let code = error.code().unwrap_or("");
    let kind = error.kind();
    let mapped = if error.is_timeout() {
        LockError::network_timeout(
            "Redis did not answer in time; the operation may or may not have been applied, \
             check the server load or raise the response timeout",
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
    } else if kind == ErrorKind::Server(ServerErrorKind::NoScript) {
        LockError::service_unavailable(
            "Redis lost the syncguard scripts again right after they were loaded (repeated \
             SCRIPT FLUSH or failover); retry later",
        )
    } else if kind == ErrorKind::Io
        || error.is_connection_dropped()
        || error.is_connection_refusal()
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
    } else {
        LockError::internal(format!(
            "unexpected Redis error ({})",
            code_or_category(&error)
        ))
    };
    mapped.with_source(error)
}

/// A TLS failure, in the handshake mostly: a connection error (`ServiceUnavailable`), with
/// what to check when the certificate was rejected.
#[cfg(feature = "redis-tls")]
fn tls_error(tls: &rustls::Error) -> LockError {
    let hint = match tls {
        rustls::Error::InvalidCertificate(_) => {
            "; the server's certificate was rejected: for a private CA, give its certificate \
             to RedisBackendBuilder::tls_root_certs, and connect by a host name (or IP) the \
             certificate names"
        }
        _ => "",
    };
    LockError::service_unavailable(format!("Redis TLS connection failed: {tls}{hint}"))
}

fn code_or_category(error: &RedisError) -> &str {
    error.code().unwrap_or_else(|| error.category())
}

/// Maps a deadpool pool error: timeouts → `NetworkTimeout`, backend errors as the redis error,
/// a closed pool → `ServiceUnavailable`.
pub(crate) fn map_pool_error(error: PoolError) -> LockError {
    let mapped = pool_error(&error);
    match error {
        PoolError::Backend(_) | PoolError::Timeout(_) | PoolError::Closed => mapped,
        other => mapped.with_source(other),
    }
}

/// [`map_pool_error`] for an error shared by several callers (a failed batch).
pub(crate) fn pool_error(error: &PoolError) -> LockError {
    match error {
        PoolError::Backend(error) => map_redis_error(error.clone()),
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
        other => LockError::internal(format!("Redis connection pool failed: {other}")),
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
    use crate::ErrorCode;
    use std::error::Error as _;

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
        assert!(err.source().is_some());
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
