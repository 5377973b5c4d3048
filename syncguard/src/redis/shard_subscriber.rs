//! Waking this process's waiters on a Redis Cluster: sharded Pub/Sub (Redis 7 and later). The
//! release of a contended lock is published with `SPUBLISH` on the lock's own shard channel,
//! `<lock key>:released`, in the lock key's slot, so only the node serving that slot sends it,
//! and only to the clients subscribed there. The subscriber follows the keys this process waits
//! on ([`KeyListener`]): the first time a key's waiter waits, it sends `SSUBSCRIBE` for the
//! key's channel (routed to the slot's node by a cluster connection of its own, RESP3, whose
//! pushes come here), and `SUNSUBSCRIBE` when the last waiter or observer of the key leaves.
//!
//! The subscription is a hint, as on one server: a release before a channel's `SSUBSCRIBE`
//! took effect goes unheard, so once it has, the key's first waiter tries its lock once. What
//! redis-rs does not handle is done here: it resubscribes after a reconnect in one `SSUBSCRIBE`
//! for every channel, which a cluster refuses once they span slots (`CROSSSLOT`), and it does
//! not notice a node whose connection dropped while no command was sent to it. So a dropped
//! node connection, a `PING` to the primaries that fails after a silence, or a channel the
//! server unsubscribed (its slot moved, its primary became a replica) makes the subscriber
//! send `SSUBSCRIBE` again for each channel concerned, each to its slot's current node (redis-rs
//! follows `MOVED` and refreshes its slot map), retried soon after a push and at doubling pauses
//! while it fails; then the first waiter of every key tries its lock. When subscribing fails
//! [`REOPEN_AFTER`] rounds in a row, the connection is dropped and a new one opened, which
//! learns the cluster afresh: after a killed primary's replica took over, redis-rs 1.2.2's
//! connection was seen to resend its own `SSUBSCRIBE` hundreds of times a second while ours
//! timed out, for 20 s and more, until it was replaced.
//!
//! Where the server refuses `SSUBSCRIBE` (before Redis 7, or an ACL), the subscriber listens
//! on the classic channel `<prefix>:released` instead, where the batch script publishes when
//! its `SPUBLISH` is refused too.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use ::redis::{PushInfo, PushKind, RedisError, RedisResult, Value};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, sleep_until, timeout};

use super::config::{NetConfig, RedisConfig, RedisLayout};
use super::error::map_redis_error;
use super::keys::Layout;
use super::subscriber_pace::{CHECK_AFTER_SILENCE, FIRST_PAUSE, LONGEST_PAUSE};
use crate::backend::{KeyListener, ReleaseNotifier};
use crate::error::LockError;

/// Makes the subscriber's cluster client (the backend's nodes, credentials, TLS and timeouts;
/// RESP3), handing every push it receives to the sender.
pub(super) type MakeClient =
    dyn Fn(UnboundedSender<PushInfo>) -> RedisResult<ClusterClient> + Send + Sync;

/// Where a cluster backend's subscriber connects, and how it names a key's channel.
#[derive(Clone)]
pub(super) struct ClusterSource {
    make_client: Arc<MakeClient>,
    layout: Arc<Layout>,
    /// Told by the notifier which keys are waited on; feeds the running task.
    listener: Arc<Interest>,
}

impl ClusterSource {
    pub(super) fn new(make_client: Arc<MakeClient>, layout: Layout) -> Self {
        Self {
            make_client,
            layout: Arc::new(layout),
            listener: Arc::default(),
        }
    }

    /// The subscriber of a backend on a cluster connection of the user's, which reaches the
    /// cluster through `client`'s node (RESP3, the timeouts of `config`).
    pub(super) fn seeded_by(client: &::redis::Client, config: &RedisConfig) -> Self {
        let (node, net) = (client.get_connection_info().clone(), config.net());
        let make_client: Arc<MakeClient> = Arc::new(move |pushes| {
            ::redis::cluster::ClusterClientBuilder::new([node.clone()])
                .connection_timeout(net.connection_timeout)
                .response_timeout(net.response_timeout)
                .use_protocol(::redis::ProtocolVersion::RESP3)
                .push_sender(pushes)
                .build()
        });
        Self::new(
            make_client,
            Layout::new(config.prefix(), RedisLayout::Cluster),
        )
    }

    /// Has `notifier` tell this source which keys are waited on.
    pub(super) fn listen_to(&self, notifier: &ReleaseNotifier) {
        notifier.set_listener(self.listener.clone());
    }
}

/// A key waited on (`true`), or no longer (`false`).
type Change = (String, bool);

