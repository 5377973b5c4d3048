//! A deterministic, randomized simulation of the guard's lease logic.
//!
//! A simulated lock server runs on tokio's paused clock behind a layer that injects faults
//! (delays in both directions, reordering, refused requests, lost answers, requests applied
//! after the caller gave up, very slow answers). One to three clients contend for one or two
//! keys through [`syncguard::acquire`] and [`syncguard::with_lock`], extending by hand (also
//! concurrently with the heartbeat), sleeping, stalling the whole runtime, releasing and
//! dropping their guards, with extreme ttls, hold caps and retry policies.
//!
//! The invariant: whenever a guard reports its lock held, the server holds a live lock for
//! that lock id; and `with_lock` returns `Ok` only for work that finished while it did. Live
//! means strictly before the stored expiry, without the 1 s tolerance of the real backends:
//! the guard must not need it.
//!
//! Also checked: the loss is reported consistently (`lost_reason` agrees with `is_lost`, the
//! loss token fires only after a loss, a loss and its reason are final), at most one guard per
//! key reports its lock held, fences match the server's and only grow, nothing panics (the
//! keeper task included), no caller busy-loops on the backend, and every schedule ends.
//!
//! Every schedule comes from a seed. A failure prints the seeds, the broken invariants and the
//! event log (its first and last lines) of one failing schedule per invariant. Replay one
//! schedule, which prints its log, with
//! `SIM_SEED=1234 cargo test -p syncguard --test lease_sim -- --nocapture`; run more schedules
//! with `SIM_SCHEDULES=20000`, or other ones with `SIM_FIRST_SEED=100000`.
//!
//! Replays are exact but for two things outside the simulation: which branch of a
//! `tokio::select!` inside the guard is polled first when both are ready, and the wall clock's
//! millisecond, which the guard reads to translate the expiries the server reports (a
//! millisecond boundary crossed between the server's reading and the guard's makes a deadline
//! 1 ms earlier). A failure that depends on it shows up in some runs of its seed only: run it
//! many times with `SIM_SEED=1234 SIM_REPEAT=200`.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, PoisonError, Weak};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use syncguard::key::normalize_key;
use syncguard::time::{MAX_TTL, now_ms, ttl_millis};
use syncguard::{
    AcquireOutcome, Backoff, BoxFuture, Capabilities, ExtendOutcome, Fence, Jitter, Lease,
    LockBackend, LockError, LockGuard, LockId, LockInfo, LockOptions, Lookup, LostReason,
    NotHeldReason, OnLost, ReleaseOutcome, RetryPolicy, TimeAuthority,
};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, timeout};

