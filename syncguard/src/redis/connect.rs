//! [`RedisBackend::connect_with`]: the connections a backend opens itself, from a URL and the
//! connect-only settings of its [`RedisConfig`].

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::cluster_url::is_cluster_url;
use super::connection::Conn;
#[cfg(feature = "redis-tls")]
use super::connection::install_crypto_provider;
use super::error::{driver_error, map_redis_error, naming_database};
use super::sentinel_url::is_sentinel_url;
use super::subscriber::Source;
use super::{ConnectionMode, RedisBackend, RedisConfig};
use crate::error::LockError;
use crate::url_scheme::{UrlBackend, check_url_scheme};

/// The redis-rs client for `url` (and the trusted CAs of `config`, if set).
fn client(url: &str, config: &RedisConfig) -> Result<::redis::Client, LockError> {
    check_url_scheme(url, UrlBackend::Redis)?;
    #[cfg(feature = "redis-tls")]
    if let Some(pem) = config.tls_root_certs() {
        let certificates = ::redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        };
        return ::redis::Client::build_with_tls(url, certificates).map_err(|error| {
            LockError::invalid_argument(
                "invalid Redis URL or TLS root certificates; RedisConfig::with_tls_root_certs \
                 needs a rediss:// URL and PEM-encoded CA certificates",
            )
            .with_source(driver_error(error))
        });
    }
    #[cfg(not(feature = "redis-tls"))]
    let _ = config;
    ::redis::Client::open(url).map_err(|error| {
        LockError::invalid_argument(
            "invalid Redis URL; expected redis://[user:password@]host[:port][/db] (or \
             rediss:// with the redis-tls feature)",
        )
        .with_source(driver_error(error))
    })
}

/// Opens the connection `config` asks for with `client`.
pub(super) async fn open(
    client: &::redis::Client,
    config: &RedisConfig,
) -> Result<Conn, LockError> {
    #[cfg(feature = "redis-tls")]
    install_crypto_provider();
    match config.connection_mode() {
        ConnectionMode::Multiplexed => {
            let settings = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout()))
                .set_response_timeout(Some(config.operation_timeout()))
                .set_number_of_retries(config.reconnect_retries());
            let manager = ConnectionManager::new_with_config(client.clone(), settings)
                .await
                .map_err(map_redis_error)?;
            Ok(Conn::Manager(manager))
        }
        ConnectionMode::Pool { max_size } => {
            // From the client's connection info, which carries the trusted CAs, if any.
            let manager = deadpool_redis::Manager::new(client.get_connection_info().clone())
                .map_err(|error| {
                    LockError::invalid_argument("invalid Redis connection settings")
                        .with_source(error)
                })?;
            let pool = deadpool_redis::Pool::builder(manager)
                .max_size(max_size)
                .runtime(deadpool_redis::Runtime::Tokio1)
                .wait_timeout(Some(config.operation_timeout()))
                .create_timeout(Some(config.connect_timeout()))
                .recycle_timeout(Some(config.operation_timeout()))
                .build()
                .map_err(|error| {
                    LockError::internal("could not build the Redis connection pool")
                        .with_source(error)
                })?;
            Ok(Conn::Pool(pool))
        }
    }
}

