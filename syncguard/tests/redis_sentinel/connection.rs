//! Sentinel URLs and settings: refused before any I/O when they cannot work, and a backend
//! that writes to the primary the Sentinels name.

use std::time::Duration;

use redis::AsyncCommands as _;
use syncguard::ErrorCode;
use syncguard::backend::LockBackend;
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig};

use crate::sentinels::is_primary;
use crate::urls::redis_sentinel_url;
use crate::{acquired, backend, unique};

/// Sentinels nothing listens on: an error that names the setting proves it was refused before
/// any I/O.
const NOWHERE: &str = "redis+sentinel://127.0.0.1:1,127.0.0.1:2/locks";

#[tokio::test]
async fn bad_sentinel_urls_and_settings_are_refused_before_any_io() {
    let cases = [
        (
            NOWHERE,
            RedisConfig::new().with_connection_mode(ConnectionMode::Pool { max_size: 4 }),
            "with_connection_mode",
        ),
        (
            NOWHERE,
            RedisConfig::new().with_reconnect_retries(3),
            "with_reconnect_retries",
        ),
        (
            "redis+sentinel://127.0.0.1:1",
            RedisConfig::new(),
            "names no primary",
        ),
        (
            "redis+sentinel://127.0.0.1:1/a/b/c",
            RedisConfig::new(),
            "path",
        ),
        (
            "redis+sentinel://:hunter2@127.0.0.1:1,,127.0.0.1:2/locks",
            RedisConfig::new(),
            "empty Sentinel address",
        ),
        (
            "redis+sentinel://127.0.0.1:1/locks?db=2",
            RedisConfig::new(),
            "sentinel_password",
        ),
    ];
    for (url, config, named) in cases {
        let error = RedisBackend::connect_with(url, config).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{url}: {error}");
        assert!(error.to_string().contains(named), "{url}: {error}");
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }
}

#[tokio::test]
async fn unreachable_sentinels_and_an_unknown_primary_are_named() {
    let unreachable = RedisBackend::connect_with(
        NOWHERE,
        RedisConfig::new().with_connect_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            unreachable.code(),
            ErrorCode::ServiceUnavailable | ErrorCode::NetworkTimeout
        ),
        "{unreachable}"
    );
    assert!(
        unreachable.to_string().contains("Sentinel"),
        "{unreachable}"
    );

    let shared = redis_sentinel_url();
    let (sentinels, _) = shared.rsplit_once('/').unwrap();
    let unknown = RedisBackend::connect(&format!("{sentinels}/no-such-primary"))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), ErrorCode::ServiceUnavailable, "{unknown}");
    assert!(
        unknown.to_string().contains("\"no-such-primary\""),
        "{unknown}"
    );
}

/// The backend writes to the primary: the lock's record is on the server that says it is one.
#[tokio::test]
async fn locks_are_written_to_the_primary_the_sentinels_name() {
    let backend = backend().await;
    assert_eq!(backend.connection_mode(), ConnectionMode::Multiplexed);
    let key = unique("written");
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    let shared = redis_sentinel_url();
    let first_sentinel = shared
        .trim_start_matches("redis+sentinel://")
        .split([',', '/'])
        .next()
        .unwrap();
    let mut sentinel = redis::Client::open(format!("redis://{first_sentinel}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (_, port): (String, u16) = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg("syncguard")
        .query_async(&mut sentinel)
        .await
        .unwrap();
    assert!(is_primary(port).await);
    let mut primary = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let stored: Option<String> = primary.get(backend.lock_key(&key).unwrap()).await.unwrap();
    assert!(stored.unwrap().contains(&lease.lock_id.to_string()));
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}
