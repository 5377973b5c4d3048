//! The Redis backend (feature `redis`): Lua scripts run by EVALSHA, over a multiplexed
//! auto-reconnecting connection (the default) or a deadpool-redis pool. The acquire, release
//! and extend calls waiting at the same moment run in one script call, each as it would alone.
//!
//! Storage follows the reference design's Redis layout, so a Rust and a TypeScript SyncGuard
//! service sharing a Redis and a prefix exclude each other:
//!
//! | what | Redis key | value | TTL |
//! |---|---|---|---|
//! | lock | `make_storage_key(prefix, key, 1000, 26)`, e.g. `syncguard:job:42` | JSON `{lockId, expiresAtMs, acquiredAtMs, key, fence}` | ttl + 1 s |
//! | index | `make_storage_key(prefix, "id:" + lockId, 1000, 26)`, e.g. `syncguard:id:<22 chars>` | the lock key | same as the lock |
//! | fence | [`make_fence_key`](crate::key::make_fence_key)`(prefix, lock key, 1000, 26)`, e.g. `syncguard:fence:syncguard:job:42` | `INCR` counter | none, never deleted |
//!
//! Differences from the reference, all deliberate:
//!
//! - **Reserved keys.** A user key that starts with `id:` or `fence:`, or that is exactly 22
//!   base64url characters encoding 16 bytes (the shape of a hashed storage key), is stored under
//!   the hashed form `prefix:<base64url(sha256("prefix:key")[..16])>`, where the reference puts
//!   keys too long for the budget. With the reference layout such keys would land on another
//!   key's fence counter (`fence:syncguard:x`), on an index key (`id:<lock id>`) or on a hashed
//!   key. This is the one place where Rust and TypeScript store a key differently: such keys do
//!   not exclude each other across the two languages. Every other key is stored where the
//!   reference stores it.
//! - **TTL.** Both keys are written with `PX` = ttl + [`TIME_TOLERANCE_MS`], so a lock stays
//!   visible for the tolerance window in which the liveness predicate still counts it as held
//!   (the reference's `PX` = ttl lets Redis drop the key at its expiry, before the tolerance
//!   ends). The stored JSON is byte for byte what the reference writes.
//! - **Prefixes** are validated ([`validate_prefix`]); a stale index left by a dead lock is
//!   removed only when it still points at the key being taken.
//!
//! An acquire whose answer never came (the response timeout passed, the connection broke)
//! may still be applied by Redis later: a request held up in the network, or by a paused
//! server, runs when it arrives. The backend then releases that lock id (only if it holds the
//! lock) as soon as the connection answers again, trying until the lock's ttl is over; a
//! release that finds nothing is sent three more times, a second apart, in case the held
//! request arrives later on another connection (see `orphans`). What remains possible: the
//! key is held by nobody until that release lands (at most its ttl), and a request held up
//! longer than those resends lands after the last of them, so that its lock stays until its
//! ttl.
//!
//! Fences survive a restart only if Redis persists them: run Redis with `appendonly yes` (AOF;
//! `appendfsync everysec` loses at most about a second of writes on a crash, `always` none) or
//! at least RDB snapshots, and never restore an older snapshot over a newer one. Without
//! persistence a restart resets every counter to zero and fences repeat.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
//! use syncguard::redis::RedisBackend;
//! use syncguard::LockOptions;
//!
//! let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
//! let guard = syncguard::acquire(&backend, &LockOptions::new("job:42")).await?;
//! println!("fence {}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## TLS
//!
//! With the `redis-tls` feature, `rediss://` URLs connect over TLS (rustls, *ring* provider)
//! and verify the server's certificate and host name against the Mozilla root certificates
//! (webpki-roots), which managed services such as ElastiCache or Azure Cache for Redis chain
//! to. A server whose certificate comes from a private CA needs
//! [`tls_root_certs`](RedisBackendBuilder::tls_root_certs). Without the feature, a
//! `rediss://` URL fails with `InvalidArgument`.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
//! let backend = syncguard::redis::RedisBackend::connect("rediss://:password@redis.example.com:6380").await?;
//! # let _ = backend; Ok(()) }
//! ```
//!
//! redis-rs builds its TLS settings with rustls' process-wide default crypto provider, and
//! panics without one (as when two providers are compiled in), so
//! [`build`](RedisBackendBuilder::build) and [`from_pool`](RedisBackend::from_pool) install
//! *ring* as that default unless one is installed already. An application that wants another
//! provider, or that opens `rediss://` connections of its own before, installs one first
//! (`rustls::crypto::ring::default_provider().install_default()`).

