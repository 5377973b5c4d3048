//! Replicas: several `syncguard-server` processes (the built binary) on one PostgreSQL or one
//! Redis serve the same locks, because the holder lives in storage, not in a process (issue
//! 19, items 4 and 8).
//!
//! - **Contention** (`*_replicas_contend_for_one_lock`): two servers, eight HTTP clients on
//!   each (distinct instanceIds), acquiring one lock for about 3 s with 1-2 s leases: each
//!   holds it briefly (renewing or re-acquiring through either server now and then) and
//!   releases it through either server; every tenth holder lets its lease lapse instead.
//!   A monitor GETs the lock from both servers all along. Every answer is recorded with the
//!   times its request was sent and its answer received, and checked afterwards, with
//!   bounds that hold whatever the scheduling (see [`check`]).
//! - **Shared state** (`*_replicas_share_state`): the API's answers, field for field, with a
//!   lock acquired through one server and renewed, re-acquired and released through the
//!   other; a lapsed lease taken over across servers; a third server started, stopped
//!   (SIGTERM), restarted and crashed (SIGKILL) on the same backend, which sees the lock and
//!   continues its fence sequence, as does a server started after all the others stopped.
//!
//! They need the test services: `bash scripts/with-services.sh cargo test -p syncguard-server
//! --all-features --test replicas` (a test fails, saying so, when they are missing).

#[path = "support/replica.rs"]
mod replica;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::StatusCode;
use replica::{postgres_url, redis_url, unique_name};
use serde_json::json;
use support::process::ServerProcess;
use support::{Reply, TestServer};

/// The shared backend of a test.
#[derive(Clone, Copy, Debug)]
enum Store {
    Postgres,
    Redis,
}

impl Store {
    fn url(self) -> String {
        match self {
            Self::Postgres => postgres_url(),
            Self::Redis => redis_url(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Redis => "redis",
        }
    }
}

/// The wall clock in Unix milliseconds: the time authority of both backends here (PostgreSQL
/// and Redis run on this machine, so on this clock).
fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    since.as_secs() * 1000 + u64::from(since.subsec_millis())
}

/// Enough randomness for timings and choices (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `low..=high`.
    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

// ---------------------------------------------------------------------------------------------
// Contention
// ---------------------------------------------------------------------------------------------

const CLIENTS_PER_SERVER: usize = 8;
const RUN: Duration = Duration::from_secs(3);
/// The longest the run is stretched past [`RUN`] to see the last lapsed lease taken over and
/// a hold granted through each server.
const RUN_LIMIT: Duration = Duration::from_secs(10);
const LOCK: &str = "contended";
/// Every how many holds one lets its lease lapse.
const LAPSE_EVERY: u64 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Acquire,
    Renew,
    Release,
}

/// One answer to a client, with the times its request was sent and its answer received.
#[derive(Clone, Debug)]
struct Event {
    client: usize,
    instance: String,
    server: usize,
    op: Op,
    /// The leaseDuration asked for (acquire, renew).
    seconds: u64,
    sent: u64,
    received: u64,
    status: StatusCode,
    fence: Option<u64>,
    expiry: Option<u64>,
    lease: Option<u64>,
}

/// One GET of the monitor.
#[derive(Clone, Debug)]
struct Observation {
    server: usize,
    sent: u64,
    received: u64,
    fence: Option<u64>,
    expiry: Option<u64>,
}

/// One holder's hold of the lock: one fencing token.
#[derive(Debug)]
struct Hold {
    fence: u64,
    instance: String,
    /// The server of the acquire that granted it.
    server: usize,
    /// The grant happened between these two times (the acquire's request and answer).
    start_sent: u64,
    start_received: u64,
    /// The expiry of the latest grant (acquire, re-acquire or renew), which set the lease.
    expiry: u64,
    max_expiry: u64,
    /// Every expiry a grant of this hold reported.
    expiries: BTreeSet<u64>,
    /// The latest grant's leaseDuration.
    lease: u64,
    /// The release that ended it (request sent, answer received), if one did.
    release: Option<(u64, u64)>,
}

impl Hold {
    /// Until when the hold certainly lasted: until its release was sent, or until the lease
    /// ran out (a lease reported with expiry `e` ends at `e * 1000 + [0, 999]` ms, and counts
    /// as held for syncguard's 1 s tolerance after that: certainly until `(e + 1) * 1000`).
    fn certain_end(&self) -> u64 {
        let lease_end = (self.expiry + 1) * 1000;
        self.release
            .map_or(lease_end, |(sent, _)| sent.min(lease_end))
    }

    /// Until when it may have lasted: until its release was answered, or `(e + 2) * 1000`.
    fn possible_end(&self) -> u64 {
        let lease_end = (self.max_expiry + 2) * 1000;
        self.release
            .map_or(lease_end, |(_, received)| received.min(lease_end))
    }

    /// Whether the lease ran out rather than being released.
    fn lapsed(&self) -> bool {
        self.release
            .is_none_or(|(sent, _)| sent >= (self.expiry + 1) * 1000)
    }
}

