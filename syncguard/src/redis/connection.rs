//! The connection a backend runs its scripts on: one multiplexed `ConnectionManager`, a
//! deadpool-redis pool, a cluster connection (feature `redis-cluster`), or the primary the
//! Sentinels name (feature `redis-sentinel`, see `sentinel_conn`); script calls by
//! EVALSHA, with the EVAL fallback after a NOSCRIPT, and the batch by `batch_function`.

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

use super::batch_function::BatchFunction;
use super::error::{self, map_pool_error, map_redis_error};
use super::scripts::{self, LuaScript};
use crate::error::LockError;

/// How a backend reaches Redis: the connection it was built with.
#[derive(Clone)]
pub(super) enum Conn {
    Manager(ConnectionManager),
    Pool(deadpool_redis::Pool),
    /// Routes each call by its first key, and follows `MOVED` and `ASK` itself.
    #[cfg(feature = "redis-cluster")]
    Cluster(::redis::cluster_async::ClusterConnection),
    /// Follows the Sentinels' primary; only from a `redis+sentinel://` URL.
    #[cfg(feature = "redis-sentinel")]
    Sentinel(std::sync::Arc<super::sentinel_conn::SentinelConn>),
}

impl Conn {
    /// Whether this is a cluster connection: every call's keys must then be in one slot.
    pub(super) fn is_cluster(&self) -> bool {
        #[cfg(feature = "redis-cluster")]
        if matches!(self, Conn::Cluster(_)) {
            return true;
        }
        false
    }

    /// The cluster connection, on a cluster.
    #[cfg(feature = "redis-cluster")]
    pub(super) fn cluster(&self) -> Option<&::redis::cluster_async::ClusterConnection> {
        match self {
            Conn::Cluster(cluster) => Some(cluster),
            _ => None,
        }
    }
}

/// A connection of yours for [`RedisBackend::new`](super::RedisBackend::new): a redis-rs
/// [`ConnectionManager`] (multiplexed, auto-reconnecting), a deadpool-redis pool, or (feature
/// `redis-cluster`) a redis-rs cluster connection, each turned into one by `From` (so `new`
/// takes any as it is), and optionally the [`redis::Client`](::redis::Client) the release
/// subscriber connects with.
///
/// Neither a manager nor a pool tells where it connects, so without
/// [`with_release_client`](Self::with_release_client) the backend cannot subscribe to
/// releases, and its waiters poll (see [waiting](super#waiting)).
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use syncguard::redis::{RedisBackend, RedisConfig, RedisConnection, redis};
///
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let manager = redis::aio::ConnectionManager::new(client.clone()).await?;
/// let connection = RedisConnection::from(manager).with_release_client(client);
/// let backend = RedisBackend::new(connection, RedisConfig::new())?;
/// # let _ = backend; Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisConnection {
    pub(super) conn: Conn,
    pub(super) release_client: Option<::redis::Client>,
}

impl RedisConnection {
    /// The client the release subscriber connects with: it should reach the same server,
    /// with the same credentials, as the connection (on a cluster connection, any node of the
    /// cluster: the subscriber learns the others from it). The subscriber's connection opens the
    /// first time something waits, within the configuration's connect and operation
    /// timeouts. With [release notifications](super::RedisConfig::with_release_notifications)
    /// off, nothing subscribes.
    #[must_use]
    pub fn with_release_client(mut self, client: ::redis::Client) -> Self {
        self.release_client = Some(client);
        self
    }
}

impl From<ConnectionManager> for RedisConnection {
    fn from(manager: ConnectionManager) -> Self {
        Self {
            conn: Conn::Manager(manager),
            release_client: None,
        }
    }
}

impl From<deadpool_redis::Pool> for RedisConnection {
    fn from(pool: deadpool_redis::Pool) -> Self {
        Self {
            conn: Conn::Pool(pool),
            release_client: None,
        }
    }
}

/// A cluster connection: the backend uses the [cluster layout](super::RedisLayout::Cluster).
#[cfg(feature = "redis-cluster")]
impl From<::redis::cluster_async::ClusterConnection> for RedisConnection {
    fn from(cluster: ::redis::cluster_async::ClusterConnection) -> Self {
        Self {
            conn: Conn::Cluster(cluster),
            release_client: None,
        }
    }
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Addresses and credentials are left out.
        let kind = match &self.conn {
            Conn::Manager(_) => "ConnectionManager",
            Conn::Pool(_) => "deadpool_redis::Pool",
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(_) => "ClusterConnection",
            #[cfg(feature = "redis-sentinel")]
            Conn::Sentinel(_) => "Sentinel",
        };
        f.debug_struct("RedisConnection")
            .field("conn", &kind)
            .field("release_client", &self.release_client.is_some())
            .finish()
    }
}