/// Schedules run by default: a few thousand, in seconds of real time.
const DEFAULT_SCHEDULES: u64 = 3000;
/// A schedule still running after this much virtual time has a guard that never lets go.
const VIRTUAL_LIMIT: Duration = Duration::from_secs(24 * 3600);
/// A schedule still running after this much real time is spinning without advancing time.
const REAL_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);
/// Backend calls at one virtual instant beyond which a caller is busy-looping.
const SPIN_LIMIT: usize = 1000;
/// Event log lines kept from the start of a schedule, and from its end.
const LOG_HEAD: usize = 150;
const LOG_TAIL: usize = 250;
/// Event log lines kept per virtual instant (a busy loop would fill the log).
const LOG_PER_INSTANT: usize = 100;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Whole milliseconds: time then stays on the timer wheel's grid unless a schedule leaves it
/// on purpose.
fn whole_ms(duration: Duration) -> Duration {
    ms(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

// ------------------------------------------------------------------------------------------
// The event log

/// What happened in one schedule, stamped with virtual time, for replaying a failure: its
/// first and last lines.
struct EventLog {
    start: Instant,
    lines: Mutex<Lines>,
}

#[derive(Default)]
struct Lines {
    head: Vec<String>,
    tail: VecDeque<String>,
    left_out: usize,
    /// The virtual instant of the latest line, and how many lines were logged at it.
    instant: Option<(Instant, usize)>,
}

impl EventLog {
    /// Must be made inside the schedule's runtime (it reads the paused clock).
    fn new() -> Self {
        Self {
            start: Instant::now(),
            lines: Mutex::new(Lines::default()),
        }
    }

    fn stamp(&self) -> String {
        format!("{:>12.3}ms", self.start.elapsed().as_secs_f64() * 1000.0)
    }

    fn push(&self, line: impl fmt::Display) {
        let now = Instant::now();
        let mut lines = lock(&self.lines);
        let at_instant = match lines.instant {
            Some((at, count)) if at == now => count + 1,
            _ => 1,
        };
        lines.instant = Some((now, at_instant));
        if at_instant == LOG_PER_INSTANT {
            let line = format!("{} (further lines at this instant left out)", self.stamp());
            lines.add(line);
        }
        if at_instant < LOG_PER_INSTANT {
            let line = format!("{} {line}", self.stamp());
            lines.add(line);
        }
    }

    /// The first and the last lines.
    fn excerpt(&self) -> Vec<String> {
        let lines = lock(&self.lines);
        let mut excerpt = lines.head.clone();
        if lines.left_out > 0 {
            excerpt.push(format!("({} lines left out)", lines.left_out));
        }
        excerpt.extend(lines.tail.iter().cloned());
        excerpt
    }
}

impl Lines {
    fn add(&mut self, line: String) {
        if self.head.len() < LOG_HEAD {
            self.head.push(line);
            return;
        }
        if self.tail.len() == LOG_TAIL {
            self.tail.pop_front();
            self.left_out += 1;
        }
        self.tail.push_back(line);
    }
}

// ------------------------------------------------------------------------------------------
// The simulated lock server

/// One acquisition, kept after it ends so that violations can say what became of it.
struct Acquisition {
    key: String,
    lock_id: LockId,
    fence: Fence,
    acquired_at: Instant,
    expiry: Instant,
    released_at: Option<Instant>,
}

impl Acquisition {
    /// Live strictly before the expiry, with no tolerance.
    fn live(&self, now: Instant) -> bool {
        self.released_at.is_none() && self.expiry > now
    }

    fn label(&self) -> String {
        format!("{}#{}", self.key, self.fence.get())
    }
}

#[derive(Default)]
struct Table {
    acquisitions: Vec<Acquisition>,
    by_id: HashMap<LockId, usize>,
    /// The latest acquisition of each key: the only one that can be live.
    latest: BTreeMap<String, usize>,
}

/// A lock server on tokio's clock, with the semantics `LockBackend` documents and no
/// tolerance. Its `apply_*` methods act at once; the fault layer decides when they run.
struct SimServer {
    table: Mutex<Table>,
    log: Arc<EventLog>,
}

/// The expiry in Unix ms as a backend reports it: the real wall clock (which the guard
/// calibrates against, and which barely moves) plus the virtual time left.
fn expires_at_ms(expiry: Instant, now: Instant) -> u64 {
    let left = u64::try_from(expiry.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX);
    now_ms().saturating_add(left)
}

impl SimServer {
    fn new(log: Arc<EventLog>) -> Self {
        Self {
            table: Mutex::new(Table::default()),
            log,
        }
    }

    fn apply_acquire(
        &self,
        who: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let ttl_ms = ttl_millis(ttl)?;
        let key = normalize_key(key)?.into_owned();
        let now = Instant::now();
        let mut table = lock(&self.table);
        let previous = table.latest.get(&key).map(|&i| &table.acquisitions[i]);
        if let Some(previous) = previous.filter(|previous| previous.live(now)) {
            self.log.push(format_args!(
                "server: {who} acquire {key} ttl {ttl:?}: held by {}",
                previous.label()
            ));
            return Ok(AcquireOutcome::Contended);
        }
        let fence = Fence::new(previous.map_or(0, |previous| previous.fence.get()) + 1)?;
        let lock_id = LockId::generate();
        let expiry = now + ms(ttl_ms);
        let acquisition = Acquisition {
            key: key.clone(),
            lock_id: lock_id.clone(),
            fence,
            acquired_at: now,
            expiry,
            released_at: None,
        };
        self.log.push(format_args!(
            "server: {who} acquire {key} ttl {ttl:?}: acquired {}, expires at {}",
            acquisition.label(),
            self.at(expiry)
        ));
        let index = table.acquisitions.len();
        table.acquisitions.push(acquisition);
        table.by_id.insert(lock_id.clone(), index);
        table.latest.insert(key, index);
        Ok(AcquireOutcome::Acquired(Lease::new(
            lock_id,
            expires_at_ms(expiry, now),
            fence,
        )))
    }

    fn apply_extend(
        &self,
        who: &str,
        lock_id: &LockId,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let ttl_ms = ttl_millis(ttl)?;
        let now = Instant::now();
        let mut table = lock(&self.table);
        let Some(&index) = table.by_id.get(lock_id) else {
            return Ok(ExtendOutcome::NotHeld(Some(NotHeldReason::NotFound)));
        };
        let acquisition = &mut table.acquisitions[index];
        let outcome = if acquisition.released_at.is_some() {
            ExtendOutcome::NotHeld(Some(NotHeldReason::NotFound))
        } else if acquisition.expiry <= now {
            ExtendOutcome::NotHeld(Some(NotHeldReason::Expired))
        } else {
            acquisition.expiry = now + ms(ttl_ms);
            ExtendOutcome::Extended {
                expires_at_ms: expires_at_ms(acquisition.expiry, now),
            }
        };
        let label = acquisition.label();
        let expiry = acquisition.expiry;
        self.log.push(format_args!(
            "server: {who} extend {label} ttl {ttl:?}: {}",
            match outcome {
                ExtendOutcome::Extended { .. } => format!("expires at {}", self.at(expiry)),
                ExtendOutcome::NotHeld(reason) => format!("not held ({reason:?})"),
            }
        ));
        Ok(outcome)
    }

    fn apply_release(&self, who: &str, lock_id: &LockId) -> Result<ReleaseOutcome, LockError> {
        let now = Instant::now();
        let mut table = lock(&self.table);
        let Some(&index) = table.by_id.get(lock_id) else {
            return Ok(ReleaseOutcome::NotHeld(Some(NotHeldReason::NotFound)));
        };
        let acquisition = &mut table.acquisitions[index];
        let outcome = if acquisition.released_at.is_some() {
            ReleaseOutcome::NotHeld(Some(NotHeldReason::NotFound))
        } else if acquisition.expiry <= now {
            ReleaseOutcome::NotHeld(Some(NotHeldReason::Expired))
        } else {
            acquisition.released_at = Some(now);
            ReleaseOutcome::Released
        };
        self.log.push(format_args!(
            "server: {who} release {}: {outcome:?}",
            acquisition.label()
        ));
        Ok(outcome)
    }

    /// Whether `lock_id` holds a live lock now.
    fn is_live(&self, lock_id: &LockId) -> bool {
        let table = lock(&self.table);
        let now = Instant::now();
        table
            .by_id
            .get(lock_id)
            .is_some_and(|&i| table.acquisitions[i].live(now))
    }

    /// The live lock on `key`: its lock id and fence.
    fn holder(&self, key: &str) -> Option<(LockId, Fence)> {
        let table = lock(&self.table);
        let now = Instant::now();
        let acquisition = &table.acquisitions[*table.latest.get(key)?];
        acquisition
            .live(now)
            .then(|| (acquisition.lock_id.clone(), acquisition.fence))
    }

    fn fence_of(&self, lock_id: &LockId) -> Option<Fence> {
        let table = lock(&self.table);
        table
            .by_id
            .get(lock_id)
            .map(|&i| table.acquisitions[i].fence)
    }

    fn label(&self, lock_id: &LockId) -> String {
        let table = lock(&self.table);
        table.by_id.get(lock_id).map_or_else(
            || "an unknown lock".to_owned(),
            |&i| table.acquisitions[i].label(),
        )
    }

    /// What became of a lock, for a violation's message.
    fn fate(&self, lock_id: &LockId) -> String {
        let table = lock(&self.table);
        let now = Instant::now();
        let Some(&index) = table.by_id.get(lock_id) else {
            return "never granted".to_owned();
        };
        let acquisition = &table.acquisitions[index];
        match acquisition.released_at {
            Some(at) => format!("released at {}", self.at(at)),
            None if acquisition.expiry <= now => {
                let holder = table.latest[&acquisition.key];
                let successor = if holder == index {
                    String::new()
                } else {
                    format!(", since taken by {}", table.acquisitions[holder].label())
                };
                format!("expired at {}{successor}", self.at(acquisition.expiry))
            }
            None => format!("live until {}", self.at(acquisition.expiry)),
        }
    }

    /// A virtual instant as the log stamps it.
    fn at(&self, instant: Instant) -> String {
        format!(
            "{:.3}ms",
            instant
                .saturating_duration_since(self.log.start)
                .as_secs_f64()
                * 1000.0
        )
    }

    fn info(&self, index: usize, table: &Table) -> LockInfo {
        let acquisition = &table.acquisitions[index];
        let now = Instant::now();
        let held_for =
            u64::try_from((now - acquisition.acquired_at).as_millis()).unwrap_or(u64::MAX);
        LockInfo::new(
            acquisition.key.clone(),
            acquisition.lock_id.clone(),
            expires_at_ms(acquisition.expiry, now),
            now_ms().saturating_sub(held_for),
            acquisition.fence,
        )
    }
}

/// The server without faults: every call is applied at once.
impl LockBackend for SimServer {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(async move { self.apply_acquire("direct", key, ttl) })
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        Box::pin(async move { self.apply_release("direct", lock_id) })
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(async move { self.apply_extend("direct", lock_id, ttl) })
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move { Ok(self.holder(&normalize_key(key)?).is_some()) })
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(async move {
            let now = Instant::now();
            let table = lock(&self.table);
            let index = match query {
                Lookup::Key(key) => table.latest.get(normalize_key(key)?.as_ref()).copied(),
                Lookup::LockId(lock_id) => table.by_id.get(lock_id).copied(),
            };
            Ok(index
                .filter(|&i| table.acquisitions[i].live(now))
                .map(|i| self.info(i, &table)))
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("sim", TimeAuthority::Server)
    }
}

// ------------------------------------------------------------------------------------------
// The fault layer

/// How unreliable a schedule's network and server are.
#[derive(Debug, Clone, Copy)]
struct FaultProfile {
    /// Every request and answer takes up to this long.
    latency_ms: u64,
    /// The share of calls that get a fault on top.
    fault_rate: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Acquire,
    Extend,
    Release,
}

/// What happens to one call.
#[derive(Debug, Clone, Copy, Default)]
struct Plan {
    /// Before the server applies the request (or, if refused, before the caller hears so).
    pre: Duration,
    /// Between the server applying it and the caller getting the answer.
    reply: Duration,
    /// Fails before reaching the server: nothing applied.
    refused: bool,
    /// Applied, but the answer never arrives.
    reply_lost: bool,
    /// The caller gives up after this long with a timeout; the request still applies.
    give_up_after: Option<Duration>,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.refused {
            return write!(f, " [refused after {:?}]", self.pre);
        }
        if self.pre.is_zero()
            && self.reply.is_zero()
            && !self.reply_lost
            && self.give_up_after.is_none()
        {
            return Ok(());
        }
        write!(f, " [applied after {:?}, ", self.pre)?;
        if self.reply_lost {
            f.write_str("answer lost")?;
        } else {
            write!(f, "answer {:?} later", self.reply)?;
        }
        if let Some(limit) = self.give_up_after {
            write!(f, ", caller gives up after {limit:?}")?;
        }
        f.write_str("]")
    }
}

/// A fault delay: mostly short, sometimes long enough to outlive a lease.
fn fault_delay(rng: &mut StdRng) -> Duration {
    match rng.random_range(0..10) {
        0..6 => ms(rng.random_range(0..=10)),
        6..9 => ms(rng.random_range(10..=500)),
        _ => ms(rng.random_range(500..=5_000)),
    }
}

struct Faults {
    profile: FaultProfile,
    rng: Mutex<StdRng>,
}

impl Faults {
    fn plan(&self, op: Op) -> Plan {
        let mut rng = lock(&self.rng);
        let rng = &mut *rng;
        let mut plan = Plan::default();
        if self.profile.latency_ms > 0 {
            plan.pre = ms(rng.random_range(0..=self.profile.latency_ms));
            plan.reply = ms(rng.random_range(0..=self.profile.latency_ms));
        }
        if !rng.random_bool(self.profile.fault_rate) {
            return plan;
        }
        match rng.random_range(0..6) {
            0 => plan.refused = true,
            1 => {
                plan.reply_lost = true;
                plan.give_up_after = Some(fault_delay(rng));
            }
            2 => {
                // A timed-out request that the server executes later.
                plan.give_up_after = Some(ms(rng.random_range(0..=5)));
                plan.pre = ms(rng.random_range(10..=3_000));
            }
            3 => {
                plan.reply = if op == Op::Acquire {
                    fault_delay(rng)
                } else {
                    ms(rng.random_range(1_000..=30_000))
                };
            }
            4 => {
                plan.pre = fault_delay(rng);
                plan.reply = fault_delay(rng);
                plan.give_up_after = Some(fault_delay(rng));
            }
            _ => {
                // Calls in flight together are applied, and answered, in any order.
                plan.pre = fault_delay(rng);
                plan.reply = fault_delay(rng);
            }
        }
        plan
    }
}

/// The server as one client reaches it: every call goes through the schedule's faults. A
/// request in flight reaches the server even if its caller stops waiting for the answer.
#[derive(Clone)]
struct Faulty {
    server: Arc<SimServer>,
    faults: Arc<Faults>,
    world: Arc<World>,
    who: Arc<str>,
}

impl Faulty {
    fn call<'a, T: Send + 'static>(
        &'a self,
        op: Op,
        what: String,
        apply: impl FnOnce(&SimServer, &str) -> Result<T, LockError> + Send + 'static,
    ) -> BoxFuture<'a, Result<T, LockError>> {
        Box::pin(async move {
            self.world.calls.fetch_add(1, Ordering::Relaxed);
            let log = &self.server.log;
            if self.world.spinning(&self.who) {
                // Answered at once, so that a caller looping on errors lets time advance.
                return Err(LockError::service_unavailable("sim: refused; busy loop"));
            }
            let plan = self.faults.plan(op);
            log.push(format_args!("{} sends {what}{plan}", self.who));
            if plan.refused {
                sleep(plan.pre).await;
                return Err(LockError::service_unavailable("sim: refused; not applied"));
            }
            let (sender, answer) = oneshot::channel();
            let server = Arc::clone(&self.server);
            let who = Arc::clone(&self.who);
            tokio::spawn(async move {
                if !plan.pre.is_zero() {
                    sleep(plan.pre).await;
                }
                let _ = sender.send(apply(&server, &who));
            });
            let answered = async {
                let outcome = answer
                    .await
                    .unwrap_or_else(|_| Err(LockError::internal("sim: request vanished")));
                if !plan.reply.is_zero() {
                    sleep(plan.reply).await;
                }
                if plan.reply_lost {
                    std::future::pending::<()>().await;
                }
                outcome
            };
            let outcome = match plan.give_up_after {
                Some(limit) => timeout(limit, answered).await.unwrap_or_else(|_| {
                    Err(LockError::network_timeout(
                        "sim: no answer in time; the request may still be applied",
                    ))
                }),
                None => answered.await,
            };
            if let Err(error) = &outcome {
                log.push(format_args!("{} {what}: {error}", self.who));
            }
            outcome
        })
    }
}