impl RedisBackend {
    /// Connects to `url` with the default [`RedisConfig`] (prefix `"syncguard"`, one
    /// multiplexed connection) and loads the scripts, so that a wrong URL, password or ACL
    /// fails here; [`connect_with`](Self::connect_with) takes a configuration of yours.
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_with(url, RedisConfig::new()).await
    }

    /// Checks `url` (`redis://[user:password@]host[:port][/db]`, `rediss://` for TLS with the
    /// `redis-tls` feature, `redis+unix://` or `unix://` for a socket, and the `valkey`
    /// forms) and `config`, opens the connections `config` asks for, and loads the scripts, so
    /// that a wrong URL, password or ACL fails here. Returns within the connect timeout plus
    /// the operation timeout (the loading).
    ///
    /// # Errors
    /// Before any I/O, `InvalidArgument` for a URL of another scheme (naming the PostgreSQL
    /// backend for a PostgreSQL URL), a malformed URL, or a bad setting (naming it); then
    /// `InvalidArgument` for a database index the server does not have,
    /// `ServiceUnavailable` / `NetworkTimeout` when the server cannot be reached,
    /// `ServiceUnavailable` when TLS fails (the server's certificate rejected, say),
    /// `AuthFailed` for rejected credentials or permissions.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// use std::time::Duration;
    /// use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig};
    ///
    /// let config = RedisConfig::new()
    ///     .with_prefix("billing")
    ///     .with_connection_mode(ConnectionMode::Pool { max_size: 32 })
    ///     .with_operation_timeout(Duration::from_secs(2));
    /// let backend = RedisBackend::connect_with("redis://127.0.0.1:6379", config).await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub async fn connect_with(url: &str, config: RedisConfig) -> Result<Self, LockError> {
        config.validate()?;
        if is_sentinel_url(url) {
            return Box::pin(connect_sentinel(url, config)).await;
        }
        if is_cluster_url(url) {
            // Boxed: redis-rs's cluster connect future is deep enough that callers' futures
            // holding it inline overflow the compiler's query depth limit.
            return Box::pin(connect_cluster(url, config)).await;
        }
        let client = client(url, &config)?;
        let db = client.get_connection_info().redis_settings().db();
        let opened = async {
            let conn = open(&client, &config).await?;
            // The subscriber connects as the others do: same address, credentials and TLS.
            let source = Source::Server(Box::new(client.clone()));
            let backend = RedisBackend::with_conn(conn, &config, Some(source))?;
            backend.load_scripts().await?;
            Ok(backend)
        };
        within_connect_bound(&config, opened)
            .await
            .map_err(|error| naming_database(error, db))
    }
}

/// `opened`, failed with `NetworkTimeout` unless done within the connect timeout plus the
/// operation timeout (what `connect_with` promises).
async fn within_connect_bound(
    config: &RedisConfig,
    opened: impl Future<Output = Result<RedisBackend, LockError>>,
) -> Result<RedisBackend, LockError> {
    let within = config.connect_timeout() + config.operation_timeout();
    tokio::time::timeout(within, opened)
        .await
        .unwrap_or_else(|_elapsed| {
            Err(LockError::network_timeout(format!(
                "could not connect to Redis and load the scripts within the connect timeout \
                 plus the operation timeout ({within:?})"
            )))
        })
}

/// How many times the cluster connection sends a call again (after a redirection the slot map
/// did not foresee, a reconnect, `TRYAGAIN` or `CLUSTERDOWN`), and the shortest and longest
/// pause between sends, in milliseconds: retries stay well within the operation timeout, which
/// bounds them anyway.
#[cfg(feature = "redis-cluster")]
const CLUSTER_RETRIES: (u32, u64, u64) = (8, 10, 200);

