//! The connection in both modes when the server fails or refuses: rejected credentials and
//! permissions, an unreachable server, a restart (with fences persisted by AOF), a paused
//! server, and a flushed script cache and function library mid-run.

use std::error::Error as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use syncguard::backend::{Lease, LockBackend};
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig};
use syncguard::{ErrorCode, get_by_key};
use tokio::time::{Instant, sleep};

use crate::servers::{RedisServer, free_port};
use crate::{acquired, both_backends, raw, redis_url, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_credentials_and_permissions_are_auth_failed() {
    let url = redis_url();
    let mut conn = raw(&url).await;
    let user = format!("sg-test-{}", std::process::id());
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("reset")
        .arg("on")
        .arg(">secret")
        .arg("~*")
        .arg("+@connection")
        .query_async(&mut conn)
        .await
        .unwrap();
    let with_user =
        |password: &str| url.replacen("redis://", &format!("redis://{user}:{password}@"), 1);

    for mode in [
        ConnectionMode::Multiplexed,
        ConnectionMode::Pool { max_size: 2 },
    ] {
        let err = RedisBackend::connect_with(
            &with_user("wrong"),
            RedisConfig::new().with_connection_mode(mode),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::AuthFailed, "{mode:?}: {err}");
        assert!(err.source().is_some());

        // Authenticated, but without permission to run scripts.
        let err = RedisBackend::connect_with(
            &with_user("secret"),
            RedisConfig::new().with_connection_mode(mode),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::AuthFailed, "{mode:?}: {err}");
        // The server's reply is the source, with its code.
        let source = err.source().unwrap().downcast_ref::<redis::ServerError>();
        assert_eq!(source.map(|e| e.code()), Some("NOPERM"), "{err:?}");
    }
    // The same on the hot path (EVALSHA refused), with a connection the caller made.
    let client = redis::Client::open(with_user("secret")).unwrap();
    let manager = redis::aio::ConnectionManager::new(client).await.unwrap();
    let backend = RedisBackend::new(manager, RedisConfig::new()).unwrap();
    let err = backend
        .acquire(&unique("noperm"), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::AuthFailed, "{err}");
    let _: () = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// `connect_with` to a port nothing listens on, without reconnect attempts, in both
/// connection modes: the mode and its error.
async fn refused_in_both_modes() -> Vec<(ConnectionMode, syncguard::LockError)> {
    let port = free_port();
    let mut refused = Vec::new();
    for mode in [
        ConnectionMode::Multiplexed,
        ConnectionMode::Pool { max_size: 2 },
    ] {
        let err = RedisBackend::connect_with(
            &format!("redis://127.0.0.1:{port}"),
            RedisConfig::new()
                .with_connection_mode(mode)
                .with_reconnect_retries(0),
        )
        .await
        .unwrap_err();
        refused.push((mode, err));
    }
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_service_unavailable() {
    for (mode, err) in refused_in_both_modes().await {
        assert_eq!(err.code(), ErrorCode::ServiceUnavailable, "{mode:?}: {err}");
        assert!(err.is_retryable());
        assert!(err.source().is_some());
    }
}

/// The driver's text ("Connection refused (os error 111)" on Linux) appears once when the
/// chain is walked, under a message in our words; the source is the I/O error itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_prints_the_driver_error_once() {
    for (mode, err) in refused_in_both_modes().await {
        assert_eq!(err.code(), ErrorCode::ServiceUnavailable, "{mode:?}: {err}");
        assert!(
            err.to_string().contains("refused") && !err.to_string().contains("os error"),
            "{mode:?}: the message should say it in our words: {err}"
        );
        let mut chain = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            chain.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        assert_eq!(chain.matches("os error").count(), 1, "{mode:?}: {chain}");
        let io = err.source().unwrap().downcast_ref::<std::io::Error>();
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::ConnectionRefused),
            "{mode:?}: {err:?}"
        );
    }
}