impl LockBackend for Faulty {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        // Arguments are checked before any I/O, as the real backends do.
        if let Err(error) = ttl_millis(ttl).and_then(|_| normalize_key(key)) {
            return Box::pin(async { Err(error) });
        }
        let key = key.to_owned();
        self.call(Op::Acquire, format!("acquire {key}"), move |server, who| {
            server.apply_acquire(who, &key, ttl)
        })
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        let label = self.server.label(lock_id);
        let lock_id = lock_id.clone();
        self.call(
            Op::Release,
            format!("release {label}"),
            move |server, who| server.apply_release(who, &lock_id),
        )
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        if let Err(error) = ttl_millis(ttl) {
            return Box::pin(async { Err(error) });
        }
        let label = self.server.label(lock_id);
        let lock_id = lock_id.clone();
        self.call(
            Op::Extend,
            format!("extend {label} ttl {ttl:?}"),
            move |server, who| server.apply_extend(who, &lock_id, ttl),
        )
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        self.server.is_locked(key)
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        self.server.lookup(query)
    }

    fn capabilities(&self) -> Capabilities {
        self.server.capabilities()
    }
}

// ------------------------------------------------------------------------------------------
// The checker

struct Violation {
    invariant: &'static str,
    detail: String,
}

const HELD_MEANS_LIVE: &str = "a guard reports its lock held only while the server holds it live";
const REASON_AGREES: &str = "lost_reason() is None exactly when is_lost() is false";
const TOKEN_AFTER_LOSS: &str = "lost_token() is cancelled only once the lock is lost";
const LOSS_IS_FINAL: &str = "a guard that reported its lock lost never reports it held again";
const REASON_IS_FINAL: &str = "the reported loss reason does not change";
const ONE_HOLDER: &str = "at most one guard per key reports its lock held";
const FENCE_MATCHES: &str = "a guard's fence is the one the server granted";
const FENCES_INCREASE: &str = "fences of successive holders of a key strictly increase";
const WITH_LOCK_OK: &str =
    "with_lock returns Ok only for work that finished while the server held the lock live";