/// `connect_with` for a `redis-cluster://` URL.
#[cfg(feature = "redis-cluster")]
async fn connect_cluster(url: &str, config: RedisConfig) -> Result<RedisBackend, LockError> {
    use std::sync::Arc;

    use super::cluster_url::parse_cluster_url;
    use super::keys::Layout;
    use super::shard_subscriber::{ClusterSource, MakeClient};
    use super::{RedisLayout, reference_layout_on_a_cluster, wait_for_replicas_on_a_cluster};

    let parsed = parse_cluster_url(url)?;
    if config.layout() == Some(RedisLayout::Reference) {
        return Err(reference_layout_on_a_cluster());
    }
    if config.wait_for_replicas().is_some() {
        return Err(wait_for_replicas_on_a_cluster());
    }
    if config.has_reconnect_retries() {
        return Err(LockError::invalid_argument(
            "RedisConfig::with_reconnect_retries: on a Redis Cluster each call is sent again \
             (after a reconnect or a redirection) up to 8 times within the operation timeout; \
             leave the reconnect retries out for a redis-cluster:// URL",
        ));
    }
    if matches!(config.connection_mode(), ConnectionMode::Pool { .. }) {
        return Err(LockError::invalid_argument(
            "RedisConfig::with_connection_mode: a Redis Cluster is reached through one \
             multiplexed connection per node; leave the connection mode out for a \
             redis-cluster:// URL",
        ));
    }
    // redis-rs would turn TLS on for any URL given certificates: a redis-cluster:// URL (no
    // TLS) with them is refused, as a redis:// one is.
    #[cfg(feature = "redis-tls")]
    if config.tls_root_certs().is_some() && !parsed.tls {
        return Err(LockError::invalid_argument(
            "RedisConfig::with_tls_root_certs needs a rediss-cluster:// URL (TLS); \
             redis-cluster:// connects without TLS",
        ));
    }
    #[cfg(not(feature = "redis-tls"))]
    if parsed.tls {
        return Err(LockError::invalid_argument(
            "a rediss-cluster:// URL needs syncguard's redis-tls feature",
        ));
    }
    let client = cluster_builder(&parsed.nodes, &config)
        .build()
        .map_err(|error| {
            LockError::invalid_argument(
                "invalid Redis Cluster URL or settings; expected \
                 redis-cluster://[user:password@]host:port[,host:port...]",
            )
            .with_source(driver_error(error))
        })?;
    // The first seed alone, as a single server's client (same TLS roots): to tell a rejected
    // certificate from an unreachable cluster when no seed answers.
    let first_seed = self::client(&parsed.nodes[0], &config)?;
    // The release subscriber's own cluster connection: the same nodes and settings, RESP3, its
    // pushes (the shard channels' messages) handed to it.
    let make_subscriber: Arc<MakeClient> = {
        let (nodes, config) = (parsed.nodes.clone(), config.clone());
        Arc::new(move |pushes| {
            cluster_builder(&nodes, &config)
                .use_protocol(::redis::ProtocolVersion::RESP3)
                .push_sender(pushes)
                .build()
        })
    };
    let config = match config.layout() {
        None => config.with_layout(RedisLayout::Cluster),
        Some(_) => config,
    };
    #[cfg(feature = "redis-tls")]
    install_crypto_provider();
    let subscriber = ClusterSource::new(
        make_subscriber,
        Layout::new(config.prefix(), RedisLayout::Cluster),
    );
    let opened = async {
        let cluster = match client.get_async_connection().await {
            Ok(cluster) => cluster,
            Err(error) => return Err(no_seed_reached(error, &first_seed, &config).await),
        };
        let source = Some(Source::Cluster(subscriber));
        let backend = RedisBackend::with_conn(Conn::Cluster(cluster), &config, source)?;
        backend.load_scripts().await?;
        Ok(backend)
    };
    within_connect_bound(&config, opened).await
}

/// Why a cluster connection reached none of the seed nodes. redis-rs keeps only the text of
/// the nodes' errors, so a rejected certificate would read as an unreachable server: over TLS,
/// a connection to the first seed alone (as the release subscriber makes) shows whether TLS is
/// what failed, and the error then says so, with the rustls error as its source.
#[cfg(feature = "redis-cluster")]
async fn no_seed_reached(
    error: ::redis::RedisError,
    first_seed: &::redis::Client,
    config: &RedisConfig,
) -> LockError {
    #[cfg(feature = "redis-tls")]
    if matches!(
        first_seed.get_connection_info().addr(),
        ::redis::ConnectionAddr::TcpTls { .. }
    ) {
        let settings = ::redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.connect_timeout()))
            .set_response_timeout(Some(config.operation_timeout()));
        if let Err(seed_error) = first_seed
            .get_multiplexed_async_connection_with_config(&settings)
            .await
            && crate::tls::rustls_error(&seed_error).is_some()
        {
            return map_redis_error(seed_error);
        }
    }
    #[cfg(not(feature = "redis-tls"))]
    let _ = (first_seed, config);
    map_redis_error(error)
}

/// A cluster client's settings for `nodes`: the connect and operation timeouts, the retries,
/// and the trusted CAs of `config`, if set.
#[cfg(feature = "redis-cluster")]
fn cluster_builder(
    nodes: &[String],
    config: &RedisConfig,
) -> ::redis::cluster::ClusterClientBuilder {
    let (retries, min_wait, max_wait) = CLUSTER_RETRIES;
    let builder = ::redis::cluster::ClusterClientBuilder::new(nodes.iter().map(String::as_str))
        .connection_timeout(config.connect_timeout())
        .response_timeout(config.operation_timeout())
        .retries(retries)
        .min_retry_wait(min_wait)
        .max_retry_wait(max_wait);
    #[cfg(feature = "redis-tls")]
    if let Some(pem) = config.tls_root_certs() {
        return builder.certs(::redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        });
    }
    builder
}