/// The notifier's listener: passes each change on to the running task, if any (a task that
/// starts reads the keys waited on from the notifier).
#[derive(Default)]
struct Interest {
    task: Mutex<Option<UnboundedSender<Change>>>,
}

impl Interest {
    fn send(&self, change: Change) {
        let task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = task.as_ref() {
            // A task that is gone reads the keys afresh when the next one starts.
            let _ = task.send(change);
        }
    }
}

impl KeyListener for Interest {
    fn listen(&self, key: &str) {
        self.send((key.to_owned(), true));
    }

    fn forget(&self, key: &str) {
        self.send((key.to_owned(), false));
    }
}

/// Subscribes to the channels of the keys waited on and relays what it hears, once the
/// connection could be opened (tried again at doubling pauses until then).
pub(super) async fn keep_subscribed(
    source: &ClusterSource,
    net: NetConfig,
    notifier: &ReleaseNotifier,
) -> Infallible {
    let (changes_to_task, mut changes) = unbounded_channel();
    // First the sender, then the keys: a change in between comes twice, which is harmless.
    *source
        .listener
        .task
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Some(changes_to_task);
    let mut channels = Channels::new(&source.layout);
    for key in notifier.listened_keys() {
        channels.change(key, true);
    }
    let mut pause = FIRST_PAUSE;
    // The pause between failed rounds of SSUBSCRIBE: kept across new connections, so that a
    // node out of reach for long is not met with a new connection every other second.
    let mut round_pause = FIRST_PAUSE;
    let mut failures: u32 = 0;
    loop {
        match open(source, net).await {
            Ok((conn, pushes)) => {
                if failures > 0 {
                    tracing::info!("syncguard: connected to the Redis Cluster for lock releases");
                }
                failures = 0;
                pause = FIRST_PAUSE;
                let mut subscriber = Subscriber {
                    conn,
                    net,
                    notifier,
                    channels: &mut channels,
                    unsubscribing: JoinSet::new(),
                };
                subscriber.run(&mut changes, pushes, &mut round_pause).await;
                tracing::debug!(
                    "syncguard: subscribing to lock releases keeps failing on this Redis Cluster connection; opening a new one"
                );
                // At once: the old connection's view of the cluster was the problem.
                continue;
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(%error, "syncguard: cannot connect to the Redis Cluster for lock releases; waiters poll until it can");
                } else {
                    tracing::debug!(%error, failures, "syncguard: still cannot connect to the Redis Cluster for lock releases");
                }
            }
        }
        // Changes meanwhile wait in their channel.
        sleep(pause).await;
        pause = pause.saturating_mul(2).min(LONGEST_PAUSE);
    }
}

/// Failed rounds of `SSUBSCRIBE` in a row after which the subscriber opens a new connection.
const REOPEN_AFTER: u32 = 2;

/// Whether the server refused a command as such (unknown before Redis 7, or not permitted),
/// rather than failing to run it.
fn is_refused(error: &RedisError) -> bool {
    error.code() == Some("NOPERM")
        || error
            .detail()
            .is_some_and(|detail| detail.to_ascii_lowercase().contains("unknown command"))
}

/// Opens the subscriber's cluster connection within the connect timeout.
async fn open(
    source: &ClusterSource,
    net: NetConfig,
) -> Result<(ClusterConnection, UnboundedReceiver<PushInfo>), LockError> {
    let (pushes_to_us, pushes) = unbounded_channel();
    let client = (source.make_client)(pushes_to_us).map_err(map_redis_error)?;
    let conn = timeout(net.connection_timeout, client.get_async_connection())
        .await
        .map_err(|_| {
            LockError::network_timeout(
                "the Redis Cluster subscriber connection was not opened in time",
            )
        })?
        .map_err(map_redis_error)?;
    Ok((conn, pushes))
}

/// The shard channels wanted (those of the keys waited on), and which of them are not known to
/// be subscribed; or, where sharded Pub/Sub is refused, the classic channel.
struct Channels<'a> {
    layout: &'a Layout,
    /// Channel -> the keys waited on that publish there (one, unless two keys' tags collide).
    wanted: HashMap<String, HashSet<String>>,
    /// Channels whose `SSUBSCRIBE` (`SUBSCRIBE` for the classic one) is to be sent (again).
    unconfirmed: HashSet<String>,
    /// Whether the server refused `SSUBSCRIBE` (before Redis 7, or an ACL): the subscriber
    /// then stays subscribed to the classic channel, `<prefix>:released`, which the releases
    /// publish on where their `SPUBLISH` is refused too.
    classic: bool,
}

impl<'a> Channels<'a> {
    fn new(layout: &'a Layout) -> Self {
        Self {
            layout,
            wanted: HashMap::new(),
            unconfirmed: HashSet::new(),
            classic: false,
        }
    }