mod batch;
mod config;
mod error;
mod keys;
mod known;
mod orphans;
mod scripts;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::{Arg, Cmd, ErrorKind, ServerErrorKind, Value};
use serde::{Deserialize, Deserializer};

use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, Lease, LockBackend, LockInfo, Lookup,
    NotHeldReason, ReleaseOutcome, TimeAuthority,
};
use crate::key::normalize_key;
use crate::time::{TIME_TOLERANCE_MS, is_live, ttl_millis};
use crate::{Fence, LockError, LockId};

use config::NetConfig;
pub use config::{
    CLEANUP_GUARD_MS, ConnectionMode, DEFAULT_PREFIX, MAX_PREFIX_BYTES, RedisConfig,
    validate_prefix,
};
use error::{map_pool_error, map_redis_error, unexpected_reply};
use keys::Layout;
use scripts::LuaScript;

/// Distributed locks on Redis: Lua scripts by EVALSHA (concurrent acquire, release and extend
/// calls batched into one), server time (`TIME`) as the time authority, fences from `INCR`.
///
/// Cheap to clone (an `Arc` inside): clone it into tasks. Build it with
/// [`connect`](Self::connect), the [`builder`](Self::builder), or from a connection you
/// already have ([`from_connection_manager`](Self::from_connection_manager),
/// [`from_pool`](Self::from_pool)). See the [module documentation](self) for the storage
/// layout and the persistence requirement.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
/// use std::time::Duration;
/// use syncguard::{AcquireOutcome, LockBackend};
/// use syncguard::redis::RedisBackend;
///
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
/// if let AcquireOutcome::Acquired(lease) = backend.acquire("job:7", Duration::from_secs(10)).await? {
///     println!("fence {}", lease.fence);
///     backend.release(&lease.lock_id).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    /// Acquire, release and extend go through here (see `batch`).
    batcher: batch::Batcher,
    /// The lock keys of the locks this backend holds, for release and extend.
    known: known::KnownKeys,
    layout: Layout,
    /// The cleanup guard passed to `is_locked` (`0` = no cleanup).
    cleanup_guard_ms: u64,
}

#[derive(Clone)]
enum Conn {
    Manager(ConnectionManager),
    Pool(deadpool_redis::Pool),
}

/// Why a script call failed: the command, or (pool mode) getting a connection.
enum ConnError {
    Redis(::redis::RedisError),
    Pool(deadpool_redis::PoolError),
}

impl ConnError {
    fn into_lock_error(self) -> LockError {
        match self {
            ConnError::Redis(error) => map_redis_error(error),
            ConnError::Pool(error) => map_pool_error(error),
        }
    }

    /// [`into_lock_error`](Self::into_lock_error) for an error shared by several callers.
    fn to_lock_error(&self) -> LockError {
        match self {
            ConnError::Redis(error) => map_redis_error(error.clone()),
            ConnError::Pool(error) => error::pool_error(error),
        }
    }
}

impl Conn {
    /// Runs one script command on a connection of this mode, reloading the script once on
    /// NOSCRIPT.
    async fn eval(&self, lua: &LuaScript, cmd: &Cmd) -> Result<Value, ConnError> {
        match self {
            Conn::Manager(manager) => eval_on(&mut manager.clone(), lua, cmd).await,
            Conn::Pool(pool) => {
                let mut pooled = pool.get().await.map_err(ConnError::Pool)?;
                eval_on(&mut pooled, lua, cmd).await
            }
        }
        .map_err(ConnError::Redis)
    }
}