/// Without the `redis-cluster` feature, a cluster URL says which feature it needs.
#[cfg(not(feature = "redis-cluster"))]
async fn connect_cluster(_url: &str, _config: RedisConfig) -> Result<RedisBackend, LockError> {
    Err(LockError::invalid_argument(
        "redis-cluster:// URLs need syncguard's redis-cluster feature",
    ))
}

/// `connect_with` for a `redis+sentinel://` URL.
#[cfg(feature = "redis-sentinel")]
async fn connect_sentinel(url: &str, config: RedisConfig) -> Result<RedisBackend, LockError> {
    use std::sync::Arc;

    use ::redis::IntoConnectionInfo as _;
    use ::redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};

    use super::sentinel_conn::{PrimaryFinder, SentinelConn};
    use super::sentinel_switches;
    use super::sentinel_url::parse_sentinel_url;

    let parsed = parse_sentinel_url(url)?;
    if matches!(config.connection_mode(), ConnectionMode::Pool { .. }) {
        return Err(LockError::invalid_argument(
            "RedisConfig::with_connection_mode: through Sentinel the backend holds one \
             multiplexed connection to the primary, replaced after a failover; leave the \
             connection mode out for a redis+sentinel:// URL",
        ));
    }
    if config.has_reconnect_retries() {
        return Err(LockError::invalid_argument(
            "RedisConfig::with_reconnect_retries: through Sentinel a broken connection is \
             replaced by one to the primary the Sentinels name, never reconnected to the same \
             address; leave the reconnect retries out for a redis+sentinel:// URL",
        ));
    }
    #[cfg(feature = "redis-tls")]
    if config.tls_root_certs().is_some() {
        return Err(LockError::invalid_argument(
            "RedisConfig::with_tls_root_certs is not available with a rediss+sentinel:// URL \
             yet: the servers' certificates must chain to the Mozilla root certificates",
        ));
    }
    #[cfg(not(feature = "redis-tls"))]
    if parsed.tls {
        return Err(LockError::invalid_argument(
            "a rediss+sentinel:// URL needs syncguard's redis-tls feature",
        ));
    }
    let invalid = |error| {
        LockError::invalid_argument(
            "invalid Redis Sentinel URL; expected redis+sentinel://[user:password@]host:port\
             [,host:port...]/<master name>[/db]",
        )
        .with_source(driver_error(error))
    };
    let login = parsed
        .node_template
        .as_str()
        .into_connection_info()
        .map_err(invalid)?;
    let mut node = SentinelNodeConnectionInfo::default()
        .set_redis_connection_info(login.redis_settings().clone());
    if parsed.tls {
        node = node.set_tls_mode(::redis::TlsMode::Secure);
    }
    let listeners = parsed
        .sentinels
        .iter()
        .map(|sentinel| ::redis::Client::open(sentinel.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(invalid)?;
    let master_name = parsed.master_name.clone();
    let sentinels = Sentinel::build(parsed.sentinels).map_err(invalid)?;
    #[cfg(feature = "redis-tls")]
    install_crypto_provider();
    let finder = Arc::new(PrimaryFinder::new(
        sentinels,
        parsed.master_name,
        node,
        config.connect_timeout() + config.operation_timeout(),
    ));
    let settings = ::redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout()))
        .set_response_timeout(Some(config.operation_timeout()));
    let opened = async {
        // Half the operation timeout: a call that waited that long and was given up says the
        // primary stopped answering.
        let stall = config.operation_timeout() / 2;
        let conn = SentinelConn::connect(Arc::clone(&finder), settings, stall).await?;
        sentinel_switches::follow(
            &Arc::downgrade(&conn),
            listeners,
            &master_name,
            config.connect_timeout(),
        );
        let source = Some(Source::Sentinel(finder));
        let backend = RedisBackend::with_conn(Conn::Sentinel(conn), &config, source)?;
        backend.load_scripts().await?;
        Ok(backend)
    };
    within_connect_bound(&config, opened).await
}

/// Without the `redis-sentinel` feature, a Sentinel URL says which feature it needs.
#[cfg(not(feature = "redis-sentinel"))]
async fn connect_sentinel(_url: &str, _config: RedisConfig) -> Result<RedisBackend, LockError> {
    Err(LockError::invalid_argument(
        "redis+sentinel:// URLs need syncguard's redis-sentinel feature",
    ))
}
