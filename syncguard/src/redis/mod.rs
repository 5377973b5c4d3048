//! The Redis backend (feature `redis`): Lua scripts run by EVALSHA, and on Redis 7 and later
//! the acquire/release/extend script as a Redis function (`FCALL`), over a multiplexed
//! auto-reconnecting connection (the default) or a deadpool-redis pool.
//!
//! The server's clock (`TIME`) decides expiry; fences come from `INCR`. After a `SCRIPT FLUSH`
//! or a restart, a call is sent once more as EVAL, which caches its script again. The function
//! library (`syncguard_<hash>`, loaded with `FUNCTION LOAD`) saves the server the script's
//! set-up on every call; a call that finds it missing (`FUNCTION FLUSH`, a failover) loads it
//! again, and a server without functions (Redis 6) or a user not permitted them gets the same
//! script by EVALSHA. A function is refused whole over `maxmemory`, so such a call goes by
//! EVALSHA too, where a release still frees its lock. A library of an earlier syncguard
//! version (a few kilobytes) stays on the server until deleted (`FUNCTION DELETE`). The acquire,
//! release and extend calls waiting at the same moment run in one script call (up to 64 of
//! them, up to 2 such calls awaiting replies), each exactly as it would run alone: a lone
//! caller pays one round trip, many callers share a few. A call that meets bad data fails
//! alone, having changed nothing. Waiters wake when a lock is released, through Redis Pub/Sub
//! (see [waiting](#waiting)).
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
//! use syncguard::redis::RedisBackend;
//! use syncguard::LockOptions;
//!
//! let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
//! let guard = syncguard::acquire(&backend, "job:42", &LockOptions::default()).await?;
//! println!("fence {}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Making a backend
//!
//! As every network backend's:
//!
//! - [`RedisBackend::connect(url)`](RedisBackend::connect): the default configuration;
//! - [`RedisBackend::connect_with(url, config)`](RedisBackend::connect_with): every other
//!   setting is in the [`RedisConfig`];
//! - [`RedisBackend::new(connection, config)`](RedisBackend::new): on a connection of yours,
//!   a redis-rs `ConnectionManager` or a deadpool-redis pool ([`RedisConnection`]).
//!
//! The URL says where the backend connects: `redis://`, `rediss://` (TLS), `redis+unix://` /
//! `unix://` (a socket), their `valkey` forms, a cluster's nodes
//! (`redis-cluster://host:port,host:port`, see [Redis Cluster](#redis-cluster)), or the
//! Sentinels that name a primary (`redis+sentinel://host:port,host:port/<name>`, see [Redis
//! Sentinel](#redis-sentinel)); any other scheme is
//! [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) at once (a PostgreSQL URL names the PostgreSQL backend).
//! The [`redis`] and [`deadpool_redis`] crates syncguard is built with are re-exported here,
//! so that a connection of yours is of the same versions:
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use syncguard::redis::{RedisBackend, RedisConfig, deadpool_redis};
//!
//! let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
//!     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
//! let backend = RedisBackend::new(pool, RedisConfig::new().with_prefix("app"))?;
//! # let _ = backend; Ok(()) }
//! ```
//!
//! ## Storage layout and compatibility
//!
//! Two layouts ([`RedisConfig::with_layout`]): the reference layout, the default on one
//! server, and the [cluster layout](#the-cluster-layout), required on a cluster and an opt-in
//! on one server.
//!
//! In the reference layout, storage follows the reference design's Redis layout, so a Rust
//! and a TypeScript SyncGuard service sharing a Redis and a prefix exclude each other:
//!
//! | what | Redis key | value | TTL |
//! |---|---|---|---|
//! | lock | `make_storage_key(prefix, key, 1000, 26)`, e.g. `syncguard:job:42` | JSON `{lockId, expiresAtMs, acquiredAtMs, key, fence}`, plus `holder` for a lock taken with `acquire_as`, `"unclaimed":true` after the expiry for a lock taken with `acquire_as` until a re-entry or an extend uses its lock id, and `"contended":true` last once an acquire was refused on it | ttl + 1 s |
//! | index | `make_storage_key(prefix, "id:" + lockId, 1000, 26)`, e.g. `syncguard:id:<22 chars>` | the lock key | same as the lock |
//! | fence | [`make_fence_key`](crate::backend::key::make_fence_key)`(prefix, lock key, 1000, 26)`, e.g. `syncguard:fence:syncguard:job:42` | `INCR` counter | none, never deleted |
//!
//! Every key is stored where the reference stores it, with the same JSON (byte for byte) and
//! the same fence counter; the scripts are this library's own, batched, and report the
//! reference's outcomes. The differences, all deliberate:
//!
//! - **Reserved keys.** A user key that starts with `id:` or `fence:`, or that is exactly 22
//!   base64url characters encoding 16 bytes (the shape of a hashed storage key), is stored under
//!   the hashed form `prefix:<base64url(sha256("prefix:key")[..16])>`, where the reference puts
//!   keys too long for the budget. With the reference layout such keys would land on another
//!   key's fence counter (`fence:syncguard:x`), on an index key (`id:<lock id>`) or on a hashed
//!   key. This is the one place where Rust and TypeScript store a key differently: such keys do
//!   not exclude each other across the two languages.
//! - **TTL.** Both keys are written with `PX` = ttl + [`TIME_TOLERANCE_MS`], so a lock stays
//!   visible for the tolerance window in which the liveness predicate still counts it as held
//!   (the reference's `PX` = ttl lets Redis drop the key at its expiry, before the tolerance
//!   ends). Expiry itself is the stored `expiresAtMs`, as in the reference.
//! - **Prefixes** are validated ([`validate_prefix`]); a stale index left by a dead lock is
//!   removed only when it still points at the key being taken.
//! - **The contended mark.** An acquire refused on a live lock (with release notifications on)
//!   adds `,"contended":true` at the end of its JSON, once per hold and keeping its TTL, so
//!   that its release publishes (see [waiting](#waiting)). The reference reads the fields it
//!   knows and its `cjson` extend keeps the others.
//!
//! Keys holding code points unassigned in one side's Unicode version can also be stored under
//! two names: see [`key`](crate::backend::key#unicode-the-limit-of-the-compatibility-promise).
//!
//! [`TIME_TOLERANCE_MS`]: crate::backend::time::TIME_TOLERANCE_MS
//!
//! ### The cluster layout
//!
//! [`RedisLayout::Cluster`] puts every key of a lock in one hash slot and needs no index:
//!
//! | what | Redis key | value | TTL |
//! |---|---|---|---|
//! | lock | `<prefix>:{<tag>}`, e.g. `syncguard:{q3Tz0v_J9aA}`, where the tag is the base64url text of the first 8 bytes of `sha256("<prefix>:<key>")` | the reference's JSON, as above | ttl + 1 s |
//! | fence | `<prefix>:{<tag>}:fence` | `INCR` counter | none, never deleted |
//!
//! A lock id of this layout starts with the same 8 bytes (its other 8 are random), so the lock
//! id alone names the lock's Redis key, on any node: release, extend and lookup by lock id
//! read one key, without an index, from any process. An acquire writes two keys instead of
//! three and a release deletes one instead of two (see BENCHMARKS.md for what that saves the
//! server). Every key is a fixed-length tag, so no key is reserved or hashed for length. Two
//! keys share a lock only if their hashes agree in 64 bits: they then exclude each other
//! (never two holders), with a chance of about 3 in 10^8 for a million keys held at once.
//!
//! The cluster layout is **not shared with the reference's TypeScript services**: they store
//! the same key at `<prefix>:<key>`, so a Rust service in the cluster layout and a TypeScript
//! service do not exclude each other. The reference's layout cannot run on a cluster (its
//! three keys are in three slots, and its scripts derive keys they do not declare), which is
//! why the cluster layout exists. Use it on one server when no TypeScript service shares the
//! locks, or to move to a cluster later with the same keys.
//!
//! ## Redis Cluster
//!
//! With the `redis-cluster` feature, a `redis-cluster://[user:password@]host:port[,host:port...]`
//! URL (`rediss-cluster://` with `redis-tls`) connects to a Redis Cluster through redis-rs's
//! cluster connection, which learns the slot map from any of the nodes listed, keeps one
//! multiplexed connection per node, and follows `MOVED` and `ASK` redirections itself. The
//! backend uses the [cluster layout](#the-cluster-layout) (the reference layout is refused),
//! so every operation runs on the node that serves its key:
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
//! use syncguard::redis::RedisBackend;
//!
//! let backend = RedisBackend::connect("redis-cluster://10.0.0.1:6379,10.0.0.2:6379").await?;
//! let guard = syncguard::acquire(&backend, "job:42", &syncguard::LockOptions::default()).await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! A cluster connection of yours (`redis::cluster_async::ClusterConnection`) goes to
//! [`RedisBackend::new`] as it is. Over TLS (`rediss-cluster://`, feature `redis-tls`) the
//! nodes must announce their TLS ports to clients (`tls-port` with `tls-cluster yes`);
//! `RedisConfig::with_tls_root_certs` then covers every node and the release subscriber, and
//! is refused with a plain `redis-cluster://` URL.
//!
//! - **Batching.** Calls made at the same moment are batched per primary: one call to each
//!   node that serves some of their locks, all sent at once, as one server gets one call. The
//!   backend keeps a map of slots to primaries (`CLUSTER SLOTS`, read again when a node turns
//!   out not to serve a slot); the call declares no key and goes to the primary of its first
//!   lock's slot, and the function (registered with `allow-cross-slot-keys`) reaches the
//!   other slots of that node. An operation its node does not serve (a stale map, a slot
//!   being migrated, a node demoted to replica) runs nothing there and is sent again at once in
//!   a call of its own that declares its keys, all in one slot, which redis-rs routes and
//!   redirects. While a slot is being migrated, a new lock of that slot (its two keys absent
//!   from both nodes) is refused with a retryable error (`TRYAGAIN`) until the migration ends.
//! - **Redirections and retries.** A call redirected (a slot moved, a replica promoted) or cut
//!   by a dropped connection is sent again by redis-rs, up to 8 times, within the operation
//!   timeout. An acquire run twice that way is answered "acquired" (the script recognizes its
//!   own lock id); a release run twice is answered "not held" the second time, so the guard
//!   reports the lock lost although it was released: early, never late.
//! - **Scripts.** The function library is loaded on every primary when the backend connects
//!   and again, on all of them, when a call finds it missing (a new primary that was never a
//!   replica); functions replicate, so a promoted replica has it. The lookup scripts go by
//!   EVALSHA and are sent again as EVAL after a `NOSCRIPT`.
//! - **Failover.** Redis replicates asynchronously: a lock granted by a primary that dies
//!   before the grant reached its replica is gone after the replica takes over, and another
//!   client may take it while the first still believes it holds it (until its next extend,
//!   which then reports the loss), and the fence counter may hand out the lost grant's fence
//!   a second time. A grant that reached the replica survives with its fence, and fences go on
//!   increasing from it. Waiting for replicas before answering (`WAIT`, see [replicas and
//!   failover](#replicas-and-failover)) is not available on a cluster yet; until then, run a
//!   cluster where losing a just-granted lock on failover is acceptable.
//! - **Waiting.** By sharded Pub/Sub (Redis 7 and later): a release is published with
//!   `SPUBLISH` on the lock's own shard channel, `<lock key>:released` (e.g.
//!   `syncguard:{q3Tz0v_J9aA}:released`, in the lock's slot), which only the nodes of that
//!   slot's shard send, and only to their subscribers of that channel; a waiting backend
//!   subscribes (`SSUBSCRIBE`) to the channels of the keys it waits on, on the nodes serving
//!   them, and follows failovers and moved slots. No message crosses the cluster bus to the
//!   other shards, and no process hears releases it does not wait for (see
//!   [waiting](#waiting)).
//!
//! ## Persistence
//!
//! Fences survive a restart only if Redis persists them: run Redis with `appendonly yes` (AOF;
//! `appendfsync everysec` loses at most about a second of writes on a crash, `always` none) or
//! at least RDB snapshots, and never restore an older snapshot over a newer one. Without
//! persistence a restart resets every counter to zero and fences repeat.
//!
//! ## Redis Sentinel
//!
//! With the `redis-sentinel` feature, a
//! `redis+sentinel://[user:password@]host:port[,host:port...]/<name>[/db]` URL
//! (`rediss+sentinel://` with `redis-tls`) asks the Sentinels listed which server is the
//! primary they monitor as `<name>`, checks that it says so itself (`ROLE`), and connects to
//! it; the user and password are the primary's (and its replicas'), and Sentinels that want a
//! login of their own take it as `?sentinel_password=...` (and `sentinel_username=...`):
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
//! use syncguard::redis::RedisBackend;
//!
//! let backend = RedisBackend::connect(
//!     "redis+sentinel://app:secret@10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/locks",
//! )
//! .await?;
//! # let _ = backend; Ok(()) }
//! ```
//!
//! After a failover the backend goes on with the new primary without a restart. Its one
//! multiplexed connection never reconnects to the same address by itself (a restarted old
//! primary is a primary of its own until the Sentinels demote it, and a lock written there
//! would be a second holder's): a call that finds it broken, timed out, or on a server that
//! became a replica (`READONLY`) fails with a retryable error, and the primary is asked of the
//! Sentinels again in the background (at once, then after 0.1 s, doubling up to every second),
//! calls failing fast meanwhile. The release subscriber asks them too each time it subscribes
//! again; the function library replicates (a script is sent again after a `NOSCRIPT`); acquires
//! in doubt are let go on the new primary. A grant the old primary had not yet sent to its
//! replica is lost in the failover: turn on [waiting for replicas](#replicas-and-failover) to
//! keep every grant. A pool ([`ConnectionMode::Pool`]), reconnect retries and custom root
//! certificates are refused with a Sentinel URL for now.
//!
//! ## Replicas and failover
//!
//! Redis replicates asynchronously. A primary that fails over to its replica (Sentinel, a
//! managed service's automatic failover) loses the writes it had not yet sent on: a lock it
//! had just granted is gone on the new primary, where another caller can take it while the
//! first still believes it holds it (until its next extend, which reports the loss), and the
//! fence counter can hand out the lost grant's fence a second time.
//!
//! [`RedisConfig::with_wait_for_replicas`] closes that window: a call that acquires or extends
//! goes with `WAIT <replicas> <timeout>` behind it, on the same connection and in the same
//! round trip (one pipeline: sent apart, a reconnection between them would put `WAIT` on a
//! connection with no writes, which every replica has acknowledged). Only once that many
//! replicas acknowledged the call (the lock's record and its fence counter with it) is an
//! acquire answered "acquired" or an extend "extended". Short of them within the timeout, an
//! acquire fails with a retryable [`ErrorCode::ServiceUnavailable`](crate::ErrorCode::ServiceUnavailable)
//! saying so, and its lock is released in the background as an [acquire in
//! doubt](#timeouts-and-acquires-in-doubt) is; an extend fails the same way and counts as not
//! made (the guard's heartbeat tries again within the lease). Releases send no `WAIT` (a
//! release lost in a failover leaves its lock to its ttl, which takes nothing from anyone),
//! though on the multiplexed connection every command queues behind a `WAIT` under way: with
//! a replica slow to answer, [`ConnectionMode::Pool`] keeps other callers' operations apart
//! from it. The cost is
//! a replica round trip per acquire or extend (batched calls share one; with one multiplexed
//! connection, 22 % fewer cycles/s at 1 worker and 37 % at 64 on loopback, see
//! `BENCHMARKS.md`), and a primary that
//! lost its replicas refuses every acquire until they are back: ask for at most the replicas
//! the primary keeps (`min-replicas-to-write` is the server's side of the same trade).
//!
//! `WAIT` counts replicas that received the write, not replicas that wrote it to disk;
//! a replica that restarts from an older file may still lose it. Not available on a Redis
//! Cluster yet (refused there).
//!
//! ## Timeouts and acquires in doubt
//!
//! An operation that does not end within the
//! [operation timeout](RedisConfig::with_operation_timeout) (1 s by default; waiting for a
//! pooled connection or a batch included) fails with [`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout); the
//! backend enforces it itself, on connections of yours too. The multiplexed connection that
//! [`connect_with`](RedisBackend::connect_with) opens reconnects on its own; calls fail with
//! [`ErrorCode::ServiceUnavailable`](crate::ErrorCode::ServiceUnavailable) once its
//! [reconnection attempts](RedisConfig::with_reconnect_retries) are spent.
//!
//! An acquire whose answer never came (the operation timeout passed, the connection broke)
//! may still be applied by Redis later: a request held up in the network, or by a paused
//! server, runs when it arrives. The backend then releases that lock id (only if it holds the
//! lock) as soon as the connection answers again, trying until the lock's ttl is over; a
//! release that finds nothing is sent three more times, a second apart, in case the held
//! request arrives later on another connection. What remains possible: the key is held by
//! nobody until that release lands (at most its ttl), and a request held up longer than
//! those resends lands after the last of them, so that its lock stays until its ttl. An
//! `acquire_as` in doubt is released the same way, but only while its lock is unclaimed: a
//! later `acquire_as` of the same holder that re-entered it was handed its lock id, and an
//! extend by that id means someone holds it; either claims the lock, which is then kept.
//!
//! ## Waiting
//!
//! [`acquire`](crate::acquire) waits for a held lock as its [`RetryPolicy`](crate::RetryPolicy)
//! says; on Redis its waiters wake when the lock is released, instead of at their next poll.
//!
//! - **Publish.** The release of a live lock that an acquire was refused on (a guard's release,
//!   [`LockBackend::release`](crate::backend::LockBackend::release), and the backend's own
//!   release of an acquire in doubt) publishes the lock's normalized key on the channel
//!   `<prefix>:released` (`syncguard:released` by default; see
//!   [`release_channel`](RedisBackend::release_channel)), in the script call that deletes it.
//!   On a Redis Cluster it goes by `SPUBLISH` to the lock's own shard channel instead,
//!   `<lock key>:released` (see [below](#on-a-redis-cluster)); on one server, in either
//!   layout, by `PUBLISH` to `<prefix>:released`.
//!   The refusal marks the lock for that (a waiter's first attempt is such a refusal). A release
//!   nobody was refused on publishes nothing, since nobody waits on it but, perhaps, this
//!   process's waiters queued behind the one that took it: the backend wakes those itself.
//!   Nothing else publishes: not a release that finds the lock gone or expired, not an expiry.
//! - **Subscribe.** Each backend (shared by its clones) opens one more connection, the first
//!   time something waits on it, subscribes to the channel, and hands every key it hears to
//!   this process's waiters of that key: the first of them (they queue in arrival order) tries
//!   the lock at once. The connection is made as the backend's own are (URL, credentials, TLS,
//!   the configuration's connect and operation timeouts) and closes when the last clone of the
//!   backend is dropped, or with the runtime it started on.
//! - **Fallback.** A message is a hint, never a condition: a waiter also tries when the
//!   holder's lease ends (a refused acquire reports the holder's stored `expiresAtMs`) and at
//!   the retry policy's delays, and never waits past its deadline. So an expiry, a release by a
//!   service that does not publish (the reference's TypeScript services, a backend with
//!   release notifications off) and a message lost while the subscriber was disconnected cost
//!   time, never correctness. A lost subscriber connection is opened again after 100 ms, then
//!   at doubling intervals up to 10 s while the server stays out of reach; once subscribed
//!   again, the first waiter of every key tries its lock, in case its release went by
//!   meanwhile. A connection silent for 10 s is checked with a `PING`, so that one a partition
//!   cut is noticed.
//! - **Across processes** the first waiter of each process is woken and they race: one takes
//!   the lock, the others wait again. Arrival order holds within a process only.
//! - **Cost.** One connection per backend, opened only once something waits (it then stays
//!   open). One `SET` per hold that an acquire was refused on (the mark), and one `PUBLISH` per
//!   release of such a hold, which Redis sends to every connection subscribed to the
//!   prefix's channel: every process waiting on any key of the prefix hears every such
//!   release of the prefix (a message the size of the key), and only the waiters of that key
//!   act on it.
//!   Pub/Sub channels are server-wide, not per database: backends of one prefix on different
//!   databases of a server wake each other's waiters for nothing (one refused attempt each);
//!   give them prefixes of their own.
//! - **Permissions.** With ACLs the user needs `PUBLISH` and `SUBSCRIBE` on the channel
//!   (`&<prefix>:released`). Without them, releases still succeed (a refused publish is
//!   ignored) and waiters poll.
//! - **A backend on a connection of yours** ([`RedisBackend::new`]) cannot tell where to
//!   subscribe: its waiters poll unless given the client with
//!   [`RedisConnection::with_release_client`]. On a cluster connection of yours that client
//!   (of any node) is where the subscriber's own cluster connection starts from (see
//!   [below](#on-a-redis-cluster)).
//! - **Turning it off.** [`RedisConfig::with_release_notifications`]`(false)` turns both
//!   halves off, as the PostgreSQL backend's switch of the same name does: the
//!   backend publishes nothing and subscribes to nothing, and its waiters poll (at the retry
//!   policy's delays and at the holder's lease end). Other backends' waiters find its releases
//!   by polling.
//!
//! ### On a Redis Cluster
//!
//! A classic `PUBLISH` on a cluster is sent over the cluster bus to every node, and a
//! subscriber on one node hears every release of the prefix; so on a cluster connection
//! (`redis-cluster://`) the backend uses sharded Pub/Sub (Redis 7 and later) instead:
//!
//! - **Publish.** The release of a contended lock runs `SPUBLISH <lock key>:released <key>`
//!   in its script call: the channel hashes to the lock key's slot (its tag), so the call may
//!   publish it on the node it runs on, and the message goes to that shard's nodes (the primary
//!   and its replicas) only.
//! - **Subscribe.** The backend opens one more cluster connection (RESP3, as the backend's
//!   own: nodes, credentials, TLS, timeouts) the first time something waits. When a waiter of
//!   a key first waits (after a refused attempt, or behind one of this process that was
//!   refused), or an observer follows the key, it sends `SSUBSCRIBE <lock key>:released`, routed
//!   to the node serving the slot; when the last waiter or observer of the key in this process
//!   leaves, `SUNSUBSCRIBE`. An acquire that gets the lock at once subscribes to nothing. Once
//!   the subscription took effect, the key's first waiter tries the lock once, in case the
//!   release went by in between.
//! - **Topology changes.** A node connection that drops (a primary killed, say), a channel the
//!   server unsubscribes (its slot moved), or primaries that do not answer a `PING` after 10 s
//!   of silence make the subscriber send `SSUBSCRIBE` again for each channel concerned, to the
//!   slot's node now (redirections are followed), at doubling intervals from 100 ms up to 10 s
//!   while it fails; then the first waiter of every key tries its lock. A manual failover keeps
//!   the old primary's subscribers, which hear the shard's messages as its replica.
//! - **Cost.** Per hold an acquire was refused on, one `SET` (the mark) and one `SPUBLISH` on
//!   the lock's node, whose message goes to the shard's nodes and to the processes waiting on
//!   that key only; per key waited on, one `SSUBSCRIBE` and one `SUNSUBSCRIBE` (and one more
//!   acquire attempt of its first waiter, once subscribed), each on the key's node. One more
//!   connection per node per backend, once something waits.
//! - **Fallback.** Where `SPUBLISH` is refused (a server before Redis 7, or a user not
//!   permitted it), the release publishes on the classic channel `<prefix>:released` instead;
//!   where `SSUBSCRIBE` is refused, the subscriber subscribes to that channel (on one node,
//!   through its cluster connection) and stays there: waiters wake as they did before sharded
//!   Pub/Sub, each release sent to every node. Releases are hints as on one server: waiters
//!   also poll (at the retry policy's delays and at the holder's lease end), and do meanwhile
//!   while a subscription is being made again or cannot be.
//! - **Permissions.** With ACLs the user needs `SPUBLISH` and `SSUBSCRIBE`/`SUNSUBSCRIBE` on
//!   the shard channels, `&<prefix>:{*}:released` (e.g. `&syncguard:{*}:released`), on every
//!   node (ACLs are per node).
//!
//! ## Errors
//!
//! Driver errors map onto [`LockError`] as the reference's specification classifies them,
//! with the redis-rs or deadpool error kept as the [`source`](std::error::Error::source):
//!
//! | error | [`LockError`] |
//! |---|---|
//! | I/O errors, dropped or refused connections, rejected TLS certificates; `LOADING`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `READONLY`, `BUSY`, `OOM`, `MISCONF`; a closed pool; scripts lost again right after loading | `ServiceUnavailable` |
//! | no reply within the operation timeout; pool timeouts (waiting, opening, checking a connection) | `NetworkTimeout` |
//! | `NOAUTH`, `WRONGPASS`, `NOPERM` (the user needs `GET`, `SET`, `DEL`, `INCR`, `TIME`, `EVALSHA`, `EVAL`, `SCRIPT LOAD`; `FCALL` and `FUNCTION LOAD` are used when permitted) | `AuthFailed` |
//! | `WRONGTYPE`, and data under a lock key that is not SyncGuard lock JSON (another program writes under the prefix); a database index the server does not have (`ERR DB index is out of range`) | `InvalidArgument` |
//! | anything else | `Internal` |
//!
//! ## TLS
//!
//! With the `redis-tls` feature, `rediss://` URLs connect over TLS (rustls, *ring* provider)
//! and verify the server's certificate and host name against the Mozilla root certificates
//! (webpki-roots), which managed services such as ElastiCache or Azure Cache for Redis chain
//! to. A server whose certificate comes from a private CA needs
//! [`tls_root_certs`][tls_root_certs]. Without the feature, a `rediss://` URL fails with
//! `InvalidArgument`.
//!
// `tls_root_certs` is behind the `redis-tls` feature: linked to docs.rs (built with every
// feature) when it is off, so that docs built without it have no broken link.
#![cfg_attr(
    feature = "redis-tls",
    doc = "[tls_root_certs]: RedisConfig::with_tls_root_certs"
)]
#![cfg_attr(
    not(feature = "redis-tls"),
    doc = concat!("[tls_root_certs]: https://docs.rs/syncguard/", env!("CARGO_PKG_VERSION"), "/syncguard/redis/struct.RedisConfig.html#method.with_tls_root_certs")
)]
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
//! let backend = syncguard::redis::RedisBackend::connect("rediss://:password@redis.example.com:6380").await?;
//! # let _ = backend; Ok(()) }
//! ```
//!
//! redis-rs builds its TLS settings with rustls' process-wide default crypto provider, and
//! panics without one (as when two providers are compiled in), so
//! [`connect_with`](RedisBackend::connect_with) and [`new`](RedisBackend::new) (on a pool) install
//! *ring* as that default unless one is installed already. An application that wants another
//! provider, or that opens `rediss://` connections of its own before, installs one first
//! (`rustls::crypto::ring::default_provider().install_default()`).