impl RedisBackend {
    /// Connects with the defaults (prefix `"syncguard"`, one multiplexed connection) and loads
    /// the scripts, so that a wrong URL, password or ACL fails here.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed URL, `ServiceUnavailable` / `NetworkTimeout` when the
    /// server cannot be reached, `ServiceUnavailable` when TLS fails (the server's certificate
    /// rejected, say), `AuthFailed` for rejected credentials or permissions.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder(url).build().await
    }

    /// A builder for a backend that opens its own connections to `url`
    /// (`redis://[user:password@]host[:port][/db]`, or `rediss://` for TLS with the
    /// `redis-tls` feature).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// use std::time::Duration;
    /// use syncguard::redis::{ConnectionMode, RedisBackend};
    ///
    /// let backend = RedisBackend::builder("redis://127.0.0.1:6379")
    ///     .prefix("billing")
    ///     .mode(ConnectionMode::Multiplexed)
    ///     .response_timeout(Duration::from_secs(2))
    ///     .build()
    ///     .await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn builder(url: &str) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.to_owned(),
            config: RedisConfig::default(),
            mode: ConnectionMode::default(),
            net: NetConfig::default(),
            #[cfg(feature = "redis-tls")]
            tls_roots: None,
        }
    }

    /// A backend on an existing `ConnectionManager` (multiplexed, auto-reconnecting; its
    /// clones share one connection). No I/O happens here; scripts load on first use.
    ///
    /// # Errors
    /// `InvalidArgument` for an invalid prefix (see [`validate_prefix`]).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use syncguard::redis::{RedisBackend, RedisConfig};
    ///
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let manager = redis::aio::ConnectionManager::new(client).await?;
    /// let backend = RedisBackend::from_connection_manager(manager, RedisConfig::new())?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn from_connection_manager(
        manager: ConnectionManager,
        config: RedisConfig,
    ) -> Result<Self, LockError> {
        Self::with_conn(Conn::Manager(manager), &config)
    }

    /// A backend on an existing deadpool-redis pool. No I/O happens here; scripts load on
    /// first use.
    ///
    /// # Errors
    /// `InvalidArgument` for an invalid prefix (see [`validate_prefix`]).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use syncguard::redis::{RedisBackend, RedisConfig};
    ///
    /// let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
    ///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// let backend = RedisBackend::from_pool(pool, RedisConfig::new().with_prefix("app"))?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn from_pool(pool: deadpool_redis::Pool, config: RedisConfig) -> Result<Self, LockError> {
        // The pool opens its connections later, in our operations.
        #[cfg(feature = "redis-tls")]
        install_crypto_provider();
        Self::with_conn(Conn::Pool(pool), &config)
    }

    fn with_conn(conn: Conn, config: &RedisConfig) -> Result<Self, LockError> {
        let prefix = validate_prefix(&config.prefix)?;
        let layout = Layout::new(prefix);
        Ok(Self {
            inner: Arc::new(Inner {
                batcher: batch::Batcher::new(conn.clone(), layout.index_prefix()),
                known: known::KnownKeys::default(),
                conn,
                layout,
                cleanup_guard_ms: if config.cleanup_in_is_locked {
                    CLEANUP_GUARD_MS
                } else {
                    0
                },
            }),
        })
    }

    /// The key prefix.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// assert_eq!(backend.prefix(), "syncguard");
    /// # Ok(()) }
    /// ```
    pub fn prefix(&self) -> &str {
        self.inner.layout.prefix()
    }

    /// How this backend talks to Redis.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::redis::{ConnectionMode, RedisBackend};
    /// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// assert_eq!(backend.connection_mode(), ConnectionMode::Multiplexed);
    /// # Ok(()) }
    /// ```
    pub fn connection_mode(&self) -> ConnectionMode {
        match &self.inner.conn {
            Conn::Manager(_) => ConnectionMode::Multiplexed,
            Conn::Pool(pool) => ConnectionMode::Pool {
                max_size: pool.status().max_size,
            },
        }
    }

    /// The Redis key that holds the lock data of `key` (for inspection and debugging).
    ///
    /// # Errors
    /// `InvalidArgument` for an invalid key.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// assert_eq!(backend.lock_key("job:42")?, "syncguard:job:42");
    /// # Ok(()) }
    /// ```
    pub fn lock_key(&self, key: &str) -> Result<String, LockError> {
        self.inner.layout.lock_key(&normalize_key(key)?)
    }

    /// The Redis key of the fence counter of `key` (never expires, never deleted).
    ///
    /// # Errors
    /// `InvalidArgument` for an invalid key.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// assert_eq!(backend.fence_key("job:42")?, "syncguard:fence:syncguard:job:42");
    /// # Ok(()) }
    /// ```
    pub fn fence_key(&self, key: &str) -> Result<String, LockError> {
        let layout = &self.inner.layout;
        layout.fence_key(&layout.lock_key(&normalize_key(key)?)?)
    }

    /// The Redis key of the reverse index of `lock_id`.
    ///
    /// # Errors
    /// Never with a validated prefix; kept fallible like the key functions it calls.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// let id = syncguard::LockId::generate();
    /// assert_eq!(backend.index_key(&id)?, format!("syncguard:id:{id}"));
    /// # Ok(()) }
    /// ```
    pub fn index_key(&self, lock_id: &LockId) -> Result<String, LockError> {
        self.inner.layout.index_key(lock_id)
    }

    /// Loads every script into the server's script cache (`SCRIPT LOAD`). Operations reload
    /// them on their own after a `SCRIPT FLUSH` or a restart; this only moves the first load
    /// (and any permission error) up front.
    ///
    /// # Errors
    /// As the operations: connection, authentication and permission errors.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// backend.load_scripts().await?;
    /// # Ok(()) }
    /// ```
    pub async fn load_scripts(&self) -> Result<(), LockError> {
        match &self.inner.conn {
            Conn::Manager(manager) => load_all(&mut manager.clone()).await,
            Conn::Pool(pool) => load_all(&mut pool.get().await.map_err(map_pool_error)?).await,
        }
    }

    /// Runs one script command, reloading the script once on NOSCRIPT.
    async fn eval(&self, script: &LuaScript, cmd: &Cmd) -> Result<Value, LockError> {
        self.inner
            .conn
            .eval(script, cmd)
            .await
            .map_err(ConnError::into_lock_error)
    }

    async fn acquire_once(&self, key: &str, ttl: Duration) -> Result<AcquireOutcome, LockError> {
        let key = normalize_key(key)?;
        let ttl_ms = ttl_millis(ttl)?;
        let layout = &self.inner.layout;
        let lock_key = layout.lock_key(&key)?;
        let fence_key = layout.fence_key(&lock_key)?;
        let lock_id = LockId::generate();
        let index_key = layout.index_key(&lock_id)?;

        let reply = self
            .inner
            .batcher
            .run(batch::Op::Acquire {
                lock_key: lock_key.clone(),
                index_key,
                fence_key,
                lock_id: lock_id.clone(),
                ttl_ms,
                key: key.into_owned(),
            })
            .await?;
        let fence = match &reply.value {
            Value::Int(0) => return Ok(AcquireOutcome::Contended),
            Value::BulkString(fence) => fence.as_slice(),
            _ => return Err(unexpected_reply("acquire", &reply.value)),
        };
        let expires_at_ms = reply.now_ms + ttl_ms;
        let fence = match std::str::from_utf8(fence)
            .map_err(|_| unexpected_reply("acquire", &reply.value))
            .and_then(str::parse::<Fence>)
        {
            Ok(fence) => fence,
            Err(error) => {
                // Past the fence maximum (or garbage): do not leave the lock held for its ttl.
                let _ = self.release_once(&lock_id).await;
                return Err(error);
            }
        };
        self.inner.known.insert(lock_id.clone(), lock_key, ttl);
        Ok(AcquireOutcome::Acquired(Lease::new(
            lock_id,
            expires_at_ms,
            fence,
        )))
    }

    async fn release_once(&self, lock_id: &LockId) -> Result<ReleaseOutcome, LockError> {
        let index_key = self.inner.layout.index_key(lock_id)?;
        let reply = self
            .inner
            .batcher
            .run(batch::Op::Release {
                lock_key: self.inner.known.take(lock_id),
                index_key,
                lock_id: lock_id.clone(),
            })
            .await?
            .value;
        match reply {
            Value::Int(1) => Ok(ReleaseOutcome::Released),
            Value::Int(code) => match not_held_reason(code) {
                Some(reason) => Ok(ReleaseOutcome::NotHeld(Some(reason))),
                None => Err(unexpected_reply("release", &reply)),
            },
            _ => Err(unexpected_reply("release", &reply)),
        }
    }

    async fn extend_once(
        &self,
        lock_id: &LockId,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let ttl_ms = ttl_millis(ttl)?;
        let index_key = self.inner.layout.index_key(lock_id)?;
        let reply = self
            .inner
            .batcher
            .run(batch::Op::Extend {
                lock_key: self.inner.known.get(lock_id),
                index_key,
                lock_id: lock_id.clone(),
                ttl_ms,
            })
            .await?;
        let outcome = match reply.value {
            Value::Int(1) => ExtendOutcome::Extended {
                expires_at_ms: reply.now_ms + ttl_ms,
            },
            Value::Int(code) => match not_held_reason(code) {
                Some(reason) => ExtendOutcome::NotHeld(Some(reason)),
                None => return Err(unexpected_reply("extend", &reply.value)),
            },
            _ => return Err(unexpected_reply("extend", &reply.value)),
        };
        let lives_on = matches!(outcome, ExtendOutcome::Extended { .. }).then_some(ttl);
        self.inner.known.extended(lock_id, lives_on);
        Ok(outcome)
    }

    async fn is_locked_once(&self, key: &str) -> Result<bool, LockError> {
        let key = normalize_key(key)?;
        let layout = &self.inner.layout;
        let lock_key = layout.lock_key(&key)?;
        let mut cmd = evalsha(&scripts::IS_LOCKED, 1, 3, lock_key.len() + 128);
        cmd.arg(lock_key.as_str())
            .arg(TIME_TOLERANCE_MS)
            .arg(self.inner.cleanup_guard_ms)
            .arg(layout.index_prefix());
        let reply = self.eval(&scripts::IS_LOCKED, &cmd).await?;
        match reply {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            _ => Err(unexpected_reply("is_locked", &reply)),
        }
    }

    async fn lookup_once(&self, query: Lookup<'_>) -> Result<Option<LockInfo>, LockError> {
        let layout = &self.inner.layout;
        let (script, redis_key, owner): (&LuaScript, String, Option<&LockId>) = match query {
            Lookup::Key(key) => (
                &scripts::LOOKUP_KEY,
                layout.lock_key(&normalize_key(key)?)?,
                None,
            ),
            Lookup::LockId(lock_id) => (
                &scripts::LOOKUP_ID,
                layout.index_key(lock_id)?,
                Some(lock_id),
            ),
        };
        let mut cmd = evalsha(script, 1, 0, redis_key.len() + 64);
        cmd.arg(redis_key.as_str());
        let reply = self.eval(script, &cmd).await?;
        let Value::Array(items) = &reply else {
            return Err(unexpected_reply("lookup", &reply));
        };
        let (now_ms, json) = match items.as_slice() {
            [] => return Ok(None),
            [Value::Int(now), Value::BulkString(json)] => (*now, json.as_slice()),
            _ => return Err(unexpected_reply("lookup", &reply)),
        };
        let now_ms = u64::try_from(now_ms).map_err(|_| unexpected_reply("lookup", &reply))?;
        let stored: StoredLock = serde_json::from_slice(json).map_err(|error| {
            LockError::invalid_argument(
                "the data under a lock key is not SyncGuard lock JSON; another program writes \
                 under this key prefix, use a prefix of your own",
            )
            .with_source(error)
        })?;
        // ADR-003: the index may be stale; only the lock id stored in the data counts.
        if owner.is_some_and(|owner| owner.as_str() != stored.lock_id) {
            return Ok(None);
        }
        if !is_live(stored.expires_at_ms, now_ms) {
            return Ok(None);
        }
        let lock_id = match owner {
            Some(owner) => owner.clone(),
            None => LockId::parse(&stored.lock_id).map_err(|_| {
                LockError::invalid_argument(
                    "the lock data under a lock key has a malformed lockId; another program \
                     writes under this key prefix, use a prefix of your own",
                )
            })?,
        };
        let fence: Fence = stored.fence.parse()?;
        Ok(Some(LockInfo::new(
            stored.key,
            lock_id,
            stored.expires_at_ms,
            stored.acquired_at_ms,
            fence,
        )))
    }
}

