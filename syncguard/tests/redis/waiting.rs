//! Waiting on Redis: a release publishes the lock's key on `<prefix>:released` and wakes
//! waiters (of the same backend and of others) long before their poll; the subscriber
//! connection survives being killed, and waiters get the lock meanwhile; releases nobody
//! publishes (a backend with release notifications off, the reference's release) and expiries
//! are found by polling and at the lease end, which a refusal reports; a cancelled wait leaves no
//! subscription and no lock behind, and a dropped backend closes its connection; a user
//! without permission to publish still releases.
//!
//! The waiters poll every 30 s where the test is about a wake-up, so that only a message (or
//! the lease end) explains one within [`PROMPT`]. The hand-over times are printed (run with
//! `--nocapture` to see them).

use std::future::poll_fn;
use std::pin::Pin;
use std::time::Duration;

use futures_core::Stream;
use redis::aio::{MultiplexedConnection, PubSubStream};
use syncguard::backend::{AcquireOutcome, ExtendOutcome, LockBackend};
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig, RedisConnection};
use syncguard::{LockId, get_by_key};
use tokio::time::{Instant, sleep, timeout};

use crate::servers::RedisServer;
use crate::waiters::{spawn_waiter, taken, waiting_every};
use crate::{acquired, raw, redis_url, unique};

/// A poll so slow that only a message (or the lease end) explains a prompt wake-up.
const SLOW_POLL: Duration = Duration::from_secs(30);

/// A loaded 2-core machine's worst case for a wake-up that takes milliseconds.
const PROMPT: Duration = Duration::from_secs(10);

/// A prefix of the test's own: its release channel carries this test's releases only.
/// An acquire of `key` refused (it marks the live lock, whose release then publishes).
async fn refused(backend: &RedisBackend, key: &str) {
    let outcome = backend.acquire(key, Duration::from_secs(30)).await.unwrap();
    assert!(outcome.is_contended(), "{key} should be held");
}

fn own_prefix(label: &str) -> String {
    format!("redis-test:{label}-{}", LockId::generate())
}

async fn backend_with_prefix(url: &str, prefix: &str) -> RedisBackend {
    RedisBackend::connect_with(url, RedisConfig::new().with_prefix(prefix))
        .await
        .expect("connect")
}

/// A subscriber of the test's own on `channel`.
async fn listen(url: &str, channel: &str) -> PubSubStream {
    let client = redis::Client::open(url).unwrap();
    let mut pubsub = client.get_async_pubsub().await.expect("subscriber");
    pubsub.subscribe(channel).await.expect("SUBSCRIBE");
    pubsub.into_on_message()
}

/// The next message of `messages` within `within`, as text.
async fn next_message(messages: &mut PubSubStream, within: Duration) -> Option<String> {
    let next = poll_fn(|cx| Pin::new(&mut *messages).poll_next(cx));
    let message = timeout(within, next).await.ok().flatten()?;
    Some(String::from_utf8(message.get_payload_bytes().to_vec()).expect("UTF-8 key"))
}

/// How many connections subscribe to `channel`.
async fn subscribers(conn: &mut MultiplexedConnection, channel: &str) -> i64 {
    let (_, count): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(conn)
        .await
        .unwrap();
    count
}