mod batch;
mod batch_call;
mod batch_function;
mod batch_send;
mod cluster_url;
mod config;
mod connect;
mod connection;
mod error;
mod keys;
mod known;
#[cfg(feature = "redis-cluster")]
mod node_call;
#[cfg(feature = "redis-cluster")]
mod node_map;
mod operations;
mod orphans;
mod replica_wait;
mod scripts;
#[cfg(feature = "redis-sentinel")]
mod sentinel_conn;
#[cfg(feature = "redis-sentinel")]
mod sentinel_switches;
mod sentinel_url;
#[cfg(feature = "redis-cluster")]
mod shard_subscriber;
mod subscriber;
mod subscriber_pace;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::key::normalize_key;
use crate::error::LockError;
use crate::lock_id::LockId;

pub use config::{
    ConnectionMode, DEFAULT_PREFIX, MAX_PREFIX_BYTES, RedisConfig, RedisLayout, WaitForReplicas,
    validate_prefix,
};
use connection::Conn;
pub use connection::RedisConnection;
#[cfg(feature = "redis-tls")]
use connection::install_crypto_provider;
/// The deadpool-redis crate this backend is built with, so that your pool is of the same
/// version.
pub use deadpool_redis;
use keys::Layout;
/// The redis-rs crate this backend is built with, so that your `ConnectionManager` and
/// `Client` are of the same version.
pub use redis;
use subscriber::{ReleaseSubscriber, Source};