/// `EVALSHA <sha> <nkeys>`, with room for the keys and arguments that follow.
fn evalsha(lua: &LuaScript, keys: usize, args: usize, data_bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + keys + args, data_bytes + 64);
    cmd.arg("EVALSHA").arg(lua.script.get_hash()).arg(keys);
    cmd
}

async fn eval_on<C: ConnectionLike>(
    conn: &mut C,
    lua: &LuaScript,
    cmd: &Cmd,
) -> Result<Value, ::redis::RedisError> {
    match cmd.query_async::<Value>(conn).await {
        Ok(value) => Ok(value),
        Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            // The script cache was emptied (SCRIPT FLUSH, restart, failover): send the same
            // call once as EVAL, which runs the script and caches it again in one round trip.
            let args = cmd.args_iter().skip(2);
            let mut eval = Cmd::with_capacity(args.len() + 2, lua.code.len() + 256);
            eval.arg("EVAL").arg(lua.code);
            for arg in args {
                if let Arg::Simple(bytes) = arg {
                    eval.arg(bytes);
                }
            }
            eval.query_async::<Value>(conn).await
        }
        Err(error) => Err(error),
    }
}

async fn load_all<C: ConnectionLike>(conn: &mut C) -> Result<(), LockError> {
    for lua in scripts::all() {
        lua.script.load_async(conn).await.map_err(map_redis_error)?;
    }
    Ok(())
}