const NO_SPIN: &str = "no caller busy-loops on the backend (1000 calls at one virtual instant)";
const NO_PANIC: &str = "nothing panics (the guard's keeper task included)";
const ENDS: &str = "every schedule ends";

/// What a schedule's checks share: the server's truth, the guards alive, and what each
/// guard reported before.
struct World {
    server: Arc<SimServer>,
    log: Arc<EventLog>,
    violations: Mutex<Vec<Violation>>,
    /// The loss reason each lock id's guard first reported.
    reported_lost: Mutex<HashMap<LockId, Option<LostReason>>>,
    /// Per key, the highest fence a guard reported held.
    newest_fence: Mutex<BTreeMap<String, u64>>,
    /// Guards from `acquire`, for the checker task.
    guards: Mutex<Vec<(Arc<str>, Weak<LockGuard>)>>,
    stopped: AtomicBool,
    /// When the latest backend call was made, and how many were made at that instant.
    latest_calls: Mutex<Option<(Instant, usize)>>,
    spun: AtomicBool,
    calls: AtomicUsize,
    acquired: AtomicUsize,
    with_lock_ok: AtomicUsize,
}

impl World {
    fn new(server: Arc<SimServer>) -> Self {
        Self {
            log: Arc::clone(&server.log),
            server,
            violations: Mutex::new(Vec::new()),
            reported_lost: Mutex::new(HashMap::new()),
            newest_fence: Mutex::new(BTreeMap::new()),
            guards: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
            latest_calls: Mutex::new(None),
            spun: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
            acquired: AtomicUsize::new(0),
            with_lock_ok: AtomicUsize::new(0),
        }
    }

