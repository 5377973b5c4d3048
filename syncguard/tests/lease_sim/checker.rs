//! The checker: the invariants, what a schedule's checks share, and the task that checks
//! every guard at random times.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use syncguard::backend::time::now_ms;
use syncguard::{LockGuard, LockId, LostReason};
use tokio::time::{Instant, sleep};

use crate::event_log::EventLog;
use crate::server::SimServer;
use crate::util::{lock, ms};

/// Backend calls at one virtual instant beyond which a caller is busy-looping.
const SPIN_LIMIT: usize = 1000;

pub(crate) struct Violation {
    pub(crate) invariant: &'static str,
    pub(crate) detail: String,
}

const HELD_MEANS_LIVE: &str = "a guard reports its lock held only while the server holds it live";
const REASON_AGREES: &str = "lost_reason() is None exactly when is_lost() is false";
const TOKEN_AFTER_LOSS: &str = "lost_token() is cancelled only once the lock is lost";
const LOSS_IS_FINAL: &str = "a guard that reported its lock lost never reports it held again";
const REASON_IS_FINAL: &str = "the reported loss reason does not change";
const ONE_HOLDER: &str = "at most one guard per key reports its lock held";
const FENCE_MATCHES: &str = "a guard's fence is the one the server granted";
const FENCES_INCREASE: &str = "fences of successive holders of a key strictly increase";
pub(crate) const WITH_LOCK_OK: &str =
    "with_lock returns Ok only for work that finished while the server held the lock live";
const NO_SPIN: &str = "no caller busy-loops on the backend (1000 calls at one virtual instant)";
pub(crate) const OPTIONS_CHECKED: &str = "the options builder refuses a ttl (with InvalidArgument) exactly when it is outside 1 ms..=365 d";
pub(crate) const NO_PANIC: &str = "nothing panics (the guard's heartbeat task included)";
pub(crate) const ENDS: &str = "every schedule ends";

/// What a schedule's checks share: the server's truth, the guards alive, and what each
/// guard reported before.
pub(crate) struct World {
    pub(crate) server: Arc<SimServer>,
    pub(crate) log: Arc<EventLog>,
    pub(crate) violations: Mutex<Vec<Violation>>,
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
    pub(crate) calls: AtomicUsize,
    pub(crate) acquired: AtomicUsize,
    pub(crate) with_lock_ok: AtomicUsize,
}

impl World {
    pub(crate) fn new(server: Arc<SimServer>) -> Self {
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
    pub(crate) fn violate(&self, invariant: &'static str, detail: String) {
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
    pub(crate) fn spinning(&self, who: &str) -> bool {
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

    pub(crate) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    pub(crate) fn register(&self, who: &Arc<str>, guard: &Arc<LockGuard>) {
        lock(&self.guards).push((Arc::clone(who), Arc::downgrade(guard)));
    }

    /// Checks one guard against the server, at an instant when it may be asked.
    pub(crate) fn check(&self, who: &str, guard: &LockGuard, when: &str) {
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

/// A random wait between two checks. The waits grow as a schedule goes on, so that a
/// schedule spanning hours of virtual time wakes its checkers a few thousand times, not
/// millions (each wake costs real time).
pub(crate) fn check_wait(rng: &mut StdRng, every_ms: u64, wakes: u32) -> Duration {
    let every_ms = every_ms.saturating_mul(1 << (wakes / 100).min(20));
    if rng.random_bool(0.1) {
        Duration::from_micros(rng.random_range(1..=999))
    } else {
        ms(rng.random_range(1..=every_ms))
    }
}

/// Wakes at random times and checks every guard from `acquire`.
pub(crate) async fn checker(world: Arc<World>, mut rng: StdRng, every_ms: u64) {
    let mut wakes = 0;
    while !world.stopped() {
        sleep(check_wait(&mut rng, every_ms, wakes)).await;
        wakes += 1;
        world.check_all();
    }
}
