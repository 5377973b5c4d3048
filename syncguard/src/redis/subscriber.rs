//! Waking this process's waiters when a lock is released: one subscriber connection per
//! backend, opened the first time something waits, hands every key published on the release
//! channel (`<prefix>:released`, by the batch script's release of a live lock) to the
//! backend's [`ReleaseNotifier`].
//!
//! On a Redis Cluster the subscriber follows the keys waited on, by sharded Pub/Sub (see
//! `shard_subscriber`).
//!
//! The subscription is a hint, never a condition: while the connection is down, or before its
//! `SUBSCRIBE` took effect, releases go unheard and waiters poll. So every time it subscribes
//! (the first time, and after each reconnect) the first waiter of every key tries its lock
//! once, in case the release it waits for went by meanwhile. A lost connection is opened again
//! after a pause that doubles (up to [`LONGEST_PAUSE`]) while the server stays out of reach; a
//! connection that stays silent is checked with a `PING`, so that one a partition cut silently
//! is noticed within [`CHECK_AFTER_SILENCE`] and the operation timeout.

use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ::redis::aio::{PubSubSink, PubSubStream};
use ::redis::{Client, Value};
use futures_core::Stream;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, timeout};

use super::config::{NetConfig, RedisConfig};
use super::error::map_redis_error;
#[cfg(feature = "redis-cluster")]
use super::shard_subscriber::{self, ClusterSource};
use super::subscriber_pace::{CHECK_AFTER_SILENCE, FIRST_PAUSE, LONGEST_PAUSE};
use crate::backend::ReleaseNotifier;
use crate::error::LockError;

/// A connection that lasted this long worked: the pause after its loss starts again from
/// [`FIRST_PAUSE`]. Shorter ones (a server that drops every connection at once) count as
/// failures, so that they do not make a busy loop.
const STEADY: Duration = Duration::from_secs(1);

/// The release subscription of one backend (shared by its clones): the notifier its waiters
/// queue on, and the task that feeds it. Dropped with the last clone of the backend, it stops
/// the task, which closes its connection.
pub(super) struct ReleaseSubscriber {
    notifier: ReleaseNotifier,
    channel: Box<str>,
    net: NetConfig,
    state: Mutex<State>,
}

/// Where a subscriber connects.
#[derive(Clone)]
pub(super) enum Source {
    /// One server: the client subscribes to the release channel (boxed: a client is large).
    Server(Box<Client>),
    /// A Redis Cluster: the shard channels of the keys waited on.
    #[cfg(feature = "redis-cluster")]
    Cluster(ClusterSource),
    /// The primary the Sentinels name at each (re)subscription.
    #[cfg(feature = "redis-sentinel")]
    Sentinel(std::sync::Arc<super::sentinel_conn::PrimaryFinder>),
}

impl Source {
    /// Where the subscriber of a backend on a connection of the user's connects: the server of
    /// `client`; on a `cluster` connection, the cluster of `client`'s node (its shard channels,
    /// within the timeouts of `config`).
    pub(super) fn from_client(client: Client, cluster: bool, config: &RedisConfig) -> Self {
        #[cfg(feature = "redis-cluster")]
        if cluster {
            return Source::Cluster(ClusterSource::seeded_by(&client, config));
        }
        #[cfg(not(feature = "redis-cluster"))]
        let _ = (cluster, config);
        Source::Server(Box::new(client))
    }
}

struct State {
    /// Where the subscriber connects; `None`: nowhere known, waiters poll.
    client: Option<Source>,
    /// The running task's stop signal: the task ends when this is dropped, and this is closed
    /// when the task is gone (its runtime shut down), so that another one is started.
    stop: Option<oneshot::Sender<Infallible>>,
}

/// What the subscribing task needs; nothing of it keeps the backend alive.
struct Setup {
    server: Server,
    channel: Box<str>,
    net: NetConfig,
}

/// The server one subscriber subscribes on.
enum Server {
    /// Boxed: a client is large.
    Fixed(Box<Client>),
    #[cfg(feature = "redis-sentinel")]
    Primary(std::sync::Arc<super::sentinel_conn::PrimaryFinder>),
}

impl Server {
    /// A client for it now (through Sentinel: the primary they name now).
    async fn client(&self) -> Result<Client, LockError> {
        match self {
            Server::Fixed(client) => Ok(Client::clone(client)),
            #[cfg(feature = "redis-sentinel")]
            Server::Primary(finder) => finder.primary().await,
        }
    }
}

