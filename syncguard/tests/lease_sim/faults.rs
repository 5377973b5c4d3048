//! The fault layer: the server as a client reaches it, through delays, reordering, refused
//! requests, lost answers and callers that give up.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use syncguard::backend::key::normalize_key;
use syncguard::backend::time::ttl_millis;
use syncguard::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockInfo, Lookup,
    ReleaseOutcome,
};
use syncguard::{LockError, LockId};
use tokio::sync::oneshot;
use tokio::time::{sleep, timeout};

use crate::checker::World;
use crate::server::SimServer;
use crate::util::{lock, ms};

/// How unreliable a schedule's network and server are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FaultProfile {
    /// Every request and answer takes up to this long.
    pub(crate) latency_ms: u64,
    /// The share of calls that get a fault on top.
    pub(crate) fault_rate: f64,
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

pub(crate) struct Faults {
    pub(crate) profile: FaultProfile,
    pub(crate) rng: Mutex<StdRng>,
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
pub(crate) struct Faulty {
    pub(crate) server: Arc<SimServer>,
    pub(crate) faults: Arc<Faults>,
    pub(crate) world: Arc<World>,
    pub(crate) who: Arc<str>,
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
