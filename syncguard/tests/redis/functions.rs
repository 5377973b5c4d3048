//! The batch as a Redis function, on servers of the tests' own (their command statistics
//! and function libraries are theirs alone): loaded up front or on first use, loaded again
//! after `FUNCTION FLUSH`; run by EVALSHA for a user who may not have functions, and for a
//! call refused over `maxmemory`, where a release must still free its lock.

use std::time::Duration;

use redis::Value;
use redis::aio::MultiplexedConnection;
use syncguard::backend::LockBackend;
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig};
use syncguard::{ErrorCode, get_by_key};
use tokio::time::sleep;

use crate::servers::RedisServer;
use crate::{acquired, raw, redis_url, unique};

const TTL: Duration = Duration::from_secs(30);
const MODES: [ConnectionMode; 2] = [
    ConnectionMode::Multiplexed,
    ConnectionMode::Pool { max_size: 4 },
];

/// A backend built by the builder (which loads the scripts and the library up front).
async fn built(url: &str, mode: ConnectionMode) -> RedisBackend {
    RedisBackend::connect_with(url, RedisConfig::new().with_connection_mode(mode))
        .await
        .unwrap_or_else(|err| panic!("{mode:?}: {err}"))
}

/// `calls` of a command in `INFO commandstats` (`fcall`, `evalsha`, `function|load`).
async fn calls(conn: &mut MultiplexedConnection, command: &str) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// The names of the function libraries on the server.
pub(crate) async fn libraries(conn: &mut MultiplexedConnection) -> Vec<String> {
    fn names(value: &Value, out: &mut Vec<String>) {
        let items: Vec<&Value> = match value {
            Value::Array(items) => items.iter().collect(),
            Value::Map(pairs) => pairs.iter().flat_map(|(k, v)| [k, v]).collect(),
            _ => return,
        };
        for pair in items.windows(2) {
            if let [Value::BulkString(field), Value::BulkString(name)] = pair
                && field == b"library_name"
            {
                out.push(String::from_utf8_lossy(name).into_owned());
            }
        }
        for item in items {
            names(item, out);
        }
    }
    let list: Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(conn)
        .await
        .unwrap();
    let mut out = Vec::new();
    names(&list, &mut out);
    out
}

