//! Waiting on the PostgreSQL backend: releases announced with `pg_notify` (those of locks an
//! acquire was refused during; uncontended releases send nothing) wake waiters through the
//! backend's listening connection, also when releases race refusals, and waiting stays correct
//! without them (a killed listener, peers that never notify, locks that expire). Against the
//! real server `bash scripts/test-all.sh` starts (`SYNCGUARD_TEST_POSTGRES_URL`).

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener};
use sqlx::{Connection, PgConnection};
use syncguard::backend::{AcquireOutcome, LockBackend};
use syncguard::postgres::{PostgresBackend, PostgresConfig, setup_schema};
use syncguard::{Backoff, Jitter, LockError, LockGuard, LockId, LockOptions, RetryPolicy};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

use crate::pg_reference;

use crate::urls::postgres_url;

/// A poll interval so long that only an announcement explains a waiter that gets the lock
/// well before it.
const SLOW_POLL: Duration = Duration::from_secs(30);

/// A loaded 2-core machine's worst case for a wake-up that takes milliseconds.
const PROMPT: Duration = Duration::from_secs(10);

/// An application name no other test (or run) uses, for the backend's pool; its listening
/// connection is named `<name> (syncguard listener)`.
fn unique_application() -> String {
    format!("sg-wait-{}", &LockId::generate().as_str()[..12])
}

fn key(label: &str) -> String {
    syncguard::conformance::unique_key(label)
}

/// A backend whose pool connects as `application`.
async fn backend_as(application: &str, config: PostgresConfig) -> PostgresBackend {
    backend_of(application, config, 8).await
}

/// A backend whose pool of up to `connections` connects as `application`.
async fn backend_of(
    application: &str,
    config: PostgresConfig,
    connections: u32,
) -> PostgresBackend {
    let options = PgConnectOptions::from_str(&postgres_url())
        .expect("a PostgreSQL URL")
        .application_name(application);
    let pool = PostgresBackend::pool_options()
        .max_connections(connections)
        .connect_with(options)
        .await
        .expect("connect to the test PostgreSQL");
    setup_schema(&pool, &config).await.expect("setup_schema");
    PostgresBackend::new(pool, config).expect("valid config")
}

async fn admin() -> PgConnection {
    PgConnection::connect(&postgres_url()).await.unwrap()
}

/// The server pids of the listening connections of the backend whose pool is `application`.
async fn listener_pids(admin: &mut PgConnection, application: &str) -> Vec<i32> {
    sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1 ORDER BY pid")
        .bind(format!("{application} (syncguard listener)"))
        .fetch_all(admin)
        .await
        .unwrap()
}

