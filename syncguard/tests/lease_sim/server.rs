//! The simulated lock server: a lock table on tokio's paused clock, with no tolerance.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use syncguard::backend::key::normalize_key;
use syncguard::backend::time::{now_ms, ttl_millis};
use syncguard::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, Lease, LockBackend, LockInfo, Lookup,
    NotHeldReason, ReleaseOutcome, TimeAuthority,
};
use syncguard::{Fence, LockError, LockId};
use tokio::time::Instant;

use crate::event_log::EventLog;
use crate::util::{lock, ms};

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
pub(crate) struct SimServer {
    table: Mutex<Table>,
    pub(crate) log: Arc<EventLog>,
}

/// The expiry in Unix ms as a backend reports it: the real wall clock (which the guard
/// calibrates against, and which barely moves) plus the virtual time left.
fn expires_at_ms(expiry: Instant, now: Instant) -> u64 {
    let left = u64::try_from(expiry.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX);
    now_ms().saturating_add(left)
}

impl SimServer {
    pub(crate) fn new(log: Arc<EventLog>) -> Self {
        Self {
            table: Mutex::new(Table::default()),
            log,
        }
    }

    pub(crate) fn apply_acquire(
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
            return Ok(AcquireOutcome::contended(None));
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

    pub(crate) fn apply_extend(
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
                other => format!("{other:?}"),
            }
        ));
        Ok(outcome)
    }

    pub(crate) fn apply_release(
        &self,
        who: &str,
        lock_id: &LockId,
    ) -> Result<ReleaseOutcome, LockError> {
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
    pub(crate) fn is_live(&self, lock_id: &LockId) -> bool {
        let table = lock(&self.table);
        let now = Instant::now();
        table
            .by_id
            .get(lock_id)
            .is_some_and(|&i| table.acquisitions[i].live(now))
    }

    /// The live lock on `key`: its lock id and fence.
    pub(crate) fn holder(&self, key: &str) -> Option<(LockId, Fence)> {
        let table = lock(&self.table);
        let now = Instant::now();
        let acquisition = &table.acquisitions[*table.latest.get(key)?];
        acquisition
            .live(now)
            .then(|| (acquisition.lock_id.clone(), acquisition.fence))
    }

    pub(crate) fn fence_of(&self, lock_id: &LockId) -> Option<Fence> {
        let table = lock(&self.table);
        table
            .by_id
            .get(lock_id)
            .map(|&i| table.acquisitions[i].fence)
    }

    pub(crate) fn label(&self, lock_id: &LockId) -> String {
        let table = lock(&self.table);
        table.by_id.get(lock_id).map_or_else(
            || "an unknown lock".to_owned(),
            |&i| table.acquisitions[i].label(),
        )
    }

    /// What became of a lock, for a violation's message.
    pub(crate) fn fate(&self, lock_id: &LockId) -> String {
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