/// Retries `acquire` until the server answers again, checking every failure is a mapped,
/// retryable connection error.
async fn acquire_when_back(backend: &RedisBackend, key: &str) -> Lease {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match backend.acquire(key, Duration::from_secs(30)).await {
            Ok(outcome) => match outcome.lease() {
                Some(lease) => return lease,
                None => panic!("{key} contended after restart"),
            },
            Err(err) => {
                assert!(
                    matches!(
                        err.code(),
                        ErrorCode::ServiceUnavailable | ErrorCode::NetworkTimeout
                    ),
                    "unexpected error while the server restarts: {err}"
                );
                assert!(
                    Instant::now() < deadline,
                    "no recovery after restart: {err}"
                );
                sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_gives_mapped_errors_then_recovers_and_fences_persist_with_aof() {
    let mut server = RedisServer::start("everysec").await;
    let manager =
        RedisBackend::connect_with(&server.url(), RedisConfig::new().with_reconnect_retries(1))
            .await
            .unwrap();
    let pool = RedisBackend::connect_with(
        &server.url(),
        RedisConfig::new().with_connection_mode(ConnectionMode::Pool { max_size: 4 }),
    )
    .await
    .unwrap();
    let backends = [("multiplexed", manager), ("pool", pool)];
    let key = unique("restart");
    let mut last = 0;
    for (_, backend) in &backends {
        for _ in 0..3 {
            let lease = acquired(backend, &key, Duration::from_secs(30)).await;
            assert!(lease.fence.get() > last);
            last = lease.fence.get();
            assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
        }
    }
    assert_eq!(last, 6);

    server.stop().await;
    for (mode, backend) in &backends {
        let err = backend
            .acquire(&key, Duration::from_secs(30))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ServiceUnavailable, "{mode}: {err}");
        assert!(err.is_retryable());
        assert!(err.source().is_some(), "{mode}: the redis error is kept");
        let err = backend.is_locked(&key).await.unwrap_err();
        assert!(
            matches!(
                err.code(),
                ErrorCode::ServiceUnavailable | ErrorCode::NetworkTimeout
            ),
            "{mode}: {err}"
        );
    }

    // Same directory, same port: the AOF brings the counters back, the script cache is empty
    // (the first calls get NOSCRIPT and recover on their own).
    server.launch().await;
    for (mode, backend) in &backends {
        let lease = acquire_when_back(backend, &key).await;
        assert!(
            lease.fence.get() > last,
            "{mode}: fence {} after restart, {last} before",
            lease.fence
        );
        last = lease.fence.get();
        assert!(backend.is_locked(&key).await.unwrap());
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
    assert_eq!(last, 8, "fences went on from 6");

    // A server that stops answering (CLIENT PAUSE) gives NetworkTimeout.
    let slow = RedisBackend::connect_with(
        &server.url(),
        RedisConfig::new().with_operation_timeout(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let mut conn = raw(&server.url()).await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1500)
        .arg("ALL")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = slow.is_locked(&key).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NetworkTimeout, "{err}");
    assert!(err.source().is_some());
    sleep(Duration::from_millis(1600)).await;
    assert!(
        !slow.is_locked(&key).await.unwrap(),
        "recovered after the pause"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_and_function_flushes_mid_run_are_recovered() {
    let url = redis_url();
    for backend in both_backends().await {
        let stop = Instant::now() + Duration::from_secs(2);
        let cycles = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..16)
            .map(|worker| {
                let backend = backend.clone();
                let cycles = Arc::clone(&cycles);
                tokio::spawn(async move {
                    let key = unique(&format!("flush-{worker}"));
                    while Instant::now() < stop {
                        let lease = acquired(&backend, &key, Duration::from_secs(10)).await;
                        assert!(backend.is_locked(&key).await.unwrap());
                        let extended = backend
                            .extend(&lease.lock_id, Duration::from_secs(10))
                            .await
                            .unwrap();
                        assert!(extended.expires_at_ms().is_some());
                        assert!(
                            get_by_key(&backend, &key)
                                .await
                                .unwrap()
                                .map(syncguard::LockInfo::reveal)
                                .is_some()
                        );
                        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let mut conn = raw(&url).await;
        let mut flushes = 0;
        while Instant::now() < stop {
            sleep(Duration::from_millis(50)).await;
            // The script cache and the batch's function library, in turn.
            let flush = if flushes % 2 == 0 {
                "SCRIPT"
            } else {
                "FUNCTION"
            };
            let _: () = redis::cmd(flush)
                .arg("FLUSH")
                .query_async(&mut conn)
                .await
                .unwrap();
            flushes += 1;
        }
        for worker in workers {
            worker.await.expect("a worker failed across SCRIPT FLUSH");
        }
        assert!(flushes >= 10);
        assert!(cycles.load(Ordering::Relaxed) > 100, "too few cycles");
    }
}

/// A database index the server does not have is named, with what to change; before, it was
/// "unexpected Redis error (ERR)" with the cause only in `source()`.
#[tokio::test]
async fn a_database_the_server_lacks_is_named_with_what_to_change() {
    let base = redis_url();
    let base = base.trim_end_matches('/');
    // The test server has the default 16 databases.
    let url = format!("{base}/99");
    for mode in [
        ConnectionMode::Multiplexed,
        ConnectionMode::Pool { max_size: 2 },
    ] {
        let error = RedisBackend::connect_with(&url, RedisConfig::new().with_connection_mode(mode))
            .await
            .unwrap_err();
        assert_eq!(
            error.code(),
            ErrorCode::InvalidArgument,
            "{mode:?}: {error}"
        );
        let message = error.to_string();
        assert!(message.contains("no database 99"), "{mode:?}: {message}");
        assert!(message.contains("databases"), "{mode:?}: {message}");
        assert!(
            error.source().is_some(),
            "{mode:?}: the server's answer is kept"
        );
    }
    RedisBackend::connect(&format!("{base}/15")).await.unwrap();
}

/// A PostgreSQL URL is refused before any I/O, naming the PostgreSQL backend; redis-rs's
/// other schemes (the `valkey` forms here) keep working.
#[tokio::test]
async fn urls_of_other_schemes_are_refused_naming_the_backend() {
    for (url, says) in [
        ("postgres://app:secret@127.0.0.1:1/app", "PostgresBackend"),
        ("postgresql://127.0.0.1:1/app", "PostgresBackend"),
        ("memcached://127.0.0.1:1", "\"memcached\""),
    ] {
        let error = RedisBackend::connect(url).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{url}: {error}");
        let message = error.to_string();
        assert!(message.contains(says), "{url}: {message}");
        assert!(!message.contains("secret"), "{url}: {message}");
    }
    let valkey = redis_url().replacen("redis://", "valkey://", 1);
    RedisBackend::connect(&valkey).await.unwrap();
}

/// `new` runs on a connection of yours: a setting only the connections `connect_with` opens
/// can apply is refused, naming it, rather than silently ignored; a setting given to
/// `connect_with` is in effect.
#[tokio::test]
async fn new_refuses_settings_it_cannot_apply_and_connect_with_applies_them() {
    let client = redis::Client::open(redis_url()).unwrap();
    let manager = redis::aio::ConnectionManager::new(client).await.unwrap();
    for (config, setting) in [
        (
            RedisConfig::new().with_connection_mode(ConnectionMode::Pool { max_size: 4 }),
            "with_connection_mode",
        ),
        (
            RedisConfig::new().with_reconnect_retries(5),
            "with_reconnect_retries",
        ),
    ] {
        let error = RedisBackend::new(manager.clone(), config).unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
        assert!(error.to_string().contains(setting), "{setting}: {error}");
    }
    assert!(RedisBackend::new(manager, RedisConfig::new()).is_ok());

    let pooled = RedisBackend::connect_with(
        &redis_url(),
        RedisConfig::new().with_connection_mode(ConnectionMode::Pool { max_size: 3 }),
    )
    .await
    .unwrap();
    assert_eq!(
        pooled.connection_mode(),
        ConnectionMode::Pool { max_size: 3 }
    );
}