/// Distributed locks on Redis: Lua scripts by FCALL or EVALSHA (concurrent acquire, release and extend
/// calls batched into one), server time (`TIME`) as the time authority, fences from `INCR`.
///
/// Cheap to clone (an `Arc` inside): clone it into tasks. Make it with
/// [`connect`](Self::connect) (the default configuration), [`connect_with`](Self::connect_with)
/// (a [`RedisConfig`] of yours), or [`new`](Self::new) on a connection you already have. See the [module documentation](self) for the storage
/// layout, the persistence requirement, timeouts and errors.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
/// use std::time::Duration;
/// use syncguard::backend::{AcquireOutcome, LockBackend};
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
    /// Every operation ends within it.
    operation_timeout: Duration,
    /// Whether releases are published on the release channel and subscribed to.
    release_notifications: bool,
    /// The release channel's subscriber, which wakes this process's waiters.
    releases: ReleaseSubscriber,
}

impl RedisBackend {
    /// A backend on `connection`, a connection of yours: a redis-rs `ConnectionManager` or a
    /// deadpool-redis pool (each is a [`RedisConnection`] by `From`), with `config`. No I/O
    /// happens here; scripts load on first use. The operation timeout holds whatever your
    /// connection's own timeouts.
    ///
    /// Its waiters poll unless the connection carries a client to subscribe to releases with
    /// ([`RedisConnection::with_release_client`]).
    ///
    /// # Errors
    /// `InvalidArgument` naming the setting, for a bad setting (see
    /// [`RedisConfig::validate`]), or one that only the connections
    /// [`connect_with`](Self::connect_with) opens can apply (the connection mode, reconnect
    /// retries, TLS roots: set them on your connection instead).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use syncguard::redis::{RedisBackend, RedisConfig, redis};
    ///
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let manager = redis::aio::ConnectionManager::new(client).await?;
    /// let backend = RedisBackend::new(manager, RedisConfig::new())?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn new(
        connection: impl Into<RedisConnection>,
        config: RedisConfig,
    ) -> Result<Self, LockError> {
        if let Some(setting) = config.connect_only_setting() {
            return Err(LockError::invalid_argument(format!(
                "RedisConfig::{setting} applies only to the connections that \
                 RedisBackend::connect_with opens; RedisBackend::new runs on your connection: \
                 set it there and leave it out of the config"
            )));
        }
        let RedisConnection {
            conn,
            release_client,
        } = connection.into();
        // A pool opens its connections later, in our operations.
        #[cfg(feature = "redis-tls")]
        if matches!(conn, Conn::Pool(_)) {
            install_crypto_provider();
        }
        let cluster = conn.is_cluster();
        let source = release_client.map(|client| Source::from_client(client, cluster, &config));
        Self::with_conn(conn, &config, source)
    }

    /// `client`: where the release subscriber connects (`None`: nowhere, waiters poll).
    fn with_conn(
        conn: Conn,
        config: &RedisConfig,
        client: Option<Source>,
    ) -> Result<Self, LockError> {
        config.validate()?;
        let kind = match (config.layout(), conn.is_cluster()) {
            (Some(RedisLayout::Reference), true) => return Err(reference_layout_on_a_cluster()),
            (Some(kind), _) => kind,
            (None, true) => RedisLayout::Cluster,
            (None, false) => RedisLayout::Reference,
        };
        if conn.is_cluster() && config.wait_for_replicas().is_some() {
            return Err(wait_for_replicas_on_a_cluster());
        }
        let layout = Layout::new(config.prefix(), kind);
        let header = batch::Header {
            #[cfg(feature = "redis-cluster")]
            nodes: conn
                .cluster()
                .map(|cluster| Arc::new(node_map::NodeMap::new(cluster.clone()))),
            index_prefix: layout.index_prefix().into(),
            release_channel: match (config.release_notifications(), conn.is_cluster()) {
                (false, _) => "".into(),
                (true, false) => layout.release_channel().into(),
                // Each lock's own shard channel, `<lock key>:released` (see batch.lua).
                (true, true) => format!("{{}}{}", layout.release_channel()).into(),
            },
            function: batch_function::BatchFunction::default(),
            wait_for_replicas: config.wait_for_replicas(),
        };
        // Off, nothing subscribes.
        let client = client.filter(|_| config.release_notifications());
        let releases = ReleaseSubscriber::new(layout.release_channel(), client, config.net());
        Ok(Self {
            inner: Arc::new(Inner {
                batcher: batch::Batcher::new(conn.clone(), header, config.operation_timeout()),
                known: known::KnownKeys::default(),
                conn,
                layout,
                cleanup_guard_ms: if config.cleanup_in_is_locked() {
                    crate::backend::time::CLEANUP_GUARD_MS
                } else {
                    0
                },
                operation_timeout: config.operation_timeout(),
                release_notifications: config.release_notifications(),
                releases,
            }),
        })
    }

    /// Whether this backend announces releases and listens for them (see
    /// [`RedisConfig::release_notifications`]).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::redis::{RedisBackend, RedisConfig};
    ///
    /// let config = RedisConfig::new().with_release_notifications(false);
    /// let backend = RedisBackend::connect_with("redis://127.0.0.1:6379", config).await?;
    /// assert!(!backend.release_notifications());
    /// # Ok(()) }
    /// ```
    pub fn release_notifications(&self) -> bool {
        self.inner.release_notifications
    }

    /// The Pub/Sub channel releases are published on and waiters listen to:
    /// `<prefix>:released` (see [waiting](self#waiting)). On a Redis Cluster each lock has a
    /// shard channel of its own, [`lock_key`](Self::lock_key)` + ":released"`, and this one
    /// is the fallback where sharded Pub/Sub is not to be had (see
    /// [on a Redis Cluster](self#on-a-redis-cluster)).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// assert_eq!(backend.release_channel(), "syncguard:released");
    /// # Ok(()) }
    /// ```
    pub fn release_channel(&self) -> &str {
        self.inner.layout.release_channel()
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
            // Multiplexed per node.
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(_) => ConnectionMode::Multiplexed,
            #[cfg(feature = "redis-sentinel")]
            Conn::Sentinel(_) => ConnectionMode::Multiplexed,
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
    /// `InvalidArgument` in the [cluster layout](RedisLayout::Cluster), which has no index (the
    /// lock id finds its lock key: see [`lock_key_of`](Self::lock_key_of)).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// let backend = syncguard::redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// let id = syncguard::LockId::generate();
    /// assert_eq!(backend.index_key(&id)?, format!("syncguard:id:{id}"));
    /// # Ok(()) }
    /// ```
    pub fn index_key(&self, lock_id: &LockId) -> Result<String, LockError> {
        self.inner.layout.index_key(lock_id)?.ok_or_else(|| {
            LockError::invalid_argument(
                "the Redis cluster layout has no lock-id index: a lock id finds its lock key \
                 itself (RedisBackend::lock_key_of)",
            )
        })
    }

    /// The Redis key the lock of `lock_id` is stored under, when the lock id alone says it:
    /// in the [cluster layout](RedisLayout::Cluster), where a lock id starts with its key's
    /// tag; `None` in the reference layout, where the index says it.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::redis::{RedisBackend, RedisConfig, RedisLayout};
    /// use syncguard::LockOptions;
    ///
    /// let config = RedisConfig::new().with_layout(RedisLayout::Cluster);
    /// let backend = RedisBackend::connect_with("redis://127.0.0.1:6379", config).await?;
    /// let guard = syncguard::acquire(&backend, "job:42", &LockOptions::default()).await?;
    /// assert_eq!(backend.lock_key_of(guard.lock_id()), Some(backend.lock_key("job:42")?));
    /// # Ok(()) }
    /// ```
    pub fn lock_key_of(&self, lock_id: &LockId) -> Option<String> {
        let layout = &self.inner.layout;
        match layout.kind() {
            RedisLayout::Reference => None,
            RedisLayout::Cluster => layout.locate(lock_id, None).ok()?.lock_key,
        }
    }

    /// Where this backend stores its keys (see [`RedisConfig::with_layout`]).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::redis::{RedisBackend, RedisLayout};
    /// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// assert_eq!(backend.layout(), RedisLayout::Reference);
    /// # Ok(()) }
    /// ```
    pub fn layout(&self) -> RedisLayout {
        self.inner.layout.kind()
    }

    /// Loads every script into the server's script cache (`SCRIPT LOAD`), and the batch's
    /// function library (`FUNCTION LOAD`) where the server has functions and the user may load
    /// them. Operations reload both on their own after a `SCRIPT FLUSH`, a `FUNCTION FLUSH` or
    /// a restart; this only moves the first load (and any permission error) up front.
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
        let function = &self.inner.batcher.header().function;
        self.within_operation_timeout("load the scripts", self.inner.conn.load_all(function))
            .await
    }

    /// `operation`, failed with [`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout) when it does not end within the
    /// operation timeout.
    pub(super) async fn within_operation_timeout<T>(
        &self,
        what: &str,
        operation: impl std::future::Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        within(self.inner.operation_timeout, what, operation).await
    }
}