/// What the clients share.
struct Run {
    namespace: String,
    servers: Vec<TestServer>,
    deadline: Instant,
    limit: Instant,
    holds: AtomicU64,
    /// Holds granted through each server.
    granted: [AtomicU64; 2],
    /// The fence of a lapsed lease no other holder has taken over yet (0: none).
    lapsed: AtomicU64,
    done: AtomicBool,
}

impl Run {
    /// Whether the clients stop: after [`RUN`], once the last lapsed lease was taken over and
    /// each server granted a hold (so that what the checks count happened), or at the limit.
    fn over(&self) -> bool {
        let now = Instant::now();
        now >= self.limit
            || (now >= self.deadline
                && self.lapsed.load(Ordering::SeqCst) == 0
                && self
                    .granted
                    .iter()
                    .all(|granted| granted.load(Ordering::SeqCst) > 0))
    }

    /// One call, recorded; the answer's shape is checked here (whatever the timing, a 200
    /// shows the caller's lock with a fence, a 423 LSC's refusal without one).
    async fn call(
        &self,
        client: usize,
        instance: &str,
        server: usize,
        op: Op,
        seconds: u64,
    ) -> Event {
        let http = &self.servers[server];
        let ns = self.namespace.as_str();
        let sent = now_ms();
        let reply = match op {
            Op::Acquire => http.acquire(ns, LOCK, instance, seconds).await,
            Op::Renew => http.renew(ns, LOCK, instance, seconds).await,
            Op::Release => http.release(ns, LOCK, instance).await,
        };
        let received = now_ms();
        let body = reply.json();
        let (fence, expiry, lease) = match (op, reply.status) {
            (Op::Acquire | Op::Renew, StatusCode::OK) => {
                assert_eq!(body["success"], true, "{op:?}: {body}");
                assert_eq!(body["owner"], "anonymous", "{op:?}: {body}");
                assert_eq!(body["instanceId"], instance, "{op:?}: {body}");
                assert_eq!(body["lockName"], LOCK, "{op:?}: {body}");
                (
                    Some(reply.fence_value()),
                    Some(reply.expiry()),
                    Some(body["leaseDuration"].as_u64().expect("a leaseDuration")),
                )
            }
            (Op::Release, StatusCode::OK) => {
                assert_eq!(
                    body,
                    json!({"success":true,"namespace":ns,"lockName":LOCK}),
                    "{op:?}"
                );
                assert_eq!(reply.fence(), None, "a release shows no fence");
                (None, None, None)
            }
            (_, StatusCode::LOCKED) => {
                assert_eq!(
                    body,
                    json!({"success":false,"namespace":ns,"lockName":LOCK}),
                    "{op:?}"
                );
                assert_eq!(reply.fence(), None, "a refusal shows no fence");
                (None, None, None)
            }
            (_, status) => panic!(
                "{op:?} by {instance} through server {server}: {status} {}",
                reply.text
            ),
        };
        Event {
            client,
            instance: instance.to_owned(),
            server,
            op,
            seconds,
            sent,
            received,
            status: reply.status,
            fence,
            expiry,
            lease,
        }
    }
}

/// Sleeps until the wall clock reads `until_ms`.
async fn sleep_until_ms(until_ms: u64) {
    let now = now_ms();
    if until_ms > now {
        tokio::time::sleep(Duration::from_millis(until_ms - now)).await;
    }
}

/// A client: acquires through its home server until it gets the lock, holds it for 10 to
/// 60 ms (renewing or re-acquiring through either server now and then), and releases it
/// through either server; or, for every tenth hold, shortens its lease to 1 s and lets it
/// lapse, then comes back after it certainly ended.
async fn client(run: Arc<Run>, id: usize, home: usize) -> Vec<Event> {
    let instance = format!("client-{id:02}");
    let mut rng = Rng::new(now_ms() ^ (id as u64 + 1) << 32);
    let servers = run.servers.len();
    let mut events = Vec::new();
    while !run.over() {
        let seconds = rng.range(1, 2);
        let acquired = run.call(id, &instance, home, Op::Acquire, seconds).await;
        events.push(acquired.clone());
        if acquired.status != StatusCode::OK {
            tokio::time::sleep(Duration::from_millis(rng.range(10, 40))).await;
            continue;
        }
        let fence = acquired.fence.unwrap();
        let pending = run.lapsed.load(Ordering::SeqCst);
        if pending != 0 && fence > pending {
            let _ = run
                .lapsed
                .compare_exchange(pending, 0, Ordering::SeqCst, Ordering::SeqCst);
        }
        run.granted[home].fetch_add(1, Ordering::SeqCst);
        let hold = run.holds.fetch_add(1, Ordering::SeqCst);
        if hold % LAPSE_EVERY == 5 && Instant::now() < run.deadline {
            // Let it lapse, after a re-acquire that sets the lease to 1 s (the same hold).
            let other = rng.range(0, servers as u64 - 1) as usize;
            let reset = run.call(id, &instance, other, Op::Acquire, 1).await;
            events.push(reset.clone());
            let expiry = reset.expiry.or(acquired.expiry).unwrap();
            run.lapsed.store(fence, Ordering::SeqCst);
            // Certainly over at (expiry + 2) s; then a renew must be refused.
            sleep_until_ms((expiry + 2) * 1000 + 50).await;
            let late = run.call(id, &instance, other, Op::Renew, 1).await;
            events.push(late);
            continue;
        }
        let hold_for = Duration::from_millis(rng.range(10, 60));
        let started = Instant::now();
        if rng.chance(40) {
            let server = rng.range(0, servers as u64 - 1) as usize;
            let op = if rng.chance(65) {
                Op::Renew
            } else {
                Op::Acquire
            };
            let event = run.call(id, &instance, server, op, rng.range(1, 2)).await;
            events.push(event);
        }
        tokio::time::sleep(hold_for.saturating_sub(started.elapsed())).await;
        let server = rng.range(0, servers as u64 - 1) as usize;
        events.push(run.call(id, &instance, server, Op::Release, 0).await);
        tokio::time::sleep(Duration::from_millis(rng.range(0, 20))).await;
    }
    events
}