/// Waits until `channel` has `count` subscribers.
async fn until_subscribers(conn: &mut MultiplexedConnection, channel: &str, count: i64) {
    let deadline = Instant::now() + PROMPT;
    loop {
        let now = subscribers(conn, channel).await;
        if now == count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{channel} has {now} subscribers, not {count}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

fn summary(mut handoffs: Vec<Duration>) -> String {
    handoffs.sort();
    format!(
        "min {:?}, median {:?}, max {:?} over {}",
        handoffs[0],
        handoffs[handoffs.len() / 2],
        handoffs[handoffs.len() - 1],
        handoffs.len()
    )
}

/// A waiter of the releasing backend itself, and one of another backend (as another process's
/// would be), both get the lock long before their 30 s poll, in both connection modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_waiters_long_before_their_poll() {
    let url = redis_url();
    for mode in [
        ConnectionMode::Multiplexed,
        ConnectionMode::Pool { max_size: 4 },
    ] {
        let holder =
            RedisBackend::connect_with(&url, RedisConfig::new().with_connection_mode(mode))
                .await
                .unwrap();
        let other = RedisBackend::connect_with(&url, RedisConfig::new().with_connection_mode(mode))
            .await
            .unwrap();
        for (label, waiting) in [("same backend", &holder), ("another backend", &other)] {
            let mut handoffs = Vec::new();
            for _ in 0..5 {
                let key = unique("wake");
                let lease = acquired(&holder, &key, Duration::from_secs(30)).await;
                let waiter = spawn_waiter(waiting, &key, waiting_every(SLOW_POLL));
                // The waiter's first attempt is refused, and it goes to sleep.
                sleep(Duration::from_millis(200)).await;
                assert!(!waiter.is_finished(), "the key is held");
                let released = Instant::now();
                assert!(holder.release(&lease.lock_id).await.unwrap().is_released());
                let guard = taken(waiter, PROMPT).await;
                handoffs.push(released.elapsed());
                assert!(guard.fence() > lease.fence);
                guard.release().await.unwrap();
            }
            eprintln!(
                "redis {mode:?}, waiter on the {label}: release to acquisition {}",
                summary(handoffs)
            );
        }
    }
}

/// A release nobody was refused during publishes nothing, and wakes the next waiter of this
/// process itself: two waiters of one backend queue on a held key; the first takes it on the
/// holder's release (published: the first was refused), the second, queued behind it without
/// trying, gets it on the first's release long before its poll, with nothing published. With
/// nobody waiting in the process, the last release still releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpublished_release_wakes_the_next_waiter_of_its_own_process() {
    let url = redis_url();
    let prefix = own_prefix("own-waiters");
    let backend = backend_with_prefix(&url, &prefix).await;
    let mut messages = listen(&url, &format!("{prefix}:released")).await;
    let key = unique("own-waiters");
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    let first = spawn_waiter(&backend, &key, waiting_every(SLOW_POLL));
    sleep(Duration::from_millis(200)).await;
    let second = spawn_waiter(&backend, &key, waiting_every(SLOW_POLL));
    sleep(Duration::from_millis(200)).await;
    assert!(
        !first.is_finished() && !second.is_finished(),
        "the key is held"
    );

    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    assert_eq!(
        next_message(&mut messages, PROMPT).await.as_deref(),
        Some(key.as_str()),
        "the first waiter was refused, so the release publishes"
    );
    let first = taken(first, PROMPT).await;
    sleep(Duration::from_millis(200)).await;
    assert!(
        !second.is_finished(),
        "the second waiter waits for its turn"
    );

    let (released, first_fence) = (Instant::now(), first.fence());
    first.release().await.unwrap();
    let second = taken(second, PROMPT).await;
    eprintln!(
        "own waiter woken {:?} after an unpublished release",
        released.elapsed()
    );
    assert!(second.fence() > first_fence);
    assert_eq!(
        next_message(&mut messages, Duration::from_millis(500)).await,
        None,
        "nobody was refused during the first waiter's hold: nothing is published"
    );
    second.release().await.unwrap();
    assert!(!backend.is_locked(&key).await.unwrap());
}

/// A backend made with `new` over a connection of yours, given the client to subscribe with,
/// wakes its waiters on a release as one that connected itself does, for releases from
/// another backend too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_on_a_connection_of_yours_wakes_its_waiters() {
    let url = redis_url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let manager = redis::aio::ConnectionManager::new(client.clone())
        .await
        .unwrap();
    let on_yours = RedisBackend::new(
        RedisConnection::from(manager).with_release_client(client),
        RedisConfig::new(),
    )
    .unwrap();
    assert!(on_yours.release_notifications());
    let holder = RedisBackend::connect(&url).await.unwrap();
    for releaser in [&on_yours, &holder] {
        let key = unique("yours");
        let lease = acquired(releaser, &key, Duration::from_secs(30)).await;
        let waiter = spawn_waiter(&on_yours, &key, waiting_every(SLOW_POLL));
        sleep(Duration::from_millis(200)).await;
        assert!(!waiter.is_finished(), "the key is held");
        assert!(
            releaser
                .release(&lease.lock_id)
                .await
                .unwrap()
                .is_released()
        );
        let guard = taken(waiter, PROMPT).await;
        assert!(guard.fence() > lease.fence);
        guard.release().await.unwrap();
    }
}