async fn reset_stats(conn: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

/// Acquire, extend and release of a fresh key: three batch calls.
async fn cycle(backend: &RedisBackend) {
    let key = unique("function");
    let lease = acquired(backend, &key, TTL).await;
    let extended = backend.extend(&lease.lock_id, TTL).await.unwrap();
    assert!(extended.expires_at_ms().is_some());
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    assert!(!backend.is_locked(&key).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_runs_as_a_function_loaded_once_and_again_after_a_flush() {
    let server = RedisServer::start("everysec").await;
    let mut admin = raw(&server.url()).await;

    // Built by the builder, the backend loads the library up front.
    for mode in MODES {
        let backend = built(&server.url(), mode).await;
        let loaded = libraries(&mut admin).await;
        assert_eq!(loaded.len(), 1, "{mode:?}: {loaded:?}");
        assert!(loaded[0].starts_with("syncguard_"), "{loaded:?}");
        reset_stats(&mut admin).await;
        cycle(&backend).await;
        assert_eq!(calls(&mut admin, "fcall").await, 3, "{mode:?}");
        assert_eq!(calls(&mut admin, "evalsha").await, 1, "{mode:?}: is_locked");
        assert_eq!(calls(&mut admin, "function|load").await, 0, "{mode:?}");

        // Lost (FUNCTION FLUSH; a failover to a server that never had it): loaded again by
        // the first call that misses it, which then runs once.
        let _: () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query_async(&mut admin)
            .await
            .unwrap();
        reset_stats(&mut admin).await;
        cycle(&backend).await;
        assert_eq!(calls(&mut admin, "function|load").await, 1, "{mode:?}");
        assert_eq!(calls(&mut admin, "fcall").await, 4, "{mode:?}: one missed");
        assert_eq!(libraries(&mut admin).await, loaded, "{mode:?}");
    }

    // On a connection the caller made (no I/O when built), the first call loads it.
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut admin)
        .await
        .unwrap();
    let manager = redis::aio::ConnectionManager::new(redis::Client::open(server.url()).unwrap())
        .await
        .unwrap();
    let backend = RedisBackend::new(manager, RedisConfig::new()).unwrap();
    cycle(&backend).await;
    assert_eq!(libraries(&mut admin).await.len(), 1);
}

/// A user who may call functions but not load them, or neither, still locks: by EVALSHA,
/// until someone permitted loads the library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_functions_runs_the_batch_as_a_script() {
    let server = RedisServer::start("everysec").await;
    let mut admin = raw(&server.url()).await;
    for (user, denied) in [("noload", "-function"), ("nofunctions", "-@scripting")] {
        let mut setuser = redis::cmd("ACL");
        setuser
            .arg("SETUSER")
            .arg(user)
            .arg("reset")
            .arg("on")
            .arg(">secret")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg(denied);
        if denied == "-@scripting" {
            setuser.arg("+evalsha").arg("+eval").arg("+script|load");
        }
        let _: () = setuser.query_async(&mut admin).await.unwrap();
    }
    let as_user = |user: &str| {
        server
            .url()
            .replacen("redis://", &format!("redis://{user}:secret@"), 1)
    };

    for user in ["noload", "nofunctions"] {
        for mode in MODES {
            let backend = built(&as_user(user), mode).await;
            reset_stats(&mut admin).await;
            cycle(&backend).await;
            assert_eq!(calls(&mut admin, "evalsha").await, 4, "{user} {mode:?}");
            // The one who may call functions finds the library missing, once; the other is
            // refused FCALL (counted as rejected, not run).
            let missed = u64::from(user == "noload");
            assert_eq!(calls(&mut admin, "fcall").await, missed, "{user} {mode:?}");
            assert!(libraries(&mut admin).await.is_empty(), "{user} {mode:?}");
        }
    }

    // Loaded by a user who may, the library serves the one who may only call it.
    let _admin_backend = RedisBackend::connect(&server.url()).await.unwrap();
    assert_eq!(libraries(&mut admin).await.len(), 1);
    let backend = RedisBackend::connect(&as_user("noload")).await.unwrap();
    reset_stats(&mut admin).await;
    cycle(&backend).await;
    assert_eq!(calls(&mut admin, "fcall").await, 3);
}

/// Over `maxmemory` (no eviction) the server refuses a function whole: the release goes by
/// EVALSHA and frees the lock, an acquire is refused and stores nothing, and both work again
/// once memory is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_maxmemory_a_release_still_frees_its_lock_and_an_acquire_changes_nothing() {
    let server = RedisServer::start("everysec").await;
    let mut admin = raw(&server.url()).await;
    let config = |name: &str, value: &str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg(name).arg(value);
        cmd
    };
    let _: () = config("maxmemory-policy", "noeviction")
        .query_async(&mut admin)
        .await
        .unwrap();
    for mode in MODES {
        let backend = built(&server.url(), mode).await;
        let held = unique("oom-held");
        let lease = acquired(&backend, &held, TTL).await;

        let _: () = config("maxmemory", "1")
            .query_async(&mut admin)
            .await
            .unwrap();
        let released = backend.release(&lease.lock_id).await.unwrap();
        assert!(released.is_released(), "{mode:?}: {released:?}");
        assert!(get_by_key(&backend, &held).await.unwrap().is_none());

        let refused = unique("oom-refused");
        let err = backend.acquire(&refused, TTL).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::ServiceUnavailable, "{mode:?}: {err}");
        assert!(err.to_string().contains("OOM"), "{mode:?}: {err}");

        let _: () = config("maxmemory", "0")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(get_by_key(&backend, &refused).await.unwrap().is_none());
        let lease = acquired(&backend, &refused, TTL).await;
        assert_eq!(
            lease.fence.get(),
            1,
            "{mode:?}: the refused acquire took no fence"
        );
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
}

/// A lock's expiry is its own call's time plus its ttl, never an earlier call's: the function
/// keeps its state between calls, and each call sets it afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_dates_its_lock_by_its_own_server_time() {
    let backend = RedisBackend::connect(&redis_url()).await.unwrap();
    let first = unique("dated-first");
    let second = unique("dated-second");
    let lease = acquired(&backend, &first, TTL).await;
    sleep(Duration::from_millis(1100)).await;
    let later = acquired(&backend, &second, TTL).await;
    for (key, lease) in [(&first, &lease), (&second, &later)] {
        let info = get_by_key(&backend, key).await.unwrap().expect("held");
        assert_eq!(info.expires_at_ms - info.acquired_at_ms, 30_000, "{key}");
        assert_eq!(info.expires_at_ms, lease.expires_at_ms, "{key}");
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
    assert!(later.expires_at_ms >= lease.expires_at_ms + 1000);
}