fn not_held_reason(code: i64) -> Option<NotHeldReason> {
    match code {
        0 | -1 => Some(NotHeldReason::NotFound),
        -2 => Some(NotHeldReason::Expired),
        _ => None,
    }
}

/// The lock data JSON, as the reference writes it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredLock {
    lock_id: String,
    #[serde(deserialize_with = "millis")]
    expires_at_ms: u64,
    #[serde(deserialize_with = "millis")]
    acquired_at_ms: u64,
    key: String,
    fence: String,
}

/// A Unix millisecond timestamp: Lua's cjson writes integral numbers, possibly in float form.
fn millis<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let number = serde_json::Number::deserialize(deserializer)?;
    number
        .as_u64()
        .or_else(|| {
            number
                .as_f64()
                .filter(|f| f.fract() == 0.0 && (0.0..9.0e15).contains(f))
                .map(|f| f as u64)
        })
        .ok_or_else(|| serde::de::Error::custom("expected a Unix millisecond timestamp"))
}

impl LockBackend for RedisBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.acquire_once(key, ttl))
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        Box::pin(self.release_once(lock_id))
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(self.extend_once(lock_id, ttl))
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(self.is_locked_once(key))
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(self.lookup_once(query))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("redis", TimeAuthority::Server)
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.prefix())
            .field("mode", &self.connection_mode())
            .field("cleanup_in_is_locked", &(self.inner.cleanup_guard_ms > 0))
            .finish()
    }
}