/// What a release publishes: the normalized key, as the waiters' `acquire` gets it, escapes
/// and all; once per release of a live lock an acquire was refused on, and for nothing else
/// (an uncontended release, an acquire, an extend, a release that finds the lock gone or
/// expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_publishes_the_normalized_key_and_nothing_else_does() {
    let url = redis_url();
    let prefix = own_prefix("published");
    let backend = backend_with_prefix(&url, &prefix).await;
    let mut messages = listen(&url, backend.release_channel()).await;
    assert_eq!(backend.release_channel(), format!("{prefix}:released"));
    let base = unique("published");
    let keys = [
        format!("{base}:plain"),
        // cjson escapes the slash, the quote, the backslash and the tab.
        format!("{base}:a/b \"quoted\" back\\slash\ttab"),
        // Decomposed: stored, and published, in NFC.
        format!("{base}:caf\u{65}\u{301} €"),
        // Reserved: stored under a hash, published as the key.
        format!("id:{base}"),
        format!("{base}:{}", "k".repeat(400)),
    ];
    for key in &keys {
        let nfc = syncguard::backend::key::normalize_key(key)
            .unwrap()
            .into_owned();
        let lease = acquired(&backend, key, Duration::from_secs(30)).await;
        refused(&backend, key).await;
        let extended = backend
            .extend(&lease.lock_id, Duration::from_secs(30))
            .await;
        assert!(matches!(extended, Ok(ExtendOutcome::Extended { .. })));
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
        assert_eq!(next_message(&mut messages, PROMPT).await, Some(nfc));
        // A release that finds nothing publishes nothing.
        assert!(!backend.release(&lease.lock_id).await.unwrap().is_released());
    }

    // A release nobody was refused on: nobody waits, nothing is published.
    let key = format!("{base}:uncontended");
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    assert_eq!(
        next_message(&mut messages, Duration::from_millis(500)).await,
        None,
        "an uncontended release is not published"
    );

    // A release by lock id through the index (by another backend, which did not take it).
    let key = format!("{base}:by-index");
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    refused(&backend, &key).await;
    let peer = backend_with_prefix(&url, &prefix).await;
    assert!(peer.release(&lease.lock_id).await.unwrap().is_released());
    assert_eq!(next_message(&mut messages, PROMPT).await, Some(key));

    // A record the reference's cjson extend rewrote (fields in cjson's order) still names its
    // key.
    let key = format!("{base}:rewritten/é");
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    refused(&backend, &key).await;
    let mut conn = raw(&url).await;
    let _: () = crate::eval(
        "local data = cjson.decode(redis.call('GET', KEYS[1])) \
         redis.call('SET', KEYS[1], cjson.encode(data), 'KEEPTTL')",
        &[&backend.lock_key(&key).unwrap()],
    )
    .query_async(&mut conn)
    .await
    .unwrap();
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    assert_eq!(next_message(&mut messages, PROMPT).await, Some(key));

    // An expired lock's release finds it expired, and announces nothing.
    let key = format!("{base}:expired");
    let lease = acquired(&backend, &key, Duration::from_secs(1)).await;
    refused(&backend, &key).await;
    sleep(Duration::from_millis(2_200)).await;
    assert!(!backend.release(&lease.lock_id).await.unwrap().is_released());
    assert_eq!(
        next_message(&mut messages, Duration::from_millis(500)).await,
        None,
        "only releases of live locks are published"
    );
}