    /// Records a violation; the schedule then winds down (its first violation is the story).
    /// Repeats of an invariant already broken are only logged.
    fn violate(&self, invariant: &'static str, detail: String) {
        let detail = format!("at {}: {detail}", self.log.stamp().trim());
        self.log
            .push(format_args!("VIOLATION of \"{invariant}\": {detail}"));
        let mut violations = lock(&self.violations);
        if !violations.iter().any(|seen| seen.invariant == invariant) {
            violations.push(Violation { invariant, detail });
        }
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// Counts a backend call; whether calls are being made in a loop that never lets virtual
    /// time advance (the schedule could then never end).
    fn spinning(&self, who: &str) -> bool {
        let now = Instant::now();
        let mut latest = lock(&self.latest_calls);
        let count = match *latest {
            Some((at, count)) if at == now => count + 1,
            _ => 1,
        };
        *latest = Some((now, count));
        drop(latest);
        if self.spun.load(Ordering::Relaxed) {
            return true;
        }
        if count == SPIN_LIMIT {
            self.violate(
                NO_SPIN,
                format!("{who} made {SPIN_LIMIT} backend calls at this instant"),
            );
        }
        let spinning = count >= SPIN_LIMIT;
        // From then on every call is refused, so that the schedule winds down.
        self.spun.store(spinning, Ordering::Relaxed);
        spinning
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    fn register(&self, who: &Arc<str>, guard: &Arc<LockGuard>) {
        lock(&self.guards).push((Arc::clone(who), Arc::downgrade(guard)));
    }

    /// Checks one guard against the server, at an instant when it may be asked.
    fn check(&self, who: &str, guard: &LockGuard, when: &str) {
        let lost = guard.is_lost();
        let reason = guard.lost_reason();
        let token_cancelled = guard.lost_token().is_cancelled();
        let lock_id = guard.lock_id();
        let name = self.server.label(lock_id);
        if reason.is_some() != lost {
            self.violate(
                REASON_AGREES,
                format!(
                    "{who}'s guard of {name} ({when}): is_lost() {lost}, lost_reason() {reason:?}"
                ),
            );
        }
        if token_cancelled && !lost {
            self.violate(
                TOKEN_AFTER_LOSS,
                format!("{who}'s guard of {name} ({when}): token cancelled, is_lost() false"),
            );
        }
        {
            let mut reported = lock(&self.reported_lost);
            match reported.get(lock_id) {
                Some(before) if !lost => self.violate(
                    LOSS_IS_FINAL,
                    format!("{who}'s guard of {name} ({when}): reported lost ({before:?}) before, held now"),
                ),
                Some(before) if *before != reason => self.violate(
                    REASON_IS_FINAL,
                    format!("{who}'s guard of {name} ({when}): reported {before:?} before, {reason:?} now"),
                ),
                Some(_) => {}
                None if lost => {
                    reported.insert(lock_id.clone(), reason);
                }
                None => {}
            }
        }
        if lost {
            return;
        }
        if !self.server.is_live(lock_id) {
            let believed = guard.expires_at_ms().saturating_sub(now_ms());
            self.violate(
                HELD_MEANS_LIVE,
                format!(
                    "{who}'s guard of {name} ({when}) reports it held (last expiry it heard of: {believed}ms from now); the server's lock was {}",
                    self.server.fate(lock_id)
                ),
            );
        }
        let fence = guard.fence();
        if self.server.fence_of(lock_id) != Some(fence) {
            self.violate(
                FENCE_MATCHES,
                format!(
                    "{who}'s guard of {name} ({when}) has fence {fence}, the server granted {:?}",
                    self.server.fence_of(lock_id)
                ),
            );
        }
        let mut newest = lock(&self.newest_fence);
        let newest = newest.entry(guard.key().to_owned()).or_insert(0);
        if fence.get() < *newest {
            self.violate(
                FENCES_INCREASE,
                format!(
                    "{who}'s guard of {name} ({when}) reports it held after a guard with fence {} did",
                    *newest
                ),
            );
        }
        *newest = (*newest).max(fence.get());
    }

    /// Checks every guard from `acquire` still alive, and that no two hold one key.
    fn check_all(&self) {
        let guards: Vec<(Arc<str>, Arc<LockGuard>)> = {
            let mut guards = lock(&self.guards);
            guards.retain(|(_, guard)| guard.strong_count() > 0);
            guards
                .iter()
                .filter_map(|(who, guard)| Some((Arc::clone(who), guard.upgrade()?)))
                .collect()
        };
        let mut holders: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (who, guard) in &guards {
            self.check(who, guard, "checker");
            if !guard.is_lost() {
                holders
                    .entry(guard.key())
                    .or_default()
                    .push(format!("{who}'s {}", self.server.label(guard.lock_id())));
            }
        }
        for (key, held) in holders {
            if held.len() > 1 {
                self.violate(ONE_HOLDER, format!("{key} reported held by {held:?}"));
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// Schedules

#[derive(Debug)]
struct Schedule {
    keys: Vec<String>,
    faults: FaultProfile,
    /// The checker task wakes after 1 to this many milliseconds.
    check_every_ms: u64,
    /// Rounds (lock, hold, let go) of each client.
    rounds: Vec<u32>,
    client_seeds: Vec<u64>,
    fault_seed: u64,
    checker_seed: u64,
}

impl Schedule {
    fn generate(rng: &mut StdRng) -> Self {
        let clients = rng.random_range(1..=3);
        let keys = (0..rng.random_range(1..=2))
            .map(|k| format!("k{k}"))
            .collect();
        let faults = match rng.random_range(0..10) {
            0..2 => FaultProfile {
                latency_ms: 0,
                fault_rate: 0.0,
            },
            2..6 => FaultProfile {
                latency_ms: rng.random_range(0..=2),
                fault_rate: 0.02,
            },
            6..9 => FaultProfile {
                latency_ms: rng.random_range(0..=5),
                fault_rate: 0.1,
            },
            _ => FaultProfile {
                latency_ms: rng.random_range(0..=10),
                fault_rate: 0.3,
            },
        };
        let check_every_ms = [5, 50, 1_000][rng.random_range(0..3)];
        Self {
            keys,
            faults,
            check_every_ms,
            rounds: (0..clients).map(|_| rng.random_range(1..=4)).collect(),
            client_seeds: (0..clients).map(|_| rng.random()).collect(),
            fault_seed: rng.random(),
            checker_seed: rng.random(),
        }
    }
}

/// A lock's ttl: from the 1 ms minimum to minutes, sometimes with a sub-millisecond part
/// (which backends drop).
fn gen_ttl(rng: &mut StdRng) -> Duration {
    match rng.random_range(0..100) {
        0..5 => ms(1),
        5..25 => ms(rng.random_range(2..=20)),
        25..50 => ms(rng.random_range(20..=500)),
        50..80 => ms(rng.random_range(500..=10_000)),
        80..95 => ms(rng.random_range(10_000..=300_000)),
        _ => Duration::from_micros(rng.random_range(1_001..=20_000)),
    }
}

fn gen_retry(rng: &mut StdRng) -> RetryPolicy {
    // Jitter draws from the thread's random generator, not the seed: none keeps replays exact.
    let policy = RetryPolicy::new().with_jitter(Jitter::None);
    match rng.random_range(0..6) {
        0 => policy.with_max_retries(0),
        1 => policy,
        2 => policy
            .with_base_delay(Duration::ZERO)
            .with_max_retries(rng.random_range(1..=50)),
        // A timeout shorter than one delay.
        3 => policy
            .with_base_delay(Duration::from_secs(1))
            .with_timeout(ms(rng.random_range(0..=50))),
        4 => policy
            .with_backoff(Backoff::Fixed)
            .with_base_delay(ms(rng.random_range(1..=50)))
            .with_max_retries(u32::MAX)
            .with_timeout(ms(rng.random_range(0..=10_000))),
        _ => policy
            .with_base_delay(ms(rng.random_range(1..=200)))
            .with_max_retries(rng.random_range(0..=20))
            .with_timeout(ms(rng.random_range(0..=20_000))),
    }
}

fn gen_max_hold(rng: &mut StdRng, ttl: Duration) -> Option<Duration> {
    match rng.random_range(0..100) {
        0..35 => None,
        35..45 => Some(Duration::MAX),
        45..52 => Some(Duration::from_secs(u64::MAX / 2)),
        52..58 => Some(Duration::from_secs(100 * 365 * 24 * 3600)),
        58..66 => Some(Duration::from_micros(rng.random_range(0..=5_000))),
        _ => Some(whole_ms(ttl.mul_f64(rng.random_range(0.5..5.0)))),
    }
}

fn gen_options(rng: &mut StdRng, keys: &[String]) -> LockOptions {
    let key = keys[rng.random_range(0..keys.len())].clone();
    // Now and then an invalid ttl, which must fail cleanly.
    let ttl = match rng.random_range(0..100) {
        0 => Duration::ZERO,
        1 => MAX_TTL + ms(1),
        _ => gen_ttl(rng),
    };
    let options = LockOptions::new(key)
        .with_ttl(ttl)
        .with_retry(gen_retry(rng))
        .with_heartbeat(rng.random_bool(0.75));
    match gen_max_hold(rng, ttl) {
        Some(max_hold) => options.with_max_hold(max_hold),
        None => options,
    }
}

/// A wait or a stall while holding: relative to the ttl, or absolute and long.
fn gen_wait(rng: &mut StdRng, ttl: Duration) -> Duration {
    match rng.random_range(0..100) {
        0..10 => Duration::ZERO,
        10..40 => ms(rng.random_range(1..=5)),
        40..75 => whole_ms(ttl.mul_f64(rng.random_range(0.0..1.5))),
        75..90 => whole_ms(ttl.mul_f64(rng.random_range(1.5..6.0))),
        90..97 => ms(rng.random_range(1_000..=120_000)),
        // Off the millisecond grid the timers tick on.
        _ => Duration::from_micros(rng.random_range(1..=3_000)),
    }
}

/// The ttl of a manual extend: the guard's, another, or an invalid one.
fn gen_extend_ttl(rng: &mut StdRng, ttl: Duration) -> Duration {
    match rng.random_range(0..100) {
        0..4 => Duration::ZERO,
        4..6 => MAX_TTL + ms(1),
        6..40 => ttl,
        40..70 => gen_ttl(rng),
        _ => whole_ms(ttl.mul_f64(rng.random_range(0.1..3.0))).max(ms(1)),
    }
}

/// Gaps between rounds.
fn gen_gap(rng: &mut StdRng) -> Duration {
    match rng.random_range(0..10) {
        0..4 => Duration::ZERO,
        4..8 => ms(rng.random_range(1..=50)),
        _ => ms(rng.random_range(100..=10_000)),
    }
}

/// Virtual time a client may spend waiting (not stalled) on one hold: bounds the heartbeats,
/// which cost real time. Stalls are one jump each and do not count.
fn hold_budget(ttl: Duration) -> Duration {
    ttl.saturating_mul(100)
        .clamp(ms(50), Duration::from_secs(600))
}

#[derive(Debug, Clone, Copy)]
enum Action {
    /// Await a timer: the heartbeat runs meanwhile.
    Sleep(Duration),
    /// Block the thread: the whole runtime jumps ahead, timers fire late.
    Stall(Duration),
    Extend(Duration),
    /// Two manual extends at once, racing each other and the heartbeat.
    ExtendPair(Duration, Duration),
    /// An extend in a task of its own, which may outlive this step (and the hold).
    SpawnExtend(Duration),
    /// Wait for the loss, up to a limit.
    WaitLost(Duration),
    Yield,
    /// Stop holding now.
    End,
}

fn gen_action(rng: &mut StdRng, ttl: Duration) -> Action {
    match rng.random_range(0..100) {
        0..30 => Action::Sleep(gen_wait(rng, ttl)),
        30..45 => Action::Stall(gen_wait(rng, ttl)),
        45..58 => Action::Extend(gen_extend_ttl(rng, ttl)),
        58..66 => Action::ExtendPair(gen_extend_ttl(rng, ttl), gen_extend_ttl(rng, ttl)),
        66..80 => Action::SpawnExtend(gen_extend_ttl(rng, ttl)),
        80..90 => Action::WaitLost(gen_wait(rng, ttl)),
        90..95 => Action::Yield,
        _ => Action::End,
    }
}

/// Performs `action` on a held guard; returns the virtual time it waited (not stalled).
async fn perform(
    world: &World,
    who: &str,
    guard: &LockGuard,
    action: Action,
    left: Duration,
) -> Duration {
    let started = Instant::now();
    let name = world.server.label(guard.lock_id());
    world.log.push(format_args!("{who} on {name}: {action:?}"));
    match action {
        Action::Sleep(wait) => sleep(wait.min(left)).await,
        Action::Stall(stall) => {
            tokio::time::advance(stall).await;
            return Duration::ZERO;
        }
        Action::Extend(ttl) | Action::SpawnExtend(ttl) => {
            let outcome = guard.extend(ttl).await;
            world.log.push(format_args!(
                "{who} on {name}: extend {ttl:?} returned {outcome:?}"
            ));
        }
        Action::ExtendPair(first, second) => {
            let (a, b) = tokio::join!(guard.extend(first), guard.extend(second));
            world.log.push(format_args!(
                "{who} on {name}: extends {first:?} and {second:?} returned {a:?} and {b:?}"
            ));
        }
        Action::WaitLost(wait) => {
            tokio::select! {
                biased;
                reason = guard.lost() => {
                    world.log.push(format_args!("{who} on {name}: lost() returned {reason:?}"));
                }
                () = sleep(wait.min(left)) => {}
            }
        }
        Action::Yield => tokio::task::yield_now().await,
        Action::End => {}
    }
    started.elapsed()
}

struct Client {
    who: Arc<str>,
    world: Arc<World>,
    backend: Faulty,
    rng: StdRng,
    keys: Vec<String>,
}

impl Client {
    fn log(&self, line: impl fmt::Display) {
        self.world.log.push(format_args!("{} {line}", self.who));
    }

    async fn run(mut self, rounds: u32) {
        for _ in 0..rounds {
            if self.world.stopped() {
                break;
            }
            let options = gen_options(&mut self.rng, &self.keys);
            if self.rng.random_bool(0.3) {
                self.with_lock_round(options).await;
            } else {
                self.acquire_round(options).await;
            }
            let gap = gen_gap(&mut self.rng);
            sleep(gap).await;
        }
    }

    async fn acquire_round(&mut self, options: LockOptions) {
        self.log(format_args!("acquires {options:?}"));
        let guard = match syncguard::acquire(&self.backend, &options).await {
            Ok(guard) => Arc::new(guard),
            Err(error) => {
                self.log(format_args!("acquire failed: {error}"));
                return;
            }
        };
        let world = Arc::clone(&self.world);
        world.acquired.fetch_add(1, Ordering::Relaxed);
        let name = world.server.label(guard.lock_id());
        self.log(format_args!("acquired {name}"));
        world.register(&self.who, &guard);
        world.check(&self.who, &guard, "acquire returned");

        let budget = hold_budget(options.ttl());
        let mut waited = Duration::ZERO;
        let mut background = Vec::new();
        for _ in 0..self.rng.random_range(0..=8) {
            if world.stopped() || waited >= budget {
                break;
            }
            let action = gen_action(&mut self.rng, options.ttl());
            match action {
                Action::End => break,
                Action::SpawnExtend(ttl) => {
                    let (guard, world, who, name) = (
                        Arc::clone(&guard),
                        Arc::clone(&world),
                        Arc::clone(&self.who),
                        name.clone(),
                    );
                    self.log(format_args!("on {name}: spawns extend {ttl:?}"));
                    background.push(tokio::spawn(async move {
                        let outcome = guard.extend(ttl).await;
                        world.log.push(format_args!(
                            "{who} on {name}: spawned extend {ttl:?} returned {outcome:?}"
                        ));
                        world.check(&who, &guard, "spawned extend returned");
                    }));
                }
                _ => {
                    waited += perform(
                        &world,
                        &self.who,
                        &guard,
                        action,
                        budget.saturating_sub(waited),
                    )
                    .await
                }
            }
            world.check(&self.who, &guard, &format!("after {action:?}"));
        }
        // Extends still running are awaited or cancelled (their requests may still apply).
        for task in background {
            if self.rng.random_bool(0.5) {
                task.abort();
            }
            let _ = task.await;
        }
        world.check(&self.who, &guard, "before letting go");
        match Arc::try_unwrap(guard) {
            Ok(guard) if self.rng.random_bool(0.6) => {
                let outcome = guard.release().await;
                self.log(format_args!("release of {name} returned {outcome:?}"));
            }
            Ok(guard) => {
                self.log(format_args!("drops its guard of {name}"));
                drop(guard);
            }
            Err(shared) => drop(shared),
        }
    }

    async fn with_lock_round(&mut self, options: LockOptions) {
        let on_lost = if self.rng.random_bool(0.5) {
            OnLost::Cancel
        } else {
            OnLost::Notify
        };
        let options = options.with_on_lost(on_lost);
        self.log(format_args!("runs with_lock {options:?}"));
        // Whether the server held the lock live at the work's last step.
        let finished_live: Arc<Mutex<Option<bool>>> = Arc::new(Mutex::new(None));
        let mut steps_rng = StdRng::seed_from_u64(self.rng.random());
        let mut watch_rng = StdRng::seed_from_u64(self.rng.random());
        let check_every_ms = self.rng.random_range(1..=200);
        let fails = self.rng.random_bool(0.1);
        let (world, who, record) = (
            Arc::clone(&self.world),
            Arc::clone(&self.who),
            Arc::clone(&finished_live),
        );
        let ttl = options.ttl();
        let result =
            syncguard::with_lock(&self.backend, &options, async move |guard: &LockGuard| {
                world.acquired.fetch_add(1, Ordering::Relaxed);
                world.check(&who, guard, "work started");
                let work = async {
                    let budget = hold_budget(ttl);
                    let mut waited = Duration::ZERO;
                    for _ in 0..steps_rng.random_range(0..=8) {
                        if world.stopped() || waited >= budget {
                            break;
                        }
                        let action = match gen_action(&mut steps_rng, ttl) {
                            Action::End => break,
                            // No task can borrow the guard: race two extends instead.
                            Action::SpawnExtend(ttl) => Action::ExtendPair(ttl, ttl),
                            action => action,
                        };
                        waited +=
                            perform(&world, &who, guard, action, budget.saturating_sub(waited))
                                .await;
                        world.check(&who, guard, &format!("after {action:?}"));
                    }
                    if fails {
                        return Err(LockError::internal("sim: the work failed"));
                    }
                    // The work's last step, with nothing awaited after it.
                    *lock(&record) = Some(world.server.is_live(guard.lock_id()));
                    Ok(())
                };
                let watch = async {
                    let mut wakes = 0;
                    while !world.stopped() {
                        sleep(check_wait(&mut watch_rng, check_every_ms, wakes)).await;
                        wakes += 1;
                        world.check(&who, guard, "watcher");
                    }
                    std::future::pending::<()>().await;
                };
                tokio::select! {
                    biased;
                    result = work => result,
                    () = watch => unreachable!("the watcher never ends"),
                }
            })
            .await;
        self.log(format_args!("with_lock returned {result:?}"));
        let finished_live = *lock(&finished_live);
        if result.is_ok() {
            self.world.with_lock_ok.fetch_add(1, Ordering::Relaxed);
            if finished_live != Some(true) {
                self.world.violate(
                    WITH_LOCK_OK,
                    format!(
                        "{}'s with_lock ({on_lost:?}) returned Ok; server held the lock live at the work's end: {finished_live:?}",
                        self.who
                    ),
                );
            }
        }
    }
}

/// A random wait between two checks. The waits grow as a schedule goes on, so that a
/// schedule spanning hours of virtual time wakes its checkers a few thousand times, not
/// millions (each wake costs real time).
fn check_wait(rng: &mut StdRng, every_ms: u64, wakes: u32) -> Duration {
    let every_ms = every_ms.saturating_mul(1 << (wakes / 100).min(20));
    if rng.random_bool(0.1) {
        Duration::from_micros(rng.random_range(1..=999))
    } else {
        ms(rng.random_range(1..=every_ms))
    }
}

/// Wakes at random times and checks every guard from `acquire`.
async fn checker(world: Arc<World>, mut rng: StdRng, every_ms: u64) {
    let mut wakes = 0;
    while !world.stopped() {
        sleep(check_wait(&mut rng, every_ms, wakes)).await;
        wakes += 1;
        world.check_all();
    }
}

// ------------------------------------------------------------------------------------------
// Running schedules

thread_local! {
    /// Panics on this thread, when it runs schedules; `None` on other threads.
    static PANICS: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// Counts panics on schedule threads (tokio turns a task's panic into a `JoinError`, which
/// nobody may look at) instead of printing them; other threads print as usual.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let counted = PANICS.with(|panics| match panics.try_borrow_mut() {
                Ok(mut panics) => panics
                    .as_mut()
                    .map(|panics| panics.push(info.to_string()))
                    .is_some(),
                Err(_) => false,
            });
            if !counted {
                default(info);
            }
        }));
    });
}