/// One GET through `server`, recorded.
async fn observe(run: &Run, server: usize) -> Observation {
    let ns = run.namespace.as_str();
    let sent = now_ms();
    let reply = run.servers[server].status(ns, LOCK).await;
    let received = now_ms();
    assert_eq!(reply.status, StatusCode::OK, "GET: {}", reply.text);
    let body = reply.json();
    let held = body.get("expiry").is_some();
    if held {
        assert_eq!(
            body,
            json!({"namespace":ns,"lockName":LOCK,"owner":"anonymous","expiry":body["expiry"]})
        );
    } else {
        assert_eq!(body, json!({"namespace":ns,"lockName":LOCK}));
        assert_eq!(reply.fence(), None, "a free lock shows no fence");
    }
    Observation {
        server,
        sent,
        received,
        fence: held.then(|| reply.fence_value()),
        expiry: held.then(|| reply.expiry()),
    }
}

/// GETs the lock through both servers at once, every 20 ms, until the clients are done.
async fn monitor(run: Arc<Run>) -> Vec<Observation> {
    let mut observations = Vec::new();
    while !run.done.load(Ordering::SeqCst) {
        let (a, b) = tokio::join!(observe(&run, 0), observe(&run, 1));
        observations.push(a);
        observations.push(b);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    observations
}

/// What a run did, for the report.
#[derive(Debug, Default)]
struct Tally {
    holds: usize,
    lowest_fence: u64,
    highest_fence: u64,
    holds_per_server: [usize; 2],
    handovers_between_servers: usize,
    acquires_granted: usize,
    reacquires: usize,
    renews_granted: usize,
    releases: usize,
    refusals: usize,
    lapsed_taken_over: usize,
    calls_through_other_server: usize,
    gets: usize,
    gets_during_certain_hold: [usize; 2],
    gets_free: usize,
    /// Mean and longest time from a call's request to its answer, in ms.
    mean_call_ms: u64,
    longest_call_ms: u64,
    /// From the first call to the last answer, in ms.
    span_ms: u64,
}

/// Checks a run's records:
///
/// - each fencing token belongs to one holder, and a holder keeps its token while its lease
///   certainly lasts (renews and re-acquires answered before `(expiry + 1) s` are granted,
///   with the same token); a renew or re-acquire after its lease certainly ended
///   (`(expiry + 2) s`) is not (a refused renew, a new token);
/// - acquire sets `expiry` to now + D (`leaseDuration` D), renew adds D to both;
/// - **no two holders at once, fences strictly increasing**: for tokens `f < g`, the hold of
///   `g` was granted (its acquire answered) no earlier than the hold of `f` certainly ended
///   (its release sent, or `(expiry + 1) s`) — both at once would overlap, and `g` granted
///   earlier would be a token going backwards;
/// - GET through either server, while a hold certainly lasted, shows that hold's token and
///   one of its expiries; a GET showing a token falls within that hold's possible span; a GET
///   showing the lock free was not answered within a certain hold.
fn check(events: &[Event], observations: &[Observation]) -> (Tally, Vec<String>) {
    let mut violations = Vec::new();
    let mut holds: BTreeMap<u64, Hold> = BTreeMap::new();
    let mut tally = Tally::default();
    let mut by_client: BTreeMap<usize, Vec<&Event>> = BTreeMap::new();
    for event in events {
        by_client.entry(event.client).or_default().push(event);
    }
    for (client, events) in &by_client {
        let home = client % 2;
        let mut current: Option<u64> = None;
        for event in events {
            // Acquires start at the home server; renews, re-acquires and releases go
            // through either.
            if event.server != home {
                tally.calls_through_other_server += 1;
            }
            let held = current.map(|fence| {
                let hold = &holds[&fence];
                (fence, hold.expiry, hold.lease)
            });
            // Whether the caller's hold certainly lasted until the answer, or certainly
            // ended before the request.
            let certainly_held =
                held.is_some_and(|(_, expiry, _)| event.received < (expiry + 1) * 1000);
            let certainly_over =
                held.is_some_and(|(_, expiry, _)| event.sent >= (expiry + 2) * 1000);
            let what = format!(
                "{:?} by {} through server {} (sent {}, answered {}, {})",
                event.op, event.instance, event.server, event.sent, event.received, event.status
            );
            match (event.op, event.status) {
                (Op::Acquire, StatusCode::OK) => {
                    let fence = event.fence.unwrap();
                    let expiry = event.expiry.unwrap();
                    let (low, high) = (event.sent / 1000, event.received / 1000);
                    if !(low + event.seconds..=high + event.seconds).contains(&expiry) {
                        violations.push(format!(
                            "{what}: expiry {expiry} is not now + {} s",
                            event.seconds
                        ));
                    }
                    if event.lease != Some(event.seconds) {
                        violations.push(format!("{what}: leaseDuration {:?}", event.lease));
                    }
                    if let Some((held_fence, _, _)) = held {
                        tally.reacquires += 1;
                        if certainly_held && fence != held_fence {
                            violations.push(format!(
                                "{what}: re-acquired its live hold {held_fence} but got fence {fence}"
                            ));
                        }
                        if certainly_over && fence == held_fence {
                            violations.push(format!(
                                "{what}: its hold {held_fence} had ended, yet the acquire kept its fence"
                            ));
                        }
                    }
                    if current != Some(fence) {
                        if let Some(other) = holds.get(&fence) {
                            violations.push(format!(
                                "{what}: fence {fence} granted again (before: to {})",
                                other.instance
                            ));
                        } else {
                            holds.insert(
                                fence,
                                Hold {
                                    fence,
                                    instance: event.instance.clone(),
                                    server: event.server,
                                    start_sent: event.sent,
                                    start_received: event.received,
                                    expiry,
                                    max_expiry: expiry,
                                    expiries: BTreeSet::new(),
                                    lease: event.seconds,
                                    release: None,
                                },
                            );
                        }
                    }
                    let hold = holds.get_mut(&fence).unwrap();
                    hold.expiry = expiry;
                    hold.max_expiry = hold.max_expiry.max(expiry);
                    hold.expiries.insert(expiry);
                    hold.lease = event.seconds;
                    current = Some(fence);
                    tally.acquires_granted += 1;
                }
                (Op::Renew, StatusCode::OK) => {
                    let fence = event.fence.unwrap();
                    let expiry = event.expiry.unwrap();
                    tally.renews_granted += 1;
                    let Some((held_fence, held_expiry, held_lease)) = held else {
                        violations.push(format!("{what}: renewed a lock it did not hold"));
                        continue;
                    };
                    if fence != held_fence {
                        violations.push(format!(
                            "{what}: renew of hold {held_fence} answered fence {fence}"
                        ));
                        continue;
                    }
                    if certainly_over {
                        violations.push(format!("{what}: renewed a lease that had ended"));
                    }
                    if expiry != held_expiry + event.seconds {
                        violations.push(format!(
                            "{what}: expiry {expiry}, not {held_expiry} + {}",
                            event.seconds
                        ));
                    }
                    if event.lease != Some(held_lease + event.seconds) {
                        violations.push(format!(
                            "{what}: leaseDuration {:?}, not {held_lease} + {}",
                            event.lease, event.seconds
                        ));
                    }
                    let hold = holds.get_mut(&fence).unwrap();
                    hold.expiry = expiry;
                    hold.max_expiry = hold.max_expiry.max(expiry);
                    hold.expiries.insert(expiry);
                    hold.lease = held_lease + event.seconds;
                }
                (Op::Release, StatusCode::OK) => {
                    tally.releases += 1;
                    if let Some(fence) = current.take() {
                        holds.get_mut(&fence).unwrap().release = Some((event.sent, event.received));
                    }
                }
                (_, StatusCode::LOCKED) => {
                    tally.refusals += 1;
                    if certainly_held {
                        violations.push(format!(
                            "{what}: refused while its hold {:?} certainly lasted",
                            current
                        ));
                    }
                    current = None;
                }
                (_, status) => violations.push(format!("{what}: unexpected {status}")),
            }
        }
    }

    // No two holders at once; fences strictly increasing in the order of the holds.
    let ordered: Vec<&Hold> = holds.values().collect();
    for (i, earlier) in ordered.iter().enumerate() {
        for later in &ordered[i + 1..] {
            if later.start_received < earlier.certain_end() {
                violations.push(format!(
                    "two holders at once: fence {} ({}, granted {}..{}, held certainly until {}) \
                     and fence {} ({}, granted by {})",
                    earlier.fence,
                    earlier.instance,
                    earlier.start_sent,
                    earlier.start_received,
                    earlier.certain_end(),
                    later.fence,
                    later.instance,
                    later.start_received
                ));
            }
            if later.start_received < earlier.start_sent {
                violations.push(format!(
                    "fences out of order: fence {} granted by {}, before fence {} (asked at {})",
                    later.fence, later.start_received, earlier.fence, earlier.start_sent
                ));
            }
        }
    }
    for pair in ordered.windows(2) {
        if pair[0].server != pair[1].server {
            tally.handovers_between_servers += 1;
        }
        if pair[0].lapsed() {
            tally.lapsed_taken_over += 1;
        }
    }

    // GETs.
    for observation in observations {
        tally.gets += 1;
        let certain = ordered.iter().find(|hold| {
            hold.start_received <= observation.sent && observation.received <= hold.certain_end()
        });
        let at = format!(
            "GET through server {} (sent {}, answered {})",
            observation.server, observation.sent, observation.received
        );
        match (observation.fence, certain) {
            (Some(fence), _) => {
                if let Some(hold) = certain {
                    tally.gets_during_certain_hold[observation.server] += 1;
                    if hold.fence != fence {
                        violations.push(format!(
                            "{at} showed fence {fence} while fence {} ({}) certainly held the lock",
                            hold.fence, hold.instance
                        ));
                    }
                }
                match holds.get(&fence) {
                    None => violations.push(format!("{at} showed fence {fence}, never granted")),
                    Some(hold) => {
                        if observation.received < hold.start_sent
                            || observation.sent > hold.possible_end()
                        {
                            violations.push(format!(
                                "{at} showed fence {fence} outside its hold ({}..{})",
                                hold.start_sent,
                                hold.possible_end()
                            ));
                        }
                        let expiry = observation.expiry.unwrap();
                        if !hold.expiries.contains(&expiry) {
                            violations.push(format!(
                                "{at} showed expiry {expiry} for fence {fence}, which was granted {:?}",
                                hold.expiries
                            ));
                        }
                    }
                }
            }
            (None, Some(hold)) => violations.push(format!(
                "{at} showed the lock free while fence {} ({}) certainly held it",
                hold.fence, hold.instance
            )),
            (None, None) => tally.gets_free += 1,
        }
    }

    let latencies = events.iter().map(|event| event.received - event.sent);
    tally.mean_call_ms = latencies.clone().sum::<u64>() / events.len().max(1) as u64;
    tally.longest_call_ms = latencies.max().unwrap_or(0);
    tally.span_ms = events.iter().map(|event| event.received).max().unwrap_or(0)
        - events.iter().map(|event| event.sent).min().unwrap_or(0);
    tally.holds = holds.len();
    tally.lowest_fence = holds.keys().next().copied().unwrap_or(0);
    tally.highest_fence = holds.keys().next_back().copied().unwrap_or(0);
    for hold in holds.values() {
        tally.holds_per_server[hold.server] += 1;
    }
    (tally, violations)
}

async fn contend(store: Store) {
    let url = store.url();
    let servers = ServerProcess::start_all(&[("A", &url), ("B", &url)]);
    let run = Arc::new(Run {
        namespace: unique_name(&format!("contend-{}", store.name())),
        servers: servers
            .iter()
            .map(|server| TestServer::client_for(server.address))
            .collect(),
        deadline: Instant::now() + RUN,
        limit: Instant::now() + RUN_LIMIT,
        holds: AtomicU64::new(0),
        granted: [AtomicU64::new(0), AtomicU64::new(0)],
        lapsed: AtomicU64::new(0),
        done: AtomicBool::new(false),
    });
    let watcher = tokio::spawn(monitor(Arc::clone(&run)));
    let clients: Vec<_> = (0..2 * CLIENTS_PER_SERVER)
        .map(|id| tokio::spawn(client(Arc::clone(&run), id, id % 2)))
        .collect();
    let mut events = Vec::new();
    for client in clients {
        events.extend(client.await.expect("a client failed"));
    }
    run.done.store(true, Ordering::SeqCst);
    let observations = watcher.await.expect("the monitor failed");

    let (tally, violations) = check(&events, &observations);
    println!(
        "{}: {} holds (fences {}..={}; {} through A, {} through B; {} handovers between the \
         servers; {} lapsed leases taken over), {} acquires granted ({} by a holder), {} renews \
         granted, {} releases, {} refusals, {} calls through the other server, {} GETs ({} and \
         {} through A and B during a certain hold, {} free), in {} ms; calls took {} ms on \
         average, {} ms at most",
        store.name(),
        tally.holds,
        tally.lowest_fence,
        tally.highest_fence,
        tally.holds_per_server[0],
        tally.holds_per_server[1],
        tally.handovers_between_servers,
        tally.lapsed_taken_over,
        tally.acquires_granted,
        tally.reacquires,
        tally.renews_granted,
        tally.releases,
        tally.refusals,
        tally.calls_through_other_server,
        tally.gets,
        tally.gets_during_certain_hold[0],
        tally.gets_during_certain_hold[1],
        tally.gets_free,
        tally.span_ms,
        tally.mean_call_ms,
        tally.longest_call_ms,
    );
    assert!(
        violations.is_empty(),
        "{} violations on {}, the first ones:\n{}\n{tally:#?}",
        violations.len(),
        store.name(),
        violations[..violations.len().min(20)].join("\n")
    );
    // The run exercised what it checks.
    assert!(tally.holds >= 5, "too few holds: {tally:#?}");
    assert!(
        tally.holds_per_server.iter().all(|&holds| holds > 0),
        "holds granted through each server: {tally:#?}"
    );
    assert!(tally.handovers_between_servers > 0, "{tally:#?}");
    assert!(tally.refusals > 0, "no contention: {tally:#?}");
    assert!(
        tally.lapsed_taken_over > 0,
        "no lapsed lease taken over: {tally:#?}"
    );
    assert!(tally.calls_through_other_server > 0, "{tally:#?}");
    assert!(
        tally.gets_during_certain_hold.iter().all(|&gets| gets > 0),
        "GETs through each server while a hold was certain: {tally:#?}"
    );
    for server in servers {
        server.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_replicas_contend_for_one_lock() {
    contend(Store::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_replicas_contend_for_one_lock() {
    contend(Store::Redis).await;
}

// ---------------------------------------------------------------------------------------------
// Shared state
// ---------------------------------------------------------------------------------------------

fn lease(reply: &Reply) -> u64 {
    reply.json()["leaseDuration"]
        .as_u64()
        .expect("a leaseDuration")
}

fn seconds_now() -> u64 {
    now_ms() / 1000
}

/// Acquires and checks LSC's body field for field; returns the answer.
async fn acquire_ok(
    http: &TestServer,
    ns: &str,
    name: &str,
    instance: &str,
    seconds: u64,
) -> Reply {
    let before = seconds_now();
    let reply = http.acquire(ns, name, instance, seconds).await;
    let after = seconds_now();
    assert_eq!(reply.status, StatusCode::OK, "{instance}: {}", reply.text);
    let expiry = reply.expiry();
    assert!(
        (before + seconds..=after + seconds).contains(&expiry),
        "expiry = now + D: {expiry}"
    );
    assert_eq!(
        reply.json(),
        json!({"success":true,"namespace":ns,"lockName":name,"owner":"anonymous",
               "instanceId":instance,"leaseDuration":seconds,"expiry":expiry})
    );
    reply.fence_value();
    reply
}

/// GET shows the lock held with `fence` and `expiry`.
async fn assert_held(http: &TestServer, ns: &str, name: &str, fence: u64, expiry: u64) {
    let status = http.status(ns, name).await;
    assert_eq!(status.status, StatusCode::OK);
    assert_eq!(
        status.json(),
        json!({"namespace":ns,"lockName":name,"owner":"anonymous","expiry":expiry})
    );
    assert_eq!(status.fence_value(), fence);
}

async fn assert_free(http: &TestServer, ns: &str, name: &str) {
    let status = http.status(ns, name).await;
    assert_eq!(status.status, StatusCode::OK);
    assert_eq!(status.json(), json!({"namespace":ns,"lockName":name}));
    assert_eq!(status.fence(), None);
}

fn assert_refused(reply: Reply, ns: &str, name: &str) {
    assert_eq!(reply.status, StatusCode::LOCKED, "{}", reply.text);
    assert_eq!(
        reply.json(),
        json!({"success":false,"namespace":ns,"lockName":name})
    );
    assert_eq!(reply.fence(), None);
}

fn assert_released(reply: Reply, ns: &str, name: &str) {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(
        reply.json(),
        json!({"success":true,"namespace":ns,"lockName":name})
    );
    assert_eq!(reply.fence(), None);
}

async fn share_state(store: Store) {
    let url = store.url();
    let ns = unique_name(&format!("shared-{}", store.name()));
    let ns = ns.as_str();
    let name = "handover";
    let mut servers = ServerProcess::start_all(&[("A", &url), ("B", &url)]);
    let b_process = servers.pop().unwrap();
    let a_process = servers.pop().unwrap();
    let a = TestServer::client_for(a_process.address);
    let b = TestServer::client_for(b_process.address);

    for http in [&a, &b] {
        let ready = http.get("/ready").await;
        assert_eq!(ready.status, StatusCode::OK, "{}", ready.text);
        assert_eq!(ready.json(), json!({"status":"UP"}));
        assert_free(http, ns, name).await;
    }

    // Acquired through A: B sees the same holder, the same expiry, the same fence.
    let acquired = acquire_ok(&a, ns, name, "alpha", 30).await;
    let first = acquired.fence_value();
    let expiry = acquired.expiry();
    assert_held(&a, ns, name, first, expiry).await;
    assert_held(&b, ns, name, first, expiry).await;

    // Another holder, through B: refused for every mutation, and nothing changes.
    assert_refused(b.acquire(ns, name, "beta", 30).await, ns, name);
    assert_refused(b.renew(ns, name, "beta", 30).await, ns, name);
    assert_refused(b.release(ns, name, "beta").await, ns, name);
    assert_held(&a, ns, name, first, expiry).await;

    // The holder renews through B: + D on the expiry and on the total lease.
    let renewed = b.renew(ns, name, "alpha", 10).await;
    assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.text);
    assert_eq!(
        renewed.json(),
        json!({"success":true,"namespace":ns,"lockName":name,"owner":"anonymous",
               "instanceId":"alpha","leaseDuration":40,"expiry":expiry + 10})
    );
    assert_eq!(renewed.fence_value(), first);
    assert_held(&a, ns, name, first, expiry + 10).await;

    // Re-acquires through B: the same hold (fence), the lease reset to now + D.
    let reset = acquire_ok(&b, ns, name, "alpha", 5).await;
    assert_eq!(
        reset.fence_value(),
        first,
        "same holder, same acquisition, same fence"
    );
    assert!(
        reset.expiry() < expiry + 10,
        "the reset shortened the lease"
    );
    // Renews through A after the reset: the total counts from the reset.
    let again = a.renew(ns, name, "alpha", 3).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert_eq!((again.expiry(), lease(&again)), (reset.expiry() + 3, 8));
    assert_eq!(again.fence_value(), first);
    assert_held(&b, ns, name, first, reset.expiry() + 3).await;

    // Released through B: free on both; releasing again (through A) is fine.
    assert_released(b.release(ns, name, "alpha").await, ns, name);
    assert_free(&a, ns, name).await;
    assert_free(&b, ns, name).await;
    assert_released(a.release(ns, name, "alpha").await, ns, name);

    // A new hold, through A, with a 1 s lease, left to lapse; B sees it until its expiry
    // second has passed, then free; then it is taken over through B, with a larger fence.
    let short = acquire_ok(&a, ns, name, "alpha", 1).await;
    let second = short.fence_value();
    assert!(second > first, "{second} > {first}");
    assert_refused(b.acquire(ns, name, "beta", 30).await, ns, name);
    let deadline = Instant::now() + Duration::from_secs(6);
    loop {
        let status = b.status(ns, name).await;
        let seen = seconds_now();
        if status.json().get("expiry").is_none() {
            assert!(
                seen > short.expiry(),
                "held through its expiry second {}: free at {seen}",
                short.expiry()
            );
            break;
        }
        assert_eq!(status.fence_value(), second);
        assert!(Instant::now() < deadline, "the 1 s lease never lapsed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_refused(a.renew(ns, name, "alpha", 5).await, ns, name);
    let taken = acquire_ok(&b, ns, name, "beta", 30).await;
    let third = taken.fence_value();
    assert!(third > second, "{third} > {second}");
    assert_refused(a.acquire(ns, name, "alpha", 30).await, ns, name);
    assert_refused(a.release(ns, name, "alpha").await, ns, name);
    assert_held(&a, ns, name, third, taken.expiry()).await;

    // A third server, started now, sees the lock; a new holder through it continues the
    // fence sequence.
    let c_process = ServerProcess::start("C", &url);
    let c = TestServer::client_for(c_process.address);
    assert_held(&c, ns, name, third, taken.expiry()).await;
    assert_released(c.release(ns, name, "beta").await, ns, name);
    let gamma = acquire_ok(&c, ns, name, "gamma", 60).await;
    let fourth = gamma.fence_value();
    assert!(fourth > third, "{fourth} > {third}");

    // Stopped (SIGTERM: its graceful shutdown must not release the API's locks) and started
    // again on the same backend: the lock is still there, in every server.
    c_process.stop();
    assert_held(&a, ns, name, fourth, gamma.expiry()).await;
    let c_process = ServerProcess::start("C (restarted)", &url);
    let c = TestServer::client_for(c_process.address);
    assert_held(&c, ns, name, fourth, gamma.expiry()).await;
    let renewed = c.renew(ns, name, "gamma", 10).await;
    assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.text);
    assert_eq!(
        (renewed.fence_value(), renewed.expiry(), lease(&renewed)),
        (fourth, gamma.expiry() + 10, 70)
    );

    // Crashed (SIGKILL) and started again: the same.
    c_process.crash();
    let c_process = ServerProcess::start("C (after a crash)", &url);
    let c = TestServer::client_for(c_process.address);
    assert_held(&c, ns, name, fourth, gamma.expiry() + 10).await;
    assert_refused(c.acquire(ns, name, "delta", 30).await, ns, name);
    assert_released(c.release(ns, name, "gamma").await, ns, name);
    let delta = acquire_ok(&c, ns, name, "delta", 30).await;
    let fifth = delta.fence_value();
    assert!(fifth > fourth, "{fifth} > {fourth}");
    assert_held(&b, ns, name, fifth, delta.expiry()).await;
    assert_released(b.release(ns, name, "delta").await, ns, name);

    // Every server stopped; one started afterwards continues the sequence.
    for server in [a_process, b_process, c_process] {
        server.stop();
    }
    let e_process = ServerProcess::start("E", &url);
    let e = TestServer::client_for(e_process.address);
    assert_free(&e, ns, name).await;
    let epsilon = acquire_ok(&e, ns, name, "epsilon", 30).await;
    let sixth = epsilon.fence_value();
    assert!(sixth > fifth, "{sixth} > {fifth}");
    assert_released(e.release(ns, name, "epsilon").await, ns, name);
    println!(
        "{}: fences {first}, {second}, {third}, {fourth}, {fifth}, {sixth} across 5 server processes",
        store.name()
    );
    e_process.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_share_state() {
    share_state(Store::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replicas_share_state() {
    share_state(Store::Redis).await;
}

// ---------------------------------------------------------------------------------------------
// The check itself, on made-up records: it passes a correct history and catches each kind of
// violation (so that a passing contention run means something).
// ---------------------------------------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
fn event(
    client: usize,
    op: Op,
    status: u16,
    sent: u64,
    received: u64,
    fence: Option<u64>,
    expiry: Option<u64>,
    seconds: u64,
) -> Event {
    Event {
        client,
        instance: format!("client-{client:02}"),
        server: client % 2,
        op,
        seconds,
        sent,
        received,
        status: StatusCode::from_u16(status).unwrap(),
        fence,
        expiry,
        lease: fence.map(|_| seconds),
    }
}

fn get(server: usize, sent: u64, fence: Option<u64>, expiry: Option<u64>) -> Observation {
    Observation {
        server,
        sent,
        received: sent + 5,
        fence,
        expiry,
    }
}

/// Client 0 holds fence 1 from 10.000-10.010 s to its release at 10.050 s; client 1 is
/// refused meanwhile, then holds fence 2 from 10.070-10.080 s to 10.100 s.
fn correct_history() -> Vec<Event> {
    vec![
        event(0, Op::Acquire, 200, 10_000, 10_010, Some(1), Some(11), 1),
        event(1, Op::Acquire, 423, 10_020, 10_030, None, None, 1),
        event(0, Op::Release, 200, 10_050, 10_060, None, None, 0),
        event(1, Op::Acquire, 200, 10_070, 10_080, Some(2), Some(11), 1),
        event(1, Op::Release, 200, 10_100, 10_110, None, None, 0),
    ]
}

fn violations(events: &[Event], observations: &[Observation]) -> Vec<String> {
    check(events, observations).1
}

#[test]
fn the_check_passes_a_correct_history() {
    let observations = [
        get(0, 10_030, Some(1), Some(11)),
        get(1, 10_030, Some(1), Some(11)),
        get(1, 10_085, Some(2), Some(11)),
        get(0, 10_200, None, None),
    ];
    let (tally, violations) = check(&correct_history(), &observations);
    assert_eq!(violations, Vec::<String>::new());
    assert_eq!((tally.holds, tally.refusals, tally.releases), (2, 1, 2));
    assert_eq!(tally.gets_during_certain_hold, [1, 2]);
}

#[test]
fn the_check_catches_two_holders() {
    let mut events = correct_history();
    // Client 1 granted fence 2 while client 0 certainly held fence 1.
    events[3] = event(1, Op::Acquire, 200, 10_030, 10_040, Some(2), Some(11), 1);
    let found = violations(&events, &[]);
    assert!(
        found.iter().any(|v| v.starts_with("two holders at once")),
        "{found:?}"
    );
}

#[test]
fn the_check_catches_fences_going_backwards() {
    let mut events = correct_history();
    events[0].fence = Some(2);
    events[3].fence = Some(1);
    let found = violations(&events, &[]);
    assert!(
        found.iter().any(|v| v.starts_with("fences out of order")),
        "{found:?}"
    );
}

#[test]
fn the_check_catches_a_lost_or_changed_hold() {
    // Refused while its lease (expiry 11: until 12.000 s) certainly lasted.
    let mut events = correct_history();
    events.insert(1, event(0, Op::Renew, 423, 10_015, 10_020, None, None, 1));
    let found = violations(&events, &[]);
    assert!(
        found.iter().any(|v| v.contains("refused while")),
        "{found:?}"
    );
    // A re-acquire of a live hold with a new fence.
    let mut events = correct_history();
    events.insert(
        1,
        event(0, Op::Acquire, 200, 10_015, 10_020, Some(3), Some(11), 1),
    );
    let found = violations(&events, &[]);
    assert!(
        found
            .iter()
            .any(|v| v.contains("re-acquired its live hold")),
        "{found:?}"
    );
    // A renew that revived a lease that had ended, or did not add D.
    let mut events = correct_history();
    events[2] = event(0, Op::Renew, 200, 13_100, 13_110, Some(1), Some(14), 1);
    let found = violations(&events, &[]);
    assert!(
        found
            .iter()
            .any(|v| v.contains("renewed a lease that had ended")),
        "{found:?}"
    );
    assert!(found.iter().any(|v| v.contains("not 11 + 1")), "{found:?}");
}

#[test]
fn the_check_catches_wrong_gets() {
    let found = violations(&correct_history(), &[get(1, 10_030, None, None)]);
    assert!(
        found.iter().any(|v| v.contains("showed the lock free")),
        "{found:?}"
    );
    let found = violations(&correct_history(), &[get(0, 10_030, Some(2), Some(11))]);
    assert!(
        found
            .iter()
            .any(|v| v.contains("while fence 1 (client-00) certainly held")),
        "{found:?}"
    );
    let found = violations(&correct_history(), &[get(0, 10_030, Some(1), Some(12))]);
    assert!(
        found.iter().any(|v| v.contains("showed expiry 12")),
        "{found:?}"
    );
    let found = violations(&correct_history(), &[get(0, 10_030, Some(7), Some(11))]);
    assert!(
        found.iter().any(|v| v.contains("never granted")),
        "{found:?}"
    );
}