    /// From now on, the classic channel only.
    fn go_classic(&mut self) {
        self.classic = true;
        self.unconfirmed.clear();
        self.unconfirmed
            .insert(self.layout.release_channel().to_owned());
    }

    /// `<lock key>:released`: the shard channel of a key, in its lock key's slot.
    fn channel_of(&self, key: &str) -> Option<String> {
        self.layout
            .lock_key(key)
            .ok()
            .map(|lock_key| lock_key + ":released")
    }

    /// Applies a change; the channel to `SUNSUBSCRIBE` when its last key left.
    fn change(&mut self, key: String, listen: bool) -> Option<String> {
        let channel = self.channel_of(&key)?;
        if listen {
            let keys = self.wanted.entry(channel.clone()).or_default();
            if keys.is_empty() && !self.classic {
                self.unconfirmed.insert(channel);
            }
            keys.insert(key);
            return None;
        }
        let keys = self.wanted.get_mut(&channel)?;
        keys.remove(&key);
        if !keys.is_empty() {
            return None;
        }
        self.wanted.remove(&channel);
        self.unconfirmed.remove(&channel);
        (!self.classic).then_some(channel)
    }

    /// Every wanted channel (the classic one) is to be subscribed again.
    fn all_unconfirmed(&mut self) {
        if self.classic {
            self.unconfirmed
                .insert(self.layout.release_channel().to_owned());
        } else {
            self.unconfirmed.extend(self.wanted.keys().cloned());
        }
    }
}

/// One connection's subscriber.
struct Subscriber<'a, 'b> {
    conn: ClusterConnection,
    net: NetConfig,
    notifier: &'a ReleaseNotifier,
    channels: &'a mut Channels<'b>,
    /// The `SUNSUBSCRIBE`s under way (ended with the subscriber).
    unsubscribing: JoinSet<()>,
}