/// Waits until the backend's one listening connection is there (and, given `not`, is another
/// one than `not`); its pid.
async fn listening(admin: &mut PgConnection, application: &str, not: Option<i32>) -> i32 {
    let deadline = Instant::now() + PROMPT;
    loop {
        let pids = listener_pids(admin, application).await;
        if let [pid] = pids[..]
            && Some(pid) != not
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no listening connection (other than {not:?}): {pids:?}"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// Waiters that poll every `poll` for up to two minutes, with a long ttl.
fn waiting_every(poll: Duration) -> LockOptions {
    LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .retry(
            RetryPolicy::wait_for(Duration::from_secs(120))
                .with_backoff(Backoff::Fixed)
                .with_jitter(Jitter::None)
                .with_base_delay(poll),
        )
        .build()
        .expect("valid options")
}

fn spawn_waiter(
    backend: &PostgresBackend,
    key: &str,
    options: LockOptions,
) -> JoinHandle<Result<LockGuard, LockError>> {
    let (backend, key) = (backend.clone(), key.to_owned());
    tokio::spawn(async move { syncguard::acquire(&backend, &key, &options).await })
}

/// The waiter's guard, and how long after `since` it came.
async fn woken(
    waiter: JoinHandle<Result<LockGuard, LockError>>,
    since: Instant,
    within: Duration,
) -> (LockGuard, Duration) {
    let guard = timeout(within, waiter)
        .await
        .unwrap_or_else(|_| panic!("the waiter got the lock within {within:?}"))
        .unwrap()
        .expect("the waiter takes the lock");
    (guard, since.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_release_wakes_a_waiter_far_sooner_than_its_poll() {
    let application = unique_application();
    let backend = backend_as(&application, PostgresConfig::new()).await;
    let mut admin = admin().await;
    let key = key("notified");
    let mut handoffs = Vec::new();
    let mut holder = backend
        .acquire(&key, Duration::from_secs(60))
        .await
        .unwrap()
        .lease()
        .unwrap();
    for _ in 0..5 {
        let waiter = spawn_waiter(&backend, &key, waiting_every(SLOW_POLL));
        // Its first attempt refused, it sleeps (its poll and the holder's lease are far off).
        sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished());
        let released = Instant::now();
        assert!(
            backend
                .release(&holder.lock_id)
                .await
                .unwrap()
                .is_released()
        );
        let (guard, handoff) = woken(waiter, released, PROMPT).await;
        assert!(guard.fence() > holder.fence);
        handoffs.push(handoff);
        guard.release().await.unwrap();
        holder = backend
            .acquire(&key, Duration::from_secs(60))
            .await
            .unwrap()
            .lease()
            .unwrap();
    }
    println!("release to the waiter's lock: {handoffs:?}");
    handoffs.sort();
    assert!(
        handoffs[2] < Duration::from_secs(2),
        "the median hand-over takes milliseconds, not a poll: {handoffs:?}"
    );
    // One listening connection for the backend, however many waits.
    assert_eq!(listener_pids(&mut admin, &application).await.len(), 1);
    assert!(
        backend
            .release(&holder.lock_id)
            .await
            .unwrap()
            .is_released()
    );
}

/// A test connection listening on `channel`.
async fn listen_on(channel: &str) -> PgListener {
    let mut listener = PgListener::connect(&postgres_url()).await.unwrap();
    listener.listen(channel).await.unwrap();
    listener
}

/// The next notification's payload, if one comes within half a second.
async fn next_payload(listener: &mut PgListener) -> Option<String> {
    timeout(Duration::from_millis(500), listener.recv())
        .await
        .ok()
        .map(|received| received.unwrap().payload().to_owned())
}

/// A channel no other test (or run) uses.
fn unique_channel() -> String {
    format!(
        "sgtest_{}",
        &LockId::generate().as_str()[..12].replace('-', "_")
    )
}

/// The stored mark of `key`'s lock row, and the transaction that wrote the row's version.
async fn mark_of(backend: &PostgresBackend, key: &str) -> (Option<bool>, String) {
    let storage_key = syncguard::backend::key::make_storage_key("", key, 1700, 0).unwrap();
    sqlx::query_as("SELECT contended, xmin::text FROM syncguard_locks WHERE key = $1")
        .bind(storage_key)
        .fetch_one(backend.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_release_of_a_contended_lock_sends_a_notification() {
    let channel = unique_channel();
    let config = PostgresConfig::new().with_release_channel(&channel);
    assert_eq!(config.release_channel(), channel);
    let backend = backend_as(&unique_application(), config.clone()).await;
    let mut listener = listen_on(&channel).await;
    let ttl = Duration::from_secs(30);

    // Nobody refused: the release sends nothing, however many times the holder extends and
    // re-enters.
    let key_a = key("uncontended");
    for _ in 0..3 {
        let lease = backend.acquire(&key_a, ttl).await.unwrap().lease().unwrap();
        assert!(
            backend
                .extend(&lease.lock_id, ttl)
                .await
                .unwrap()
                .expires_at_ms()
                .is_some()
        );
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
    let held = backend
        .acquire_as(&key_a, ttl, "client-a")
        .await
        .unwrap()
        .lease()
        .unwrap();
    backend
        .acquire_as(&key_a, ttl, "client-a")
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert!(backend.release(&held.lock_id).await.unwrap().is_released());
    assert_eq!(next_payload(&mut listener).await, None, "nothing announced");

    // Refused three times (plain, with a holder, from a one-attempt try): the release sends one
    // notification, with the normalized key ("é" composed), exactly what waiters queue on.
    let decomposed = format!("{}:e\u{301}", key("payload"));
    let lease = backend
        .acquire(&decomposed, ttl)
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(mark_of(&backend, &decomposed).await.0, Some(false));
    assert!(
        backend
            .acquire(&decomposed, ttl)
            .await
            .unwrap()
            .is_contended()
    );
    let (mark, written) = mark_of(&backend, &decomposed).await;
    assert_eq!(mark, Some(true), "the refusal marked the lock");
    assert!(
        backend
            .acquire_as(&decomposed, ttl, "client-b")
            .await
            .unwrap()
            .is_contended()
    );
    assert!(
        syncguard::try_acquire(&backend, &decomposed, &LockOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        mark_of(&backend, &decomposed).await,
        (Some(true), written),
        "later refusals write nothing"
    );
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    let composed = decomposed.replace("e\u{301}", "\u{e9}");
    assert_eq!(
        next_payload(&mut listener).await.as_deref(),
        Some(composed.as_str())
    );
    assert_eq!(
        next_payload(&mut listener).await,
        None,
        "one notification per release"
    );

    // The next hold of the key starts unmarked.
    let lease = backend
        .acquire(&decomposed, ttl)
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    assert_eq!(
        next_payload(&mut listener).await,
        None,
        "a new hold is not contended"
    );

    // A holder re-entering keeps the mark.
    let key_b = key("reentered");
    let held = backend
        .acquire_as(&key_b, ttl, "client-a")
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert!(
        backend
            .acquire_as(&key_b, ttl, "client-b")
            .await
            .unwrap()
            .is_contended()
    );
    let again = backend
        .acquire_as(&key_b, ttl, "client-a")
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(again.lock_id, held.lock_id);
    assert!(backend.release(&held.lock_id).await.unwrap().is_released());
    let heard = next_payload(&mut listener).await.expect("announced");
    assert!(heard.starts_with("conformance:reentered:"), "{heard}");

    // A contended lock that expires announces nothing (no release): its release is refused, and
    // the lock that takes its place is a new, uncontended hold.
    let key_c = key("expired");
    let short = backend
        .acquire(&key_c, Duration::from_millis(1))
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert!(backend.acquire(&key_c, ttl).await.unwrap().is_contended());
    sleep(Duration::from_millis(1_200)).await;
    assert!(!backend.release(&short.lock_id).await.unwrap().is_released());
    let next = backend.acquire(&key_c, ttl).await.unwrap().lease().unwrap();
    assert_eq!(
        mark_of(&backend, &key_c).await.0,
        Some(false),
        "taken over, unmarked"
    );
    assert!(backend.release(&next.lock_id).await.unwrap().is_released());
    assert_eq!(
        next_payload(&mut listener).await,
        None,
        "nothing was announced"
    );

    // A backend configured without notifications releases silently, contended or not, and
    // listens to nothing.
    let silent = backend_as(
        &unique_application(),
        config.clone().with_release_notifications(false),
    )
    .await;
    assert!(
        silent.release_notifier().is_none(),
        "a silent backend listens to nothing"
    );
    let key_d = key("quiet");
    let quiet = silent.acquire(&key_d, ttl).await.unwrap().lease().unwrap();
    assert!(backend.acquire(&key_d, ttl).await.unwrap().is_contended());
    assert!(silent.release(&quiet.lock_id).await.unwrap().is_released());
    assert_eq!(
        next_payload(&mut listener).await,
        None,
        "nothing was announced"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_listener_costs_no_wait_and_comes_back() {
    let application = unique_application();
    let backend = backend_as(&application, PostgresConfig::new()).await;
    let mut admin = admin().await;
    let key = key("killed-listener");
    let holder = backend
        .acquire(&key, Duration::from_secs(60))
        .await
        .unwrap()
        .lease()
        .unwrap();
    // Nothing waited yet: nothing listens.
    assert!(listener_pids(&mut admin, &application).await.is_empty());
    let waiter = spawn_waiter(&backend, &key, waiting_every(SLOW_POLL));
    let first = listening(&mut admin, &application, None).await;
    sleep(Duration::from_millis(300)).await;

    // The listener killed, and the lock released right after: whether the release comes
    // before or after the listener is back, the waiter gets the lock at once (a release it
    // may have missed is tried when the listener listens again), not at its 30 s poll.
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(terminated);
    let released = Instant::now();
    assert!(
        backend
            .release(&holder.lock_id)
            .await
            .unwrap()
            .is_released()
    );
    let (guard, handoff) = woken(waiter, released, PROMPT).await;
    println!("hand-over across the killed listener: {handoff:?}");

    // Back, on another connection; a release wakes waiters promptly again.
    let second = listening(&mut admin, &application, Some(first)).await;
    assert_ne!(first, second);
    let waiter = spawn_waiter(&backend, &key, waiting_every(SLOW_POLL));
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    let released = Instant::now();
    guard.release().await.unwrap();
    let (guard, handoff) = woken(waiter, released, PROMPT).await;
    println!("hand-over after the reconnect: {handoff:?}");
    assert!(handoff < Duration::from_secs(5), "{handoff:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_by_peers_that_never_notify_are_found_by_polling() {
    let backend = backend_as(&unique_application(), PostgresConfig::new()).await;
    let silent = backend_as(
        &unique_application(),
        PostgresConfig::new().with_release_notifications(false),
    )
    .await;
    let poll = Duration::from_secs(2);

    // A backend configured not to notify.
    let key_a = key("silent-peer");
    let held = silent
        .acquire(&key_a, Duration::from_secs(60))
        .await
        .unwrap()
        .lease()
        .unwrap();
    let waiter = spawn_waiter(&backend, &key_a, waiting_every(poll));
    sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(silent.release(&held.lock_id).await.unwrap().is_released());
    let (guard, waited) = woken(waiter, released, poll + PROMPT).await;
    println!("found by polling after a silent release: {waited:?}");
    guard.release().await.unwrap();

    // The TypeScript reference's release transaction, run by hand.
    let key_b = key("reference-peer");
    let mut conn = admin().await;
    let (_, lock_id) = pg_reference::reference_acquire_with_id(&mut conn, &key_b, 60_000)
        .await
        .expect("free");
    let waiter = spawn_waiter(&backend, &key_b, waiting_every(poll));
    sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(pg_reference::reference_release(&mut conn, &lock_id).await);
    let (guard, waited) = woken(waiter, released, poll + PROMPT).await;
    println!("found by polling after a reference release: {waited:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_reports_the_holders_expiry_and_waiters_wake_at_the_lease_end() {
    let backend = backend_as(&unique_application(), PostgresConfig::new()).await;
    let key = key("expiry");
    let ttl = Duration::from_secs(2);
    let holder = backend.acquire(&key, ttl).await.unwrap().lease().unwrap();
    let refusal = |outcome: AcquireOutcome| match outcome {
        AcquireOutcome::Contended(contention) => contention.holder_expires_at_ms,
        other => panic!("the key is held: {other:?}"),
    };
    // Plain and holder-aware acquires, and a holder re-entering, report the stored expiry.
    let plain = refusal(backend.acquire(&key, ttl).await.unwrap());
    let with_holder = refusal(backend.acquire_as(&key, ttl, "client-b").await.unwrap());
    assert_eq!(plain, Some(holder.expires_at_ms));
    assert_eq!(with_holder, Some(holder.expires_at_ms));
    let key_as = format!("{key}:as");
    let held_as = backend
        .acquire_as(&key_as, Duration::from_secs(30), "client-a")
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(
        refusal(backend.acquire_as(&key_as, ttl, "client-b").await.unwrap()),
        Some(held_as.expires_at_ms)
    );

    // Nobody releases: the waiter tries when the lease (and its tolerance) ends, not at its
    // 30 s poll.
    let started = Instant::now();
    let waiter = spawn_waiter(&backend, &key, waiting_every(SLOW_POLL));
    let (guard, waited) = woken(waiter, started, ttl + PROMPT).await;
    println!("woken at the lease end after {waited:?}");
    assert!(guard.fence() > holder.fence);
    assert!(waited >= Duration::from_millis(1_500), "{waited:?}");
    guard.release().await.unwrap();
    assert!(
        backend
            .release(&held_as.lock_id)
            .await
            .unwrap()
            .is_released()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waits_leave_nothing_held() {
    let backend = backend_as(&unique_application(), PostgresConfig::new()).await;
    let options = waiting_every(SLOW_POLL);
    for round in 0..10 {
        let key = key("cancelled");
        let holder = backend
            .acquire(&key, Duration::from_secs(60))
            .await
            .unwrap()
            .lease()
            .unwrap();
        let waiter = spawn_waiter(&backend, &key, options.clone());
        sleep(Duration::from_millis(200)).await;
        // Cancelled while waiting, or (racing the release) in the middle of its attempt, or
        // just after it took the lock: whatever it took is released.
        if round % 2 == 0 {
            waiter.abort();
            assert!(
                backend
                    .release(&holder.lock_id)
                    .await
                    .unwrap()
                    .is_released()
            );
        } else {
            assert!(
                backend
                    .release(&holder.lock_id)
                    .await
                    .unwrap()
                    .is_released()
            );
            sleep(Duration::from_millis(round)).await;
            waiter.abort();
        }
        let _ = waiter.await;
        let deadline = Instant::now() + PROMPT;
        while backend.is_locked(&key).await.unwrap() {
            assert!(
                Instant::now() < deadline,
                "round {round}: the key stayed held"
            );
            sleep(Duration::from_millis(50)).await;
        }
    }
    let notifier = backend.release_notifier().unwrap();
    assert!(!notifier.is_watched(), "no waiter is left queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_starts_once_something_waits_and_ends_with_the_backend() {
    let application = unique_application();
    let backend = backend_as(&application, PostgresConfig::new()).await;
    let mut admin = admin().await;
    let key = key("lifecycle");
    // Operations alone never listen.
    let lease = backend
        .acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert!(
        syncguard::try_acquire(&backend, &key, &LockOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    sleep(Duration::from_millis(200)).await;
    assert!(listener_pids(&mut admin, &application).await.is_empty());

    // Clones share one listening connection.
    let clone = backend.clone();
    assert!(backend.release_notifier().is_some());
    assert!(clone.release_notifier().is_some());
    listening(&mut admin, &application, None).await;
    sleep(Duration::from_millis(200)).await;
    assert_eq!(listener_pids(&mut admin, &application).await.len(), 1);

    // Gone with the last clone.
    drop(backend);
    sleep(Duration::from_millis(300)).await;
    assert_eq!(
        listener_pids(&mut admin, &application).await.len(),
        1,
        "a clone is left"
    );
    drop(clone);
    let deadline = Instant::now() + PROMPT;
    while !listener_pids(&mut admin, &application).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the listening connection outlived the backend"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// What announcing releases costs uncontended acquire+release cycles: cycles per second on keys
/// of their own at 1, 4 and 16 tasks, with release notifications on (the backend listening)
/// and off, alternately, three runs each. A measurement, not a check: run it alone, with
/// `cargo test --release ... -- --ignored --nocapture release_notification_cost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it alone"]
async fn release_notification_cost() {
    let run_for = Duration::from_secs(3);
    let on = backend_of(&unique_application(), PostgresConfig::new(), 16).await;
    let off = backend_of(
        &unique_application(),
        PostgresConfig::new().with_release_notifications(false),
        16,
    )
    .await;
    // Listening, as a backend whose waiters wake on release is.
    let _notifier = on.release_notifier().expect("notifications on");
    async fn cycles(backend: &PostgresBackend, tasks: usize, run_for: Duration) -> f64 {
        let deadline = Instant::now() + run_for;
        let workers: Vec<_> = (0..tasks)
            .map(|_| {
                let (backend, key) = (backend.clone(), key("cost"));
                tokio::spawn(async move {
                    let mut done = 0u64;
                    while Instant::now() < deadline {
                        let lease = backend
                            .acquire(&key, Duration::from_secs(30))
                            .await
                            .unwrap()
                            .lease()
                            .expect("a key of its own");
                        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let mut total = 0;
        for worker in workers {
            total += worker.await.unwrap();
        }
        total as f64 / run_for.as_secs_f64()
    }
    for tasks in [1, 4, 16] {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            with.push(cycles(&on, tasks, run_for).await);
            without.push(cycles(&off, tasks, run_for).await);
        }
        let median = |mut runs: Vec<f64>| {
            runs.sort_by(f64::total_cmp);
            runs[runs.len() / 2]
        };
        println!(
            "{tasks:>2} tasks: cycles/s with notifications {:.0}, without {:.0} (medians of {with:.0?} and {without:.0?})",
            median(with.clone()),
            median(without.clone())
        );
    }
}

/// A backend of its own for a waiter, listening already.
async fn listening_backend(admin: &mut PgConnection, config: &PostgresConfig) -> PostgresBackend {
    let application = unique_application();
    let backend = backend_as(&application, config.clone()).await;
    assert!(backend.release_notifier().is_some());
    listening(admin, &application, None).await;
    backend
}

/// A waiter that takes the lock and gives it back at once; how long after `since` it had it.
fn spawn_passing_waiter(
    backend: &PostgresBackend,
    key: &str,
    since: Instant,
) -> JoinHandle<Duration> {
    let waiter = spawn_waiter(backend, key, waiting_every(SLOW_POLL));
    tokio::spawn(async move {
        let guard = waiter.await.unwrap().expect("the waiter takes the lock");
        let took = since.elapsed();
        guard.release().await.unwrap();
        took
    })
}

/// Waits about `delay`, more precisely than a timer does (it spins).
fn spin_for(delay: Duration) {
    let until = std::time::Instant::now() + delay;
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// A release that races a waiter's refused acquire: whether it commits before the refusal reads
/// the lock (the waiter then takes it at once), or after the refusal marked it contended (it is
/// then announced), never in between, where it would be unannounced and leave the waiter asleep
/// until its 30 s poll. The release comes from another backend (another process), so only an
/// announcement wakes the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_racing_a_refusal_still_wakes_the_waiter() {
    const ROUNDS: u32 = 200;
    let channel = unique_channel();
    let config = PostgresConfig::new().with_release_channel(&channel);
    let mut admin = admin().await;
    let holder = backend_as(&unique_application(), config.clone()).await;
    let waiting = listening_backend(&mut admin, &config).await;
    let mut heard = listen_on(&channel).await;
    let (mut announced, mut silent) = (0, 0);
    let mut slowest = Duration::ZERO;
    for round in 0..ROUNDS {
        let key = key("race");
        let held = holder
            .acquire(&key, Duration::from_secs(60))
            .await
            .unwrap()
            .lease()
            .unwrap();
        let started = Instant::now();
        let waiter = spawn_passing_waiter(&waiting, &key, started);
        // From at once to well after the waiter's first attempt, in steps of 0.1 ms.
        spin_for(Duration::from_micros(u64::from(round % 41) * 100));
        assert!(holder.release(&held.lock_id).await.unwrap().is_released());
        let took = timeout(PROMPT, waiter)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the waiter slept through the release"))
            .unwrap();
        slowest = slowest.max(took);
        // The waiter's own release is uncontended: only the holder's can be announced.
        match timeout(Duration::from_millis(20), heard.recv()).await {
            Ok(notification) => {
                assert_eq!(notification.unwrap().payload(), key);
                announced += 1;
            }
            Err(_) => silent += 1,
        }
    }
    // A late notification would be the last round's.
    assert!(next_payload(&mut heard).await.is_none());
    println!(
        "{ROUNDS} rounds: the release was announced in {announced} (refused first), silent in \
         {silent} (released first); the slowest waiter had the lock after {slowest:?}"
    );
    assert!(
        slowest < Duration::from_secs(5),
        "every waiter woke far sooner than its 30 s poll: {slowest:?}"
    );
    assert!(announced > 0 && silent > 0, "both orders were raced");
}

/// Waiters of two processes (two on one backend, one on another) and a holder on a third pass a
/// key around as fast as they can, round after round: refusals keep racing releases, and the
/// waiters of one process queue behind the one of theirs that took the lock (it wakes them
/// itself when its release is not announced). Each one has the lock far sooner than its 30 s
/// poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_several_processes_all_wake_promptly_while_releases_race_refusals() {
    const ROUNDS: u32 = 40;
    let config = PostgresConfig::new();
    let mut admin = admin().await;
    let holder = backend_as(&unique_application(), config.clone()).await;
    let one = listening_backend(&mut admin, &config).await;
    let other = listening_backend(&mut admin, &config).await;
    let mut slowest = Duration::ZERO;
    for round in 0..ROUNDS {
        let key = key("race-many");
        let held = holder
            .acquire(&key, Duration::from_secs(60))
            .await
            .unwrap()
            .lease()
            .unwrap();
        let started = Instant::now();
        let waiters =
            [&one, &other, &one].map(|backend| spawn_passing_waiter(backend, &key, started));
        spin_for(Duration::from_micros(u64::from(round % 21) * 100));
        assert!(holder.release(&held.lock_id).await.unwrap().is_released());
        for waiter in waiters {
            let took = timeout(PROMPT, waiter)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a waiter slept through a release"))
                .unwrap();
            slowest = slowest.max(took);
        }
    }
    println!("{ROUNDS} rounds of three waiters: the slowest had the lock after {slowest:?}");
    assert!(
        slowest < Duration::from_secs(5),
        "every waiter woke far sooner than its 30 s poll: {slowest:?}"
    );
}