struct Report {
    seed: u64,
    schedule: String,
    violations: Vec<Violation>,
    log: Vec<String>,
    calls: usize,
    acquired: usize,
    with_lock_ok: usize,
}

/// What the watchdog thread looks at: the schedule each worker runs, since when.
type Running = Mutex<HashMap<usize, (u64, std::time::Instant, Arc<EventLog>)>>;

fn run_schedule(seed: u64, worker: usize, running: &Running) -> Report {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let (world, schedule) = runtime.block_on(async {
        let mut rng = StdRng::seed_from_u64(seed);
        let schedule = Schedule::generate(&mut rng);
        let log = Arc::new(EventLog::new());
        lock(running).insert(worker, (seed, std::time::Instant::now(), Arc::clone(&log)));
        log.push(format_args!("seed {seed}: {schedule:?}"));
        let server = Arc::new(SimServer::new(log));
        let world = Arc::new(World::new(Arc::clone(&server)));
        let faults = Arc::new(Faults {
            profile: schedule.faults,
            rng: Mutex::new(StdRng::seed_from_u64(schedule.fault_seed)),
        });
        let clients: Vec<_> = schedule
            .client_seeds
            .iter()
            .zip(&schedule.rounds)
            .enumerate()
            .map(|(i, (&client_seed, &rounds))| {
                let who: Arc<str> = Arc::from(format!("c{i}"));
                let client = Client {
                    backend: Faulty {
                        server: Arc::clone(&server),
                        faults: Arc::clone(&faults),
                        world: Arc::clone(&world),
                        who: Arc::clone(&who),
                    },
                    who,
                    world: Arc::clone(&world),
                    rng: StdRng::seed_from_u64(client_seed),
                    keys: schedule.keys.clone(),
                };
                tokio::spawn(client.run(rounds))
            })
            .collect();
        let checking = tokio::spawn(checker(
            Arc::clone(&world),
            StdRng::seed_from_u64(schedule.checker_seed),
            schedule.check_every_ms,
        ));
        let all_done = async {
            for client in clients {
                // A panic is counted by the hook.
                let _ = client.await;
            }
        };
        tokio::select! {
            biased;
            () = all_done => {}
            () = sleep(VIRTUAL_LIMIT) => world.violate(ENDS, format!("still running after {VIRTUAL_LIMIT:?} of virtual time")),
        }
        checking.abort();
        (world, format!("{schedule:?}"))
    });
    // Tasks still pending (late requests, background releases) are dropped with the runtime.
    drop(runtime);
    lock(running).remove(&worker);
    let panics = PANICS.with(|panics| {
        panics
            .borrow_mut()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    });
    let mut violations = std::mem::take(&mut *lock(&world.violations));
    violations.extend(panics.into_iter().map(|panic| Violation {
        invariant: NO_PANIC,
        detail: panic,
    }));
    Report {
        seed,
        schedule,
        violations,
        log: world.log.excerpt(),
        calls: world.calls.load(Ordering::Relaxed),
        acquired: world.acquired.load(Ordering::Relaxed),
        with_lock_ok: world.with_lock_ok.load(Ordering::Relaxed),
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
    )
}

