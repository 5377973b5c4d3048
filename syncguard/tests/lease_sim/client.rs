//! Clients: each plays its rounds of a schedule, locking, holding and letting go, and checks
//! its guards as it goes.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use syncguard::backend::time::MAX_TTL;
use syncguard::{ErrorCode, LockError, LockGuard, LockOptions, LockOptionsBuilder, OnLost};
use tokio::time::{Instant, sleep};

use crate::checker::{OPTIONS_CHECKED, WITH_LOCK_OK, World, check_wait};
use crate::faults::Faulty;
use crate::schedule::{Action, Plan, gen_action, gen_gap, gen_options};
use crate::util::{lock, ms};

/// Virtual time a client may spend waiting (not stalled) on one hold: bounds the heartbeats,
/// which cost real time. Stalls are one jump each and do not count.
fn hold_budget(ttl: Duration) -> Duration {
    ttl.saturating_mul(100)
        .clamp(ms(50), Duration::from_secs(600))
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

pub(crate) struct Client {
    pub(crate) who: Arc<str>,
    pub(crate) world: Arc<World>,
    pub(crate) backend: Faulty,
    pub(crate) rng: StdRng,
    pub(crate) keys: Vec<String>,
}

impl Client {
    fn log(&self, line: impl fmt::Display) {
        self.world.log.push(format_args!("{} {line}", self.who));
    }

    pub(crate) async fn run(mut self, rounds: u32) {
        for _ in 0..rounds {
            if self.world.stopped() {
                break;
            }
            let plan = gen_options(&mut self.rng, &self.keys);
            if self.rng.random_bool(0.3) {
                self.with_lock_round(plan).await;
            } else {
                self.acquire_round(plan).await;
            }
            let gap = gen_gap(&mut self.rng);
            sleep(gap).await;
        }
    }

    /// The plan's options, or `None` (logged) if the builder refused them, which it must do
    /// for an invalid ttl and only then.
    fn build(&self, plan: &Plan, options: LockOptionsBuilder) -> Option<LockOptions> {
        let valid_ttl = (ms(1)..=MAX_TTL).contains(&plan.ttl);
        match options.build() {
            Ok(options) => {
                if !valid_ttl {
                    self.world.violate(
                        OPTIONS_CHECKED,
                        format!("{} built options with a ttl of {:?}", self.who, plan.ttl),
                    );
                }
                Some(options)
            }
            Err(error) => {
                self.log(format_args!("options refused: {error}"));
                if valid_ttl || error.code() != ErrorCode::InvalidArgument {
                    self.world.violate(
                        OPTIONS_CHECKED,
                        format!("{} got {error} for a ttl of {:?}", self.who, plan.ttl),
                    );
                }
                None
            }
        }
    }

    async fn acquire_round(&mut self, plan: Plan) {
        let Some(options) = self.build(&plan, plan.options.clone()) else {
            return;
        };
        let key = plan.key.as_str();
        self.log(format_args!("acquires {key} with {options:?}"));
        let guard = match syncguard::acquire(&self.backend, key, &options).await {
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

    async fn with_lock_round(&mut self, plan: Plan) {
        let on_lost = if self.rng.random_bool(0.5) {
            OnLost::Cancel
        } else {
            OnLost::Notify
        };
        let Some(options) = self.build(&plan, plan.options.clone().on_lost(on_lost)) else {
            return;
        };
        let key = plan.key.as_str();
        self.log(format_args!("runs with_lock on {key} with {options:?}"));
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
        let result = syncguard::with_lock(
            &self.backend,
            key,
            &options,
            async move |guard: &LockGuard| {
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
            },
        )
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