/// A refused acquire reports the live holder's stored expiry (also to an `acquire_as` of
/// another holder, and the new one after an extend); a lock that expires without a release
/// publishes nothing, and its waiter gets it at the lease end, not at its 30 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_without_release_wakes_waiters_at_the_lease_end() {
    let url = redis_url();
    let backend = backend_with_prefix(&url, &own_prefix("lease-end")).await;
    let mut messages = listen(&url, backend.release_channel()).await;
    let key = unique("lease-end");
    let ttl = Duration::from_secs(2);
    let lease = acquired(&backend, &key, ttl).await;
    let reported = |outcome: AcquireOutcome| match outcome {
        AcquireOutcome::Contended(contention) => contention.holder_expires_at_ms,
        other => panic!("the key is held: {other:?}"),
    };
    let refused = backend.acquire(&key, ttl).await.unwrap();
    assert_eq!(reported(refused), Some(lease.expires_at_ms));
    let refused = backend.acquire_as(&key, ttl, "someone").await.unwrap();
    assert_eq!(reported(refused), Some(lease.expires_at_ms), "acquire_as");
    let ExtendOutcome::Extended { expires_at_ms } =
        backend.extend(&lease.lock_id, ttl).await.unwrap()
    else {
        panic!("extended");
    };
    let refused = backend.acquire(&key, ttl).await.unwrap();
    assert_eq!(reported(refused), Some(expires_at_ms), "after an extend");

    let started = Instant::now();
    let guard = timeout(
        PROMPT,
        syncguard::acquire(&backend, &key, &waiting_every(SLOW_POLL)),
    )
    .await
    .expect("the waiter tries again when the lease ends")
    .expect("the expired lock is taken");
    let waited = started.elapsed();
    eprintln!("redis: a waiter took an expired lock {waited:?} after it began to wait");
    assert!(guard.fence() > lease.fence);
    // Not before the lease and its 1 s tolerance ended.
    assert!(
        syncguard::backend::time::now_ms()
            >= expires_at_ms + syncguard::backend::time::TIME_TOLERANCE_MS,
        "taken before the lease ended"
    );
    assert_eq!(
        next_message(&mut messages, Duration::from_millis(200)).await,
        None,
        "an expiry publishes nothing"
    );
    guard.release().await.unwrap();
}

/// Releases nobody announces: by a backend with release notifications off, and by the
/// reference's release (a delete of the lock and its index, as its script does). The waiter
/// gets the lock by polling, and nothing was published. A backend with notifications off does
/// not listen either: its waiters poll, and it subscribes to nothing, even given a client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_nobody_publishes_are_found_by_polling() {
    let url = redis_url();
    let prefix = own_prefix("silent");
    let waiting = backend_with_prefix(&url, &prefix).await;
    let silent = RedisBackend::connect_with(
        &url,
        RedisConfig::new()
            .with_prefix(&prefix)
            .with_release_notifications(false),
    )
    .await
    .unwrap();
    let mut messages = listen(&url, waiting.release_channel()).await;
    let poll = Duration::from_millis(500);

    // A backend with notifications off.
    let key = unique("silent");
    let lease = acquired(&silent, &key, Duration::from_secs(30)).await;
    let waiter = spawn_waiter(&waiting, &key, waiting_every(poll));
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the key is held");
    let released = Instant::now();
    assert!(silent.release(&lease.lock_id).await.unwrap().is_released());
    let guard = taken(waiter, PROMPT).await;
    eprintln!(
        "redis: unannounced release (publishing off) to acquisition by polling every {poll:?}: {:?}",
        released.elapsed()
    );
    assert_eq!(
        next_message(&mut messages, Duration::from_millis(200)).await,
        None,
        "publishing is off"
    );

    // The reference's release: check the owner, delete the lock and its index, publish nothing.
    let lock_id = guard.lock_id().clone();
    let waiter = spawn_waiter(&waiting, &key, waiting_every(poll));
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the key is held");
    let mut conn = raw(&url).await;
    let released = Instant::now();
    let deleted: i64 = crate::eval(
        "local data = redis.call('GET', KEYS[1]) \
         if not data or cjson.decode(data).lockId ~= ARGV[1] then return 0 end \
         redis.call('DEL', KEYS[1], KEYS[2]) return 1",
        &[
            &waiting.lock_key(&key).unwrap(),
            &waiting.index_key(&lock_id).unwrap(),
        ],
    )
    .arg(lock_id.as_str())
    .query_async(&mut conn)
    .await
    .unwrap();
    assert_eq!(deleted, 1);
    let second = taken(waiter, PROMPT).await;
    eprintln!(
        "redis: the reference's release to acquisition by polling every {poll:?}: {:?}",
        released.elapsed()
    );
    assert!(second.fence() > guard.fence());
    assert_eq!(
        next_message(&mut messages, Duration::from_millis(200)).await,
        None,
        "the reference publishes nothing"
    );
    // The first guard's lock is gone; its release finds nothing.
    drop(guard);
    second.release().await.unwrap();

    // Off, the backend does not listen: its waiter finds a published release by polling, and
    // the channel's subscribers are this test's and the waiting backend's.
    assert!(!silent.release_notifications());
    assert!(silent.release_notifier().is_none());
    let key = unique("silent-waiter");
    let lease = acquired(&waiting, &key, Duration::from_secs(30)).await;
    let waiter = spawn_waiter(&silent, &key, waiting_every(poll));
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the key is held");
    let released = Instant::now();
    assert!(waiting.release(&lease.lock_id).await.unwrap().is_released());
    taken(waiter, PROMPT).await.release().await.unwrap();
    eprintln!(
        "redis: a waiter of a backend with notifications off found a release by polling every {poll:?}: {:?}",
        released.elapsed()
    );
    let channel = waiting.release_channel().to_owned();
    assert_eq!(
        subscribers(&mut conn, &channel).await,
        2,
        "nothing else subscribes"
    );

    // Nor does a backend on a connection of yours, given the client to subscribe with.
    let client = redis::Client::open(url.as_str()).unwrap();
    let manager = redis::aio::ConnectionManager::new(client.clone())
        .await
        .unwrap();
    let on_yours = RedisBackend::new(
        RedisConnection::from(manager).with_release_client(client),
        RedisConfig::new()
            .with_prefix(&prefix)
            .with_release_notifications(false),
    )
    .unwrap();
    assert!(!on_yours.release_notifications());
    assert!(on_yours.release_notifier().is_none());
}