/// Builds a [`RedisBackend`] that opens its own connections; from [`RedisBackend::builder`].
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
/// use syncguard::redis::{ConnectionMode, RedisBackend};
///
/// let pooled = RedisBackend::builder("redis://127.0.0.1:6379")
///     .mode(ConnectionMode::Pool { max_size: 32 })
///     .cleanup_in_is_locked(true)
///     .build()
///     .await?;
/// # let _ = pooled; Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisBackendBuilder {
    url: String,
    config: RedisConfig,
    mode: ConnectionMode,
    net: NetConfig,
    #[cfg(feature = "redis-tls")]
    tls_roots: Option<TlsRoots>,
}

/// PEM certificates, shown by size only in `Debug`.
#[cfg(feature = "redis-tls")]
#[derive(Clone)]
struct TlsRoots(Vec<u8>);

#[cfg(feature = "redis-tls")]
impl fmt::Debug for TlsRoots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes of PEM>", self.0.len())
    }
}

/// Makes *ring* rustls' process-wide default provider unless one is installed: redis-rs
/// builds its TLS configuration with that default, and panics when there is none, as there is
/// whenever the build holds two providers (rustls then picks neither).
#[cfg(feature = "redis-tls")]
fn install_crypto_provider() {
    // An error only says that a default (the application's, or ours) is already in place.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl RedisBackendBuilder {
    /// The key prefix (default `"syncguard"`; see [`validate_prefix`]).
    ///
    /// ```
    /// let builder = syncguard::redis::RedisBackend::builder("redis://127.0.0.1").prefix("app");
    /// # let _ = builder;
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// Opt-in cleanup of long-expired locks in `is_locked` (default off; see
    /// [`RedisConfig::cleanup_in_is_locked`]).
    ///
    /// ```
    /// let builder = syncguard::redis::RedisBackend::builder("redis://127.0.0.1")
    ///     .cleanup_in_is_locked(true);
    /// # let _ = builder;
    /// ```
    pub fn cleanup_in_is_locked(mut self, enabled: bool) -> Self {
        self.config.cleanup_in_is_locked = enabled;
        self
    }

    /// Replaces prefix and cleanup settings with `config`.
    ///
    /// ```
    /// use syncguard::redis::{RedisBackend, RedisConfig};
    /// let builder = RedisBackend::builder("redis://127.0.0.1")
    ///     .config(RedisConfig::new().with_prefix("app"));
    /// # let _ = builder;
    /// ```
    pub fn config(mut self, config: RedisConfig) -> Self {
        self.config = config;
        self
    }

    /// The connection mode (default [`ConnectionMode::Multiplexed`], the faster one).
    ///
    /// ```
    /// use syncguard::redis::{ConnectionMode, RedisBackend};
    /// let builder = RedisBackend::builder("redis://127.0.0.1")
    ///     .mode(ConnectionMode::Pool { max_size: 16 });
    /// # let _ = builder;
    /// ```
    pub fn mode(mut self, mode: ConnectionMode) -> Self {
        self.mode = mode;
        self
    }

    /// How long opening a connection may take (default 1 s).
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = syncguard::redis::RedisBackend::builder("redis://127.0.0.1")
    ///     .connection_timeout(Duration::from_secs(3));
    /// # let _ = builder;
    /// ```
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.net.connection_timeout = timeout;
        self
    }

    /// How long an operation waits for its reply before failing with `NetworkTimeout`
    /// (default 1 s; multiplexed mode only, pooled connections use redis-rs' default).
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = syncguard::redis::RedisBackend::builder("redis://127.0.0.1")
    ///     .response_timeout(Duration::from_millis(500));
    /// # let _ = builder;
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.net.response_timeout = timeout;
        self
    }

    /// How many times the multiplexed connection retries reconnecting (exponential backoff
    /// from 100 ms) before the waiting operations fail with `ServiceUnavailable` (default 2).
    ///
    /// ```
    /// let builder = syncguard::redis::RedisBackend::builder("redis://127.0.0.1")
    ///     .reconnect_retries(5);
    /// # let _ = builder;
    /// ```
    pub fn reconnect_retries(mut self, retries: usize) -> Self {
        self.net.reconnect_retries = retries;
        self
    }

    /// Trusts only the CA certificates in `pem` (one or more, PEM-encoded) for a `rediss://`
    /// URL, instead of the Mozilla root certificates: for a server whose certificate comes
    /// from a private CA. The host name is still verified. Feature `redis-tls`.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = syncguard::redis::RedisBackend::builder("rediss://redis.internal:6380")
    ///     .tls_root_certs(std::fs::read("/etc/ssl/redis-ca.pem")?)
    ///     .build()
    ///     .await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    #[cfg(feature = "redis-tls")]
    pub fn tls_root_certs(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_roots = Some(TlsRoots(pem.into()));
        self
    }

    /// The redis-rs client for the URL (and the trusted CAs, if set).
    fn client(&self) -> Result<::redis::Client, LockError> {
        #[cfg(feature = "redis-tls")]
        if let Some(TlsRoots(pem)) = &self.tls_roots {
            let certificates = ::redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            };
            return ::redis::Client::build_with_tls(self.url.as_str(), certificates).map_err(
                |error| {
                    LockError::invalid_argument(
                        "invalid Redis URL or TLS root certificates; tls_root_certs needs a \
                         rediss:// URL and PEM-encoded CA certificates",
                    )
                    .with_source(error)
                },
            );
        }
        ::redis::Client::open(self.url.as_str()).map_err(|error| {
            LockError::invalid_argument(
                "invalid Redis URL; expected redis://[user:password@]host[:port][/db] (or \
                 rediss:// with the redis-tls feature)",
            )
            .with_source(error)
        })
    }

    /// Validates the settings, connects and loads the scripts.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad prefix, URL or pool size (before any I/O); then as
    /// [`RedisBackend::connect`].
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::redis::RedisBackend::builder("redis://127.0.0.1:6379")
    ///     .build()
    ///     .await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub async fn build(self) -> Result<RedisBackend, LockError> {
        validate_prefix(&self.config.prefix)?;
        let client = self.client()?;
        #[cfg(feature = "redis-tls")]
        install_crypto_provider();
        let conn = match self.mode {
            ConnectionMode::Multiplexed => {
                let settings = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.net.connection_timeout))
                    .set_response_timeout(Some(self.net.response_timeout))
                    .set_number_of_retries(self.net.reconnect_retries);
                let manager = ConnectionManager::new_with_config(client, settings)
                    .await
                    .map_err(map_redis_error)?;
                Conn::Manager(manager)
            }
            ConnectionMode::Pool { max_size } => {
                if max_size == 0 {
                    return Err(LockError::invalid_argument(
                        "Redis pool size must be at least 1",
                    ));
                }
                // From the client's connection info, which carries the trusted CAs, if any.
                let manager = deadpool_redis::Manager::new(client.get_connection_info().clone())
                    .map_err(|error| {
                        LockError::invalid_argument("invalid Redis connection settings")
                            .with_source(error)
                    })?;
                let pool = deadpool_redis::Pool::builder(manager)
                    .max_size(max_size)
                    .runtime(deadpool_redis::Runtime::Tokio1)
                    .wait_timeout(Some(self.net.response_timeout))
                    .create_timeout(Some(self.net.connection_timeout))
                    .recycle_timeout(Some(self.net.response_timeout))
                    .build()
                    .map_err(|error| {
                        LockError::internal("could not build the Redis connection pool")
                            .with_source(error)
                    })?;
                Conn::Pool(pool)
            }
        };
        let backend = RedisBackend::with_conn(conn, &self.config)?;
        backend.load_scripts().await?;
        Ok(backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_lock_parses_cjson_numbers() {
        let json = br#"{"fence":"000000000000001","key":"a\/b","expiresAtMs":1767225600123,"lockId":"AAAAAAAAAAAAAAAAAAAAAA","acquiredAtMs":1.7672256e+12}"#;
        let stored: StoredLock = serde_json::from_slice(json).unwrap();
        assert_eq!(stored.key, "a/b");
        assert_eq!(stored.expires_at_ms, 1_767_225_600_123);
        assert_eq!(stored.acquired_at_ms, 1_767_225_600_000);
        let bad = br#"{"fence":"1","key":"k","expiresAtMs":1.5,"lockId":"x","acquiredAtMs":1}"#;
        assert!(serde_json::from_slice::<StoredLock>(bad).is_err());
    }

    #[test]
    fn scripts_are_distinct() {
        let hashes: std::collections::HashSet<_> = scripts::all()
            .iter()
            .map(|s| s.script.get_hash().to_owned())
            .collect();
        assert_eq!(hashes.len(), scripts::all().len());
    }
}