fn print_report(report: &Report) {
    eprintln!("--- seed {} ---", report.seed);
    eprintln!("schedule: {}", report.schedule);
    for violation in &report.violations {
        eprintln!("broke \"{}\": {}", violation.invariant, violation.detail);
    }
    eprintln!("event log (last {} lines):", report.log.len());
    for line in &report.log {
        eprintln!("  {line}");
    }
}

#[test]
fn a_guard_reports_its_lock_held_only_while_the_server_holds_it() {
    install_panic_hook();
    let replay = env_u64("SIM_SEED");
    let seeds: Vec<u64> = match replay {
        // A schedule that depends on the wall clock's millisecond may need a few runs.
        Some(seed) => vec![seed; env_u64("SIM_REPEAT").unwrap_or(1).max(1) as usize],
        None => {
            let first = env_u64("SIM_FIRST_SEED").unwrap_or(0);
            let count = env_u64("SIM_SCHEDULES").unwrap_or(DEFAULT_SCHEDULES);
            (first..first + count).collect()
        }
    };
    let workers = std::thread::available_parallelism()
        .map_or(2, usize::from)
        .clamp(1, 4)
        .min(seeds.len());
    let started = std::time::Instant::now();
    let next = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let running: Running = Mutex::new(HashMap::new());
    let failures: Mutex<Vec<Report>> = Mutex::new(Vec::new());
    let totals = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
    let slowest = Mutex::new((std::time::Duration::ZERO, 0));
    std::thread::scope(|scope| {
        // A schedule whose guard spins without letting virtual time advance never ends.
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(50));
                for (seed, since, log) in lock(&running).values() {
                    if since.elapsed() > REAL_LIMIT {
                        // Straight to stderr: the test harness's capture is lost on abort.
                        let mut stderr = std::io::stderr().lock();
                        let _ = writeln!(
                            stderr,
                            "lease_sim: seed {seed} still runs after {REAL_LIMIT:?} of real time; its log:"
                        );
                        for line in log.excerpt() {
                            let _ = writeln!(stderr, "  {line}");
                        }
                        std::process::abort();
                    }
                }
            }
        });
        let workers: Vec<_> = (0..workers)
            .map(|worker| {
                let (seeds, next, running, failures, totals, slowest) =
                    (&seeds, &next, &running, &failures, &totals, &slowest);
                scope.spawn(move || {
                    PANICS.with(|panics| *panics.borrow_mut() = Some(Vec::new()));
                    while let Some(&seed) = seeds.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let began = std::time::Instant::now();
                        let report = run_schedule(seed, worker, running);
                        let took = began.elapsed();
                        {
                            let mut slowest = lock(slowest);
                            if took > slowest.0 {
                                *slowest = (took, seed);
                            }
                        }
                        let counts = [report.calls, report.acquired, report.with_lock_ok];
                        for (total, count) in totals.iter().zip(counts) {
                            total.fetch_add(count as u64, Ordering::Relaxed);
                        }
                        if seeds.len() == 1 {
                            print_report(&report);
                        }
                        if !report.violations.is_empty() {
                            lock(failures).push(report);
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().expect("a worker");
        }
        done.store(true, Ordering::Relaxed);
    });
    let [calls, acquired, with_lock_ok] = totals.map(AtomicU64::into_inner);
    let (slowest_took, slowest_seed) = *lock(&slowest);
    eprintln!(
        "lease_sim: {} schedules on {workers} threads in {:.1?} (slowest: seed {slowest_seed}, {:.1?}): {calls} backend calls, {acquired} locks held, {with_lock_ok} with_lock calls returned Ok",
        seeds.len(),
        started.elapsed(),
        slowest_took,
    );

    let mut failures = failures
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    if failures.is_empty() {
        return;
    }
    failures.sort_by_key(|report| report.seed);
    let mut by_invariant: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for report in &failures {
        let broken: std::collections::BTreeSet<&str> =
            report.violations.iter().map(|v| v.invariant).collect();
        for invariant in broken {
            by_invariant.entry(invariant).or_default().push(report.seed);
        }
    }
    if seeds.len() > 1 {
        // One example of each broken invariant, with its log.
        let mut shown = Vec::new();
        for seeds in by_invariant.values() {
            if !shown.contains(&seeds[0]) {
                shown.push(seeds[0]);
                if let Some(report) = failures.iter().find(|report| report.seed == seeds[0]) {
                    print_report(report);
                }
            }
        }
    }
    let mut message = format!(
        "{} of {} schedules broke an invariant.\n",
        failures.len(),
        seeds.len()
    );
    for (invariant, seeds) in &by_invariant {
        let shown: Vec<String> = seeds.iter().take(8).map(u64::to_string).collect();
        message += &format!(
            "  \"{invariant}\": {} schedules, seeds {}{}\n",
            seeds.len(),
            shown.join(", "),
            if seeds.len() > 8 { ", ..." } else { "" }
        );
    }
    for report in failures.iter().take(10) {
        let first = &report.violations[0];
        message += &format!(
            "  seed {}: \"{}\": {}\n",
            report.seed, first.invariant, first.detail
        );
    }
    message += &format!(
        "Replay one (it prints its event log): SIM_SEED={} cargo test -p syncguard --test lease_sim -- --nocapture",
        failures[0].seed
    );
    panic!("{message}");
}

/// The simulated server itself follows the documented contract, strictly (no tolerance).
#[test]
fn the_simulated_server_follows_the_backend_contract() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let server = SimServer::new(Arc::new(EventLog::new()));
        let ttl = ms(100);
        let lease = server.acquire("k", ttl).await.unwrap().lease().unwrap();
        assert_eq!(lease.fence.get(), 1);
        assert!(server.is_live(&lease.lock_id));
        assert_eq!(
            server.holder("k"),
            Some((lease.lock_id.clone(), lease.fence))
        );
        assert!(server.acquire("k", ttl).await.unwrap().is_contended());
        assert!(server.is_locked("k").await.unwrap());

        // Extend replaces the remaining time; expiries are wall clock plus virtual time left.
        tokio::time::advance(ms(60)).await;
        let extended = server.extend(&lease.lock_id, ms(30)).await.unwrap();
        let reported = extended.expires_at_ms().unwrap();
        assert!(reported.abs_diff(now_ms() + 30) <= 5, "{reported}");
        tokio::time::advance(ms(29)).await;
        assert!(server.is_live(&lease.lock_id));
        // Strictly before the expiry: at it, the lock is gone, and never revived.
        tokio::time::advance(ms(1)).await;
        assert!(!server.is_live(&lease.lock_id));
        assert_eq!(server.holder("k"), None);
        assert_eq!(
            server.extend(&lease.lock_id, ttl).await.unwrap(),
            ExtendOutcome::NotHeld(Some(NotHeldReason::Expired))
        );
        assert!(!server.release(&lease.lock_id).await.unwrap().is_released());

        // The next holder gets the next fence; a release frees the key once.
        let next = server.acquire("k", ttl).await.unwrap().lease().unwrap();
        assert_eq!(next.fence.get(), 2);
        assert!(
            server
                .lookup(Lookup::LockId(&next.lock_id))
                .await
                .unwrap()
                .is_some()
        );
        assert!(server.release(&next.lock_id).await.unwrap().is_released());
        assert!(!server.release(&next.lock_id).await.unwrap().is_released());
        assert_eq!(server.holder("k"), None);
        assert_eq!(server.fence_of(&next.lock_id), Some(next.fence));

        // Sub-millisecond parts of a ttl are dropped, as ttl_millis does.
        let short = server
            .acquire("k", Duration::from_micros(1_900))
            .await
            .unwrap()
            .lease()
            .unwrap();
        tokio::time::advance(ms(1)).await;
        assert!(!server.is_live(&short.lock_id));

        for bad in [Duration::ZERO, MAX_TTL + ms(1)] {
            assert!(server.acquire("k", bad).await.is_err());
            assert!(server.extend(&short.lock_id, bad).await.is_err());
        }
        assert!(server.acquire("", ttl).await.is_err());
    });
}