/// The subscriber connection killed again and again (`CLIENT KILL TYPE pubsub`, on a server
/// of the test's own): the waiter still gets the lock, at the holder's lease end or on a
/// resubscription. Once the subscriber is back, a release wakes a waiter promptly again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscriber_survives_being_killed() {
    let server = RedisServer::start("no").await;
    let url = server.url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let channel = backend.release_channel().to_owned();
    let mut conn = raw(&url).await;
    let key = unique("killed");

    // Subscribed once something waits, and woken by a release.
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    assert_eq!(
        subscribers(&mut conn, &channel).await,
        0,
        "nothing waited yet"
    );
    let waiter = spawn_waiter(&backend, &key, waiting_every(SLOW_POLL));
    until_subscribers(&mut conn, &channel, 1).await;
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    taken(waiter, PROMPT).await.release().await.unwrap();

    // The subscriber killed every 50 ms while a holder's 2 s lease runs out.
    let held = unique("killed-held");
    let lease = acquired(&backend, &held, Duration::from_secs(2)).await;
    let killer = tokio::spawn({
        let url = url.clone();
        async move {
            let mut conn = raw(&url).await;
            loop {
                let _: redis::Value = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("pubsub")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let started = Instant::now();
    let waiter = spawn_waiter(&backend, &held, waiting_every(SLOW_POLL));
    let guard = taken(waiter, PROMPT).await;
    eprintln!(
        "redis: with the subscriber killed every 50 ms, a waiter took a lock 2 s from its lease \
         end after {:?}",
        started.elapsed()
    );
    assert!(guard.fence() > lease.fence);
    killer.abort();
    let _ = killer.await;
    guard.release().await.unwrap();

    // Back: subscribed again, and a release wakes the next waiter long before its poll.
    until_subscribers(&mut conn, &channel, 1).await;
    let key = unique("killed-back");
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    let waiter = spawn_waiter(&backend, &key, waiting_every(SLOW_POLL));
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the key is held");
    let released = Instant::now();
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    let guard = taken(waiter, PROMPT).await;
    eprintln!(
        "redis: after the subscriber reconnected, release to acquisition {:?}",
        released.elapsed()
    );
    guard.release().await.unwrap();

    // One kill while a waiter waits and the holder releases: the resubscription (or the
    // poll) hands the lock over even if the message was lost.
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    let waiter = spawn_waiter(&backend, &key, waiting_every(SLOW_POLL));
    sleep(Duration::from_millis(300)).await;
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    let guard = taken(waiter, PROMPT).await;
    guard.release().await.unwrap();
}

/// Cancelled waits leave nothing behind: one subscription however many waits, no lock taken,
/// and the next waiter woken by the release; dropping the backend (every clone) closes the
/// subscriber connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waits_leave_no_subscription_or_lock_behind() {
    let url = redis_url();
    let backend = backend_with_prefix(&url, &own_prefix("cancelled")).await;
    let channel = backend.release_channel().to_owned();
    let mut conn = raw(&url).await;
    let key = unique("cancelled");
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    assert_eq!(subscribers(&mut conn, &channel).await, 0);
    for _ in 0..20 {
        let cancelled = timeout(
            Duration::from_millis(50),
            syncguard::acquire(&backend, &key, &waiting_every(SLOW_POLL)),
        )
        .await;
        assert!(cancelled.is_err(), "the key is held");
    }
    until_subscribers(&mut conn, &channel, 1).await;
    let info = get_by_key(&backend, &key)
        .await
        .unwrap()
        .expect("still held");
    assert_eq!(info.fence, lease.fence, "the holder keeps its lock");
    let notifier = backend.release_notifier().expect("subscribes");
    assert!(!notifier.is_watched(), "no waiter is left queued");
    sleep(Duration::from_millis(300)).await;
    assert_eq!(
        subscribers(&mut conn, &channel).await,
        1,
        "one subscription"
    );

    let waiter = spawn_waiter(&backend.clone(), &key, waiting_every(SLOW_POLL));
    sleep(Duration::from_millis(200)).await;
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    let guard = taken(waiter, PROMPT).await;
    guard.release().await.unwrap();
    assert!(!backend.is_locked(&key).await.unwrap(), "nothing held");

    drop(notifier);
    drop(backend);
    until_subscribers(&mut conn, &channel, 0).await;
}

/// A user who may not publish on the channel (Redis ACL `resetchannels`) still releases: the
/// refused publish is ignored, and waiters poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_publish_permission_still_releases() {
    let url = redis_url();
    let mut conn = raw(&url).await;
    let user = format!("sg-nopub-{}", LockId::generate());
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("reset")
        .arg("on")
        .arg(">secret")
        .arg("~*")
        .arg("resetchannels")
        .arg("+@all")
        .query_async(&mut conn)
        .await
        .unwrap();
    let restricted = url.replacen("redis://", &format!("redis://{user}:secret@"), 1);
    let backend = RedisBackend::connect(&restricted).await.unwrap();
    let key = unique("nopub");
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    let waiter = spawn_waiter(&backend, &key, waiting_every(Duration::from_millis(300)));
    sleep(Duration::from_millis(300)).await;
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    let guard = taken(waiter, PROMPT).await;
    guard.release().await.unwrap();
    assert!(!backend.is_locked(&key).await.unwrap());
    drop(backend);
    let _: () = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Over TLS (`rediss://`, the test CA): the subscriber connects as the backend does, and a
/// release wakes the waiter long before its poll.
#[cfg(feature = "redis-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_waiters_over_tls() {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set: run `bash scripts/with-services.sh cargo test -p syncguard \
                 --all-features --test redis`"
            )
        })
    };
    let ca = std::fs::read(var("SYNCGUARD_TEST_TLS_CA")).expect("the test CA");
    let backend = RedisBackend::connect_with(
        &var("SYNCGUARD_TEST_REDIS_TLS_URL"),
        RedisConfig::new()
            .with_tls_root_certs(ca)
            .with_connect_timeout(Duration::from_secs(10))
            .with_operation_timeout(Duration::from_secs(10)),
    )
    .await
    .expect("connect over TLS");
    let key = unique("tls-wake");
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    let waiter = spawn_waiter(&backend, &key, waiting_every(SLOW_POLL));
    sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "the key is held");
    let released = Instant::now();
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    let guard = taken(waiter, PROMPT).await;
    eprintln!(
        "redis over TLS: release to acquisition {:?}",
        released.elapsed()
    );
    guard.release().await.unwrap();
}