impl ReleaseSubscriber {
    /// A subscriber to `channel`, connecting with `client` (`None`: none, waiters poll)
    /// within the timeouts of `net`.
    pub(super) fn new(channel: &str, client: Option<Source>, net: NetConfig) -> Self {
        let notifier = ReleaseNotifier::new();
        #[cfg(feature = "redis-cluster")]
        if let Some(Source::Cluster(source)) = &client {
            source.listen_to(&notifier);
        }
        Self {
            notifier,
            channel: channel.into(),
            net,
            state: Mutex::new(State { client, stop: None }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section is a check and an assignment: nothing can poison it midway.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the subscriber knows where to connect.
    pub(super) fn has_client(&self) -> bool {
        self.state().client.is_some()
    }

    /// Wakes this process's waiters of `key`, released by this backend without a publish
    /// (nobody was refused during that hold, so only waiters queued here may wait).
    pub(super) fn released_here(&self, key: &str) {
        self.notifier.released(key);
    }

    /// Whether anyone in this process waits on some key (a release's key is then worth
    /// reading back, to wake them without a publish).
    pub(super) fn has_waiters(&self) -> bool {
        self.notifier.is_watched()
    }

    /// The notifier, with the subscribing task started on the current runtime unless it runs
    /// already; `None` without a client or outside a tokio runtime (waiters then poll).
    pub(super) fn notifier(&self) -> Option<ReleaseNotifier> {
        let mut state = self.state();
        let client = state.client.as_ref()?;
        if state.stop.as_ref().is_none_or(oneshot::Sender::is_closed) {
            let runtime = tokio::runtime::Handle::try_current().ok()?;
            let (stop, stopped) = oneshot::channel();
            match client {
                Source::Server(client) => {
                    self.spawn_subscriber(runtime, stopped, Server::Fixed(client.clone()));
                }
                #[cfg(feature = "redis-sentinel")]
                Source::Sentinel(finder) => {
                    let server = Server::Primary(std::sync::Arc::clone(finder));
                    self.spawn_subscriber(runtime, stopped, server);
                }
                #[cfg(feature = "redis-cluster")]
                Source::Cluster(source) => {
                    let (source, net, notifier) = (source.clone(), self.net, self.notifier.clone());
                    runtime.spawn(async move {
                        let subscribed = shard_subscriber::keep_subscribed(&source, net, &notifier);
                        until_stopped(stopped, subscribed).await;
                    });
                }
            }
            state.stop = Some(stop);
        }
        Some(self.notifier.clone())
    }
}

impl ReleaseSubscriber {
    /// Starts the task that keeps one server's release channel subscribed on `server`.
    fn spawn_subscriber(
        &self,
        runtime: tokio::runtime::Handle,
        stopped: oneshot::Receiver<Infallible>,
        server: Server,
    ) {
        let setup = Setup {
            server,
            channel: self.channel.clone(),
            net: self.net,
        };
        let notifier = self.notifier.clone();
        runtime.spawn(async move {
            until_stopped(stopped, keep_subscribed(&setup, &notifier)).await;
        });
    }
}

/// A subscribing task: `subscribed` until `stop` is dropped. Its connections close with it
/// (dropping a redis-rs `PubSubStream` or cluster connection ends the task that drives it).
async fn until_stopped(
    stop: oneshot::Receiver<Infallible>,
    subscribed: impl Future<Output = Infallible>,
) {
    tokio::select! {
        _ = stop => {}
        never = subscribed => match never {},
    }
}

/// Subscribes, relays what it hears, and subscribes again when the connection fails.
async fn keep_subscribed(setup: &Setup, notifier: &ReleaseNotifier) -> Infallible {
    let mut pause = FIRST_PAUSE;
    let mut failures: u32 = 0;
    loop {
        match open(setup).await {
            Ok((mut sink, mut stream)) => {
                if failures > 0 {
                    tracing::info!("syncguard: subscribed to Redis lock releases again");
                }
                failures = 0;
                let opened = Instant::now();
                // Releases before the SUBSCRIBE took effect went unheard.
                notifier.missed_releases();
                let error = relay(&mut sink, &mut stream, notifier, setup).await;
                tracing::debug!(%error, "syncguard: the Redis release subscription was lost; subscribing again");
                if opened.elapsed() >= STEADY {
                    pause = FIRST_PAUSE;
                }
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(%error, "syncguard: cannot subscribe to Redis lock releases; waiters poll until it can");
                } else {
                    tracing::debug!(%error, failures, "syncguard: still cannot subscribe to Redis lock releases");
                }
            }
        }
        sleep(pause).await;
        pause = pause.saturating_mul(2).min(LONGEST_PAUSE);
    }
}

/// Opens a connection (as the backend's own: address, credentials, TLS) and subscribes to the
/// release channel, within the connect and operation timeouts.
async fn open(setup: &Setup) -> Result<(PubSubSink, PubSubStream), LockError> {
    let client = setup.server.client().await?;
    let pubsub = timeout(setup.net.connection_timeout, client.get_async_pubsub())
        .await
        .map_err(|_| {
            LockError::network_timeout("the Redis subscriber connection was not opened in time")
        })?
        .map_err(map_redis_error)?;
    let (mut sink, stream) = pubsub.split();
    timeout(setup.net.response_timeout, sink.subscribe(&*setup.channel))
        .await
        .map_err(|_| LockError::network_timeout("Redis did not confirm SUBSCRIBE in time"))?
        .map_err(map_redis_error)?;
    Ok((sink, stream))
}

/// Hands every published key to `notifier` until the connection fails; returns why it stopped.
async fn relay(
    sink: &mut PubSubSink,
    stream: &mut PubSubStream,
    notifier: &ReleaseNotifier,
    setup: &Setup,
) -> LockError {
    loop {
        // Both branches are cancel-safe: the stream is a channel of whole messages.
        let next = poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx));
        tokio::select! {
            message = next => match message {
                Some(message) => match std::str::from_utf8(message.get_payload_bytes()) {
                    Ok(key) => notifier.released(key),
                    // Not a key of ours (keys are text): somebody else publishes here.
                    Err(_) => tracing::debug!(channel = %setup.channel, "syncguard: ignored a message that is not a lock key"),
                },
                None => {
                    return LockError::service_unavailable(
                        "the Redis subscriber connection closed",
                    );
                }
            },
            () = sleep(CHECK_AFTER_SILENCE) => {
                match timeout(setup.net.response_timeout, sink.ping::<Value>()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => return map_redis_error(error),
                    Err(_) => {
                        return LockError::network_timeout(
                            "the Redis subscriber connection did not answer a PING in time",
                        );
                    }
                }
            }
        }
    }
}