/// The refusal of [`RedisConfig::with_wait_for_replicas`] on a cluster connection.
fn wait_for_replicas_on_a_cluster() -> LockError {
    LockError::invalid_argument(
        "RedisConfig::with_wait_for_replicas: not available on a Redis Cluster yet (WAIT \
         covers one node's connection, and a batch goes to several); leave it out for a \
         redis-cluster:// URL",
    )
}

/// The refusal of [`RedisLayout::Reference`] on a cluster connection.
fn reference_layout_on_a_cluster() -> LockError {
    LockError::invalid_argument(
        "RedisConfig::with_layout: the reference layout cannot run on a Redis Cluster (the keys \
         of one lock are in different hash slots); use RedisLayout::Cluster, or leave the \
         layout out",
    )
}

/// `operation`, failed with [`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout) when it does not end within
/// `timeout` (the operation timeout).
pub(super) async fn within<T>(
    timeout: Duration,
    what: &str,
    operation: impl std::future::Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    tokio::time::timeout(timeout, operation)
        .await
        // The elapsed deadline as the source, as the connection's own response timeout gives
        // its I/O error: the error is the same whichever of the two fires first.
        .unwrap_or_else(|elapsed| Err(timed_out(what, timeout).with_source(elapsed)))
}

/// The error of an operation that did not `what` within `timeout` (the operation timeout).
pub(super) fn timed_out(what: &str, timeout: Duration) -> LockError {
    LockError::network_timeout(format!(
        "Redis did not {what} within the operation timeout ({timeout:?}); the operation may \
         or may not have been applied"
    ))
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.prefix())
            .field("mode", &self.connection_mode())
            .field("cluster", &self.inner.conn.is_cluster())
            .field("layout", &self.layout())
            .field("cleanup_in_is_locked", &(self.inner.cleanup_guard_ms > 0))
            .field("release_notifications", &self.inner.release_notifications)
            .field("subscribes", &self.inner.releases.has_client())
            .finish()
    }
}