/// Why a script call failed: the command, or (pool mode) getting a connection.
pub(super) enum ConnError {
    Redis(::redis::RedisError),
    Pool(deadpool_redis::PoolError),
}

impl ConnError {
    pub(super) fn into_lock_error(self) -> LockError {
        match self {
            ConnError::Redis(error) => map_redis_error(error),
            ConnError::Pool(error) => map_pool_error(error),
        }
    }

    /// [`into_lock_error`](Self::into_lock_error) for an error shared by several callers.
    pub(super) fn to_lock_error(&self) -> LockError {
        match self {
            ConnError::Redis(error) => map_redis_error(error.clone()),
            ConnError::Pool(error) => error::pool_error(error),
        }
    }
}

/// What a command runs: a script, or the batch (a function or a script).
#[derive(Clone, Copy)]
enum Runs<'a> {
    Script(&'a LuaScript),
    Batch(&'a BatchFunction),
}

impl Conn {
    /// Runs one script command on a connection of this mode, reloading the script once on
    /// NOSCRIPT.
    pub(super) async fn eval(&self, lua: &LuaScript, cmd: &Cmd) -> Result<Value, ConnError> {
        self.run(Runs::Script(lua), cmd).await
    }

    /// Runs one batch call, made by [`BatchFunction::command`].
    pub(super) async fn batch(
        &self,
        function: &BatchFunction,
        cmd: &Cmd,
    ) -> Result<Value, ConnError> {
        self.run(Runs::Batch(function), cmd).await
    }

    /// Runs one batch call, made by [`BatchFunction::command`], with `then` right behind it on
    /// the same connection (one pipeline, see `replica_wait`); the call's reply and `then`'s.
    /// One server only: a cluster's calls go to several nodes.
    pub(super) async fn batch_then(
        &self,
        function: &BatchFunction,
        cmd: &Cmd,
        then: &Cmd,
    ) -> Result<(Value, Value), ConnError> {
        async fn on<C: ConnectionLike + Send>(
            conn: C,
            function: &BatchFunction,
            cmd: &Cmd,
            then: &Cmd,
        ) -> Result<(Value, Value), ::redis::RedisError> {
            let mut followed = Followed::new(conn, then);
            let reply = function.run(&mut followed, cmd).await?;
            Ok((reply, followed.last_then()?))
        }
        match self {
            Conn::Manager(manager) => on(manager.clone(), function, cmd, then).await,
            Conn::Pool(pool) => {
                let pooled = pool.get().await.map_err(ConnError::Pool)?;
                on(pooled, function, cmd, then).await
            }
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(_) => Err(::redis::RedisError::from((
                ::redis::ErrorKind::Client,
                "a command followed by another on one connection is for one server only",
            ))),
            #[cfg(feature = "redis-sentinel")]
            Conn::Sentinel(sentinel) => sentinel.call(|conn| on(conn, function, cmd, then)).await,
        }
        .map_err(ConnError::Redis)
    }

    /// Runs one batch call that declares no key (a node call) on the primary that serves
    /// `slot`, as the cluster connection knows it: redirected by nothing (there is no key to
    /// redirect), it runs there, and the node refuses in the call the keys it does not serve.
    #[cfg(feature = "redis-cluster")]
    pub(super) async fn batch_on_primary_of(
        &self,
        slot: u16,
        function: &BatchFunction,
        cmd: &Cmd,
    ) -> Result<Value, ConnError> {
        match self {
            Conn::Cluster(cluster) => {
                let mut primary = PrimaryOf {
                    cluster: cluster.clone(),
                    slot,
                };
                run_on(&mut primary, Runs::Batch(function), cmd)
                    .await
                    .map_err(ConnError::Redis)
            }
            _ => self.batch(function, cmd).await,
        }
    }

    async fn run(&self, runs: Runs<'_>, cmd: &Cmd) -> Result<Value, ConnError> {
        match self {
            Conn::Manager(manager) => run_on(&mut manager.clone(), runs, cmd).await,
            Conn::Pool(pool) => {
                let mut pooled = pool.get().await.map_err(ConnError::Pool)?;
                run_on(&mut pooled, runs, cmd).await
            }
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(cluster) => run_on(&mut cluster.clone(), runs, cmd).await,
            #[cfg(feature = "redis-sentinel")]
            Conn::Sentinel(sentinel) => {
                sentinel
                    .call(|mut conn| async move { run_on(&mut conn, runs, cmd).await })
                    .await
            }
        }
        .map_err(ConnError::Redis)
    }
}

/// A cluster connection that sends each command to the primary of one slot, whatever keys
/// the command names (a node call names none).
#[cfg(feature = "redis-cluster")]
struct PrimaryOf {
    cluster: ::redis::cluster_async::ClusterConnection,
    slot: u16,
}

#[cfg(feature = "redis-cluster")]
impl ConnectionLike for PrimaryOf {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> ::redis::RedisFuture<'a, Value> {
        use ::redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let primary = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
            self.slot,
            SlotAddr::Master,
        )));
        Box::pin(self.cluster.route_command(cmd.clone(), primary))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisFuture<'a, Vec<Value>> {
        self.cluster.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        0
    }
}