impl Subscriber<'_, '_> {
    /// Subscribes and relays until subscribing has failed [`REOPEN_AFTER`] rounds in a row:
    /// a sign that this connection's view of the cluster is stuck (it happens after a node was
    /// killed and a replica promoted), so the caller opens a new one. Failed rounds are tried
    /// again after `pause`, which doubles with each failure and starts over on a success.
    async fn run(
        &mut self,
        changes: &mut UnboundedReceiver<Change>,
        mut pushes: UnboundedReceiver<PushInfo>,
        pause: &mut Duration,
    ) {
        // Every channel wanted before this connection: subscribed now, and releases meanwhile
        // may have gone unheard.
        self.channels.all_unconfirmed();
        let mut missed = true;
        let mut retry_at = Some(Instant::now());
        let mut failed_rounds = 0;
        let mut silent_since = Instant::now();
        loop {
            let retry = async {
                match retry_at {
                    Some(at) => sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some((key, listen)) = changes.recv() => {
                    let mut unsubscribe = Vec::new();
                    let mut next = Some((key, listen));
                    while let Some((key, listen)) = next.take() {
                        unsubscribe.extend(self.channels.change(key, listen));
                        next = changes.try_recv().ok();
                    }
                    for channel in unsubscribe {
                        self.unsubscribe(channel);
                    }
                    if !self.channels.unconfirmed.is_empty() && retry_at.is_none() {
                        retry_at = Some(Instant::now());
                    }
                }
                Some(push) = pushes.recv() => {
                    silent_since = Instant::now();
                    if self.heard(push) {
                        missed = true;
                        // Soon (not later than a pause already under way), after a moment for
                        // the cluster to settle (a failover, a slot moving).
                        let soon = Instant::now() + FIRST_PAUSE;
                        retry_at = Some(retry_at.map_or(soon, |at| at.min(soon)));
                    }
                }
                () = retry => {
                    if self.subscribe_unconfirmed(missed).await {
                        missed = false;
                        retry_at = None;
                        *pause = FIRST_PAUSE;
                        failed_rounds = 0;
                    } else {
                        failed_rounds += 1;
                        if failed_rounds >= REOPEN_AFTER {
                            return;
                        }
                        // A node out of reach (failing over, say): again after a pause.
                        missed = true;
                        retry_at = Some(Instant::now() + *pause);
                        *pause = pause.saturating_mul(2).min(LONGEST_PAUSE);
                    }
                }
                Some(_) = self.unsubscribing.join_next() => {}
                () = sleep_until(silent_since + CHECK_AFTER_SILENCE) => {
                    silent_since = Instant::now();
                    if !self.channels.wanted.is_empty() && !self.primaries_answer().await {
                        self.channels.all_unconfirmed();
                        missed = true;
                        retry_at.get_or_insert_with(Instant::now);
                    }
                }
            }
        }
    }

    /// Handles a push; whether channels are to be subscribed again.
    fn heard(&mut self, push: PushInfo) -> bool {
        match (push.kind, push.data.as_slice()) {
            (PushKind::SMessage | PushKind::Message, [_channel, Value::BulkString(key)]) => {
                match std::str::from_utf8(key) {
                    Ok(key) => self.notifier.released(key),
                    Err(_) => {
                        tracing::debug!("syncguard: ignored a message that is not a lock key")
                    }
                }
                false
            }
            // A node connection dropped: which one is not said.
            (PushKind::Disconnection, _) => {
                self.channels.all_unconfirmed();
                !self.channels.unconfirmed.is_empty()
            }
            // The server unsubscribed a channel still wanted: its slot moved, or its node is a
            // replica now. (Our own SUNSUBSCRIBE's confirmation names a channel not wanted.)
            (PushKind::SUnsubscribe, [Value::BulkString(channel), ..])
                if !self.channels.classic =>
            {
                match std::str::from_utf8(channel) {
                    Ok(channel) if self.channels.wanted.contains_key(channel) => {
                        self.channels.unconfirmed.insert(channel.to_owned())
                    }
                    _ => false,
                }
            }
            (PushKind::Unsubscribe, _) if self.channels.classic => {
                self.channels.all_unconfirmed();
                true
            }
            _ => false,
        }
    }

    /// Sends `SSUBSCRIBE` for every unconfirmed channel, all at once (so that a node out of
    /// reach holds the round up for one operation timeout, however many channels it serves);
    /// whether all took effect. The first waiter of each key of a channel that took effect
    /// tries its lock, in case its release went by before (every key's, when releases may
    /// have been `missed` on every channel).
    async fn subscribe_unconfirmed(&mut self, missed: bool) -> bool {
        loop {
            let classic = self.channels.classic;
            let mut round = JoinSet::new();
            for channel in &self.channels.unconfirmed {
                let (mut conn, channel) = (self.conn.clone(), channel.clone());
                let within = self.net.response_timeout;
                round.spawn(async move {
                    let subscribed = if classic {
                        timeout(within, conn.subscribe(&channel)).await
                    } else {
                        timeout(within, conn.ssubscribe(&channel)).await
                    };
                    (channel, subscribed)
                });
            }
            let mut all = true;
            let mut refused = false;
            while let Some(done) = round.join_next().await {
                let Ok((channel, subscribed)) = done else {
                    all = false;
                    continue;
                };
                match subscribed {
                    Ok(Ok(())) => {
                        self.channels.unconfirmed.remove(&channel);
                        if !missed && let Some(keys) = self.channels.wanted.get(&channel) {
                            for key in keys {
                                self.notifier.released(key);
                            }
                        }
                    }
                    Ok(Err(error)) if !classic && is_refused(&error) => refused = true,
                    Ok(Err(error)) => {
                        all = false;
                        tracing::debug!(%error, "syncguard: subscribing to lock releases failed; waiters poll until it works");
                    }
                    Err(_) => {
                        all = false;
                        tracing::debug!(
                            "syncguard: subscribing to lock releases was not confirmed in time"
                        );
                    }
                }
            }
            if refused {
                tracing::warn!(
                    "syncguard: the Redis Cluster refuses SSUBSCRIBE (before Redis 7, or an ACL); \
                     listening for lock releases on the classic channel instead"
                );
                self.channels.go_classic();
                continue;
            }
            if missed || classic {
                self.notifier.missed_releases();
            }
            return all;
        }
    }

    /// Sends `SUNSUBSCRIBE` for `channel` without waiting for it. A failure leaves a channel
    /// nobody here listens to: its messages wake nobody. (A later `SSUBSCRIBE` of the channel
    /// that the server runs first is undone, and the server's unsubscribe push then has it
    /// subscribed again.)
    fn unsubscribe(&mut self, channel: String) {
        let (mut conn, within) = (self.conn.clone(), self.net.response_timeout);
        self.unsubscribing.spawn(async move {
            let _ = timeout(within, conn.sunsubscribe(&channel)).await;
        });
    }

    /// Whether every primary answers a `PING` within the operation timeout.
    async fn primaries_answer(&mut self) -> bool {
        let primaries = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllMasters,
            Some(ResponsePolicy::AllSucceeded),
        ));
        let ping = self.conn.route_command(::redis::cmd("PING"), primaries);
        matches!(timeout(self.net.response_timeout, ping).await, Ok(Ok(_)))
    }
}