async fn run_on<C: ConnectionLike>(
    conn: &mut C,
    runs: Runs<'_>,
    cmd: &Cmd,
) -> Result<Value, ::redis::RedisError> {
    match runs {
        Runs::Script(lua) => lua.run_on(conn, cmd).await,
        Runs::Batch(function) => function.run(conn, cmd).await,
    }
}

impl Conn {
    /// Loads every script, and the batch library unless the server or user cannot have it.
    /// On a cluster, on every primary (`FUNCTION LOAD` goes to all of them by itself): the
    /// calls run there, and a replica promoted later has the library (functions replicate)
    /// or has its scripts sent again by the NOSCRIPT fallback.
    pub(super) async fn load_all(&self, function: &BatchFunction) -> Result<(), LockError> {
        match self {
            Conn::Manager(manager) => load_on(&mut manager.clone(), function)
                .await
                .map_err(map_redis_error),
            Conn::Pool(pool) => load_on(&mut pool.get().await.map_err(map_pool_error)?, function)
                .await
                .map_err(map_redis_error),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(cluster) => {
                use ::redis::cluster_routing::{
                    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo,
                };
                let mut cluster = cluster.clone();
                for lua in scripts::all() {
                    let mut load = ::redis::cmd("SCRIPT");
                    load.arg("LOAD").arg(lua.code);
                    let primaries = RoutingInfo::MultiNode((
                        MultipleNodeRoutingInfo::AllMasters,
                        Some(ResponsePolicy::AllSucceeded),
                    ));
                    cluster
                        .route_command(load, primaries)
                        .await
                        .map_err(map_redis_error)?;
                }
                function.load(&mut cluster).await.map_err(map_redis_error)
            }
            #[cfg(feature = "redis-sentinel")]
            Conn::Sentinel(sentinel) => sentinel
                .call(|mut conn| async move { load_on(&mut conn, function).await })
                .await
                .map_err(map_redis_error),
        }
    }
}

async fn load_on<C: ConnectionLike>(
    conn: &mut C,
    function: &BatchFunction,
) -> Result<(), ::redis::RedisError> {
    for lua in scripts::all() {
        lua.script.load_async(conn).await?;
    }
    function.load(conn).await
}

/// Makes *ring* rustls' process-wide default provider unless one is installed: redis-rs
/// builds its TLS configuration with that default, and panics when there is none, as there is
/// whenever the build holds two providers (rustls then picks neither).
#[cfg(feature = "redis-tls")]
pub(super) fn install_crypto_provider() {
    // An error only says that a default (the application's, or ours) is already in place.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A connection that sends every command with `then` right behind it, in one pipeline, and
/// keeps `then`'s latest reply: the batch call's function and script fallbacks (a library
/// loaded again, an EVAL after NOSCRIPT) run through it unchanged, and the reply kept is that
/// of the last command sent, the call itself.
struct Followed<'a, C> {
    inner: C,
    then: &'a Cmd,
    last: Option<Value>,
}

impl<'a, C: ConnectionLike> Followed<'a, C> {
    fn new(inner: C, then: &'a Cmd) -> Self {
        Self {
            inner,
            then,
            last: None,
        }
    }

    /// The reply of `then` after the last command.
    fn last_then(self) -> Result<Value, RedisError> {
        self.last
            .ok_or_else(|| RedisError::from((ErrorKind::Client, "no command was sent")))
            .and_then(Value::extract_error)
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for Followed<'_, C> {
    fn req_packed_command<'b>(&'b mut self, cmd: &'b Cmd) -> RedisFuture<'b, Value> {
        Box::pin(async move {
            let mut pipeline = Pipeline::with_capacity(2);
            pipeline
                .add_command(cmd.clone())
                .add_command(self.then.clone());
            let mut replies = self.inner.req_packed_commands(&pipeline, 0, 2).await?;
            let (Some(then), Some(reply)) = (replies.pop(), replies.pop()) else {
                return Err(RedisError::from((
                    ErrorKind::Client,
                    "a pipeline of two commands came back with fewer replies",
                )));
            };
            self.last = Some(then);
            reply.extract_error()
        })
    }

    fn req_packed_commands<'b>(
        &'b mut self,
        pipeline: &'b Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'b, Vec<Value>> {
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}
