//! One kill-the-primary trial on a Sentinel group, with replication lag injected: two backend
//! instances with eight workers each contend for three keys, recording every hold; the
//! replica's link (through a proxy) is held so that the grants of the next moment reach only
//! the primary, the primary is killed (`kill -9`) and the held bytes dropped, the replica
//! promoted by the Sentinels, and the killed server restarted (it rejoins as a replica). The holds are then checked with the
//! conformance history checker. Run by `benches/redis_sentinel_failover.rs`, the setting on
//! and off.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use syncguard::backend::LockBackend;
use syncguard::conformance::history::{History, Hold};
use syncguard::redis::{RedisBackend, RedisConfig};
use syncguard::{LockId, LockOptions, RetryPolicy};
use tokio::sync::Mutex;
use tokio::time::{Instant, sleep};

use crate::proxy::Proxy;
use crate::sentinels::SentinelGroup;

/// Longer than a failover takes here (about 2 to 3 s from the kill), so that a holder whose
/// grant the failover lost still holds its lease when the new primary grants the key again:
/// without waiting for the replica, that is two holders at once.
pub const TTL: Duration = Duration::from_secs(6);
const KEYS: usize = 3;
const INSTANCES: usize = 2;
const WORKERS_PER_INSTANCE: usize = 8;
/// Traffic before the fault, and after the group is whole again.
const BEFORE: Duration = Duration::from_millis(1000);
const AFTER: Duration = Duration::from_millis(2500);
/// How long the replica's link is held before the primary dies: the grants of that moment are
/// the primary's alone.
const LAG: Duration = Duration::from_millis(300);
/// The safe setting's wait for the replica.
const WAIT: Duration = Duration::from_millis(200);

/// What one trial saw.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub holds: usize,
    pub lost: usize,
    /// Two holders at once: over the three keys (both acted), and the probe's key granted
    /// again within the probe's lease.
    pub double_grants: usize,
    /// A fence granted twice, or fences out of the order their holders acted in.
    pub fence_violations: usize,
    /// From the kill to the moment each of the two clients (backend instances) had acquired
    /// a key again, the later of the two.
    pub every_client_back: Option<Duration>,
    /// Whether a lone acquire made while the replica lagged was granted (its key granted again
    /// after the failover, within its lease, counts among `double_grants`).
    pub probe_granted: bool,
    /// The violations, described.
    pub details: Vec<String>,
}

/// The backend configuration of a trial: waiting for the replica (`safe`) or not.
pub fn config(safe: bool) -> RedisConfig {
    if safe {
        RedisConfig::new().with_wait_for_replicas(1, WAIT)
    } else {
        RedisConfig::new()
    }
}

/// Runs one trial on `group` (whole, its primary named by every Sentinel) and leaves it whole
/// again, the roles swapped.
pub async fn kill_with_lag(group: &mut SentinelGroup, safe: bool) -> Outcome {
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        instances.push(
            RedisBackend::connect_with(&group.url(), config(safe))
                .await
                .expect("connect through the Sentinels"),
        );
    }
    let keys: Vec<String> = (0..KEYS)
        .map(|i| format!("trial:{i}:{}", LockId::generate()))
        .collect();
    let histories: Arc<Vec<History>> = Arc::new((0..KEYS).map(|_| History::new()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    // Each worker's acquisitions, to find when every worker was back after the kill.
    let acquisitions: Arc<Mutex<Vec<Vec<Instant>>>> = Arc::new(Mutex::new(vec![
            Vec::new();
            INSTANCES * WORKERS_PER_INSTANCE
        ]));
    let mut workers = Vec::new();
    for (instance, backend) in instances.iter().enumerate() {
        for worker in 0..WORKERS_PER_INSTANCE {
            let index = instance * WORKERS_PER_INSTANCE + worker;
            let key_index = index % KEYS;
            let (backend, key) = (backend.clone(), keys[key_index].clone());
            let (histories, stop, acquisitions) = (
                Arc::clone(&histories),
                Arc::clone(&stop),
                Arc::clone(&acquisitions),
            );
            workers.push(tokio::spawn(async move {
                let holder = format!("instance {instance}, worker {worker}");
                work(
                    &backend,
                    &key,
                    &holder,
                    &histories[key_index],
                    &stop,
                    &acquisitions,
                    index,
                )
                .await;
            }));
        }
    }

    // The replica replicates through a proxy, which holds the stream when told to: a lag the
    // kernel cannot hide (a stopped replica would read what its socket buffered meanwhile).
    let primary = group.primary_port().await;
    let replica = group.other_than(primary);
    let link = Proxy::start(&format!("127.0.0.1:{primary}")).await;
    group.replicate_through(replica, link.addr()).await;
    sleep(BEFORE).await;
    link.stall();
    // A grant of this moment, made by a backend of its own so that the workers' batches do not
    // hold it back: kept by the failover only if the replica acknowledged it.
    let probe = format!("trial:probe:{}", LockId::generate());
    let probed_at = Instant::now();
    let probed = instances[0]
        .acquire(&probe, TTL)
        .await
        .ok()
        .and_then(|outcome| outcome.lease());
    sleep(LAG).await;
    group.server(primary).kill();
    let killed = Instant::now();
    // What the proxy held never reaches the replica.
    link.cut();
    group
        .wait_for_primary(replica, Duration::from_secs(60))
        .await;
    // The lagging moment's grant, if the failover lost it: its holder's lease runs on, and the
    // new primary grants the key to the next caller: two holders at once.
    let probe_regranted = if probed.is_some() {
        let second = RedisBackend::connect_with(&group.url(), config(false))
            .await
            .expect("connect through the Sentinels");
        let regranted = second
            .acquire(&probe, TTL)
            .await
            .ok()
            .and_then(|o| o.lease());
        regranted.is_some() && probed_at.elapsed() < TTL
    } else {
        false
    };
    // The killed server comes back with its data and is turned into the new primary's replica
    // (which the safe setting needs to grant anything again).
    group.server(primary).launch().await;
    group.wait_until_whole(replica).await;
    sleep(AFTER).await;
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.expect("a worker panicked");
    }

    let acquisitions = acquisitions.lock().await;
    let every_client_back = acquisitions
        .chunks(WORKERS_PER_INSTANCE)
        .map(|client| {
            client
                .iter()
                .filter_map(|times| times.iter().find(|at| **at > killed))
                .min()
                .map(|at| *at - killed)
        })
        .collect::<Option<Vec<_>>>()
        .and_then(|back| back.into_iter().max());
    let mut outcome = Outcome {
        every_client_back,
        probe_granted: probed.is_some(),
        double_grants: usize::from(probe_regranted),
        ..Outcome::default()
    };
    for history in histories.iter() {
        let holds = history.holds();
        outcome.holds += holds.len();
        outcome.lost += holds.iter().filter(|hold| hold.lost.is_some()).count();
        if let Err(violations) = history.check() {
            for violation in violations.0 {
                if violation.starts_with("two holders at once") {
                    outcome.double_grants += 1;
                } else {
                    outcome.fence_violations += 1;
                }
                outcome.details.push(violation);
            }
        }
    }
    outcome
}

/// One worker: acquires its key (waiting up to a second), acts every 20 ms while its guard
/// says it holds the lock, mostly for 20 to 120 ms and one hold in four for 3 to 5 s (kept by
/// the heartbeat, so that holds span the failover), and releases.
async fn work(
    backend: &RedisBackend,
    key: &str,
    holder: &str,
    history: &History,
    stop: &AtomicBool,
    acquisitions: &Mutex<Vec<Vec<Instant>>>,
    index: usize,
) {
    let options = LockOptions::builder()
        .ttl(TTL)
        .retry(
            RetryPolicy::wait_for(Duration::from_secs(1))
                .with_base_delay(Duration::from_millis(10)),
        )
        .build()
        .expect("valid options");
    let mut round = 0_u64;
    while !stop.load(Ordering::SeqCst) {
        round += 1;
        let Ok(guard) = syncguard::acquire(backend, key, &options).await else {
            sleep(Duration::from_millis(20)).await;
            continue;
        };
        let acquired = Instant::now();
        acquisitions.lock().await[index].push(acquired);
        let spread = round * 37 + index as u64 * 11;
        let hold_ms = if spread.is_multiple_of(4) {
            3_000 + spread % 2_000
        } else {
            20 + spread % 100
        };
        let until = acquired + Duration::from_millis(hold_ms);
        let mut actions = Vec::new();
        loop {
            let at = Instant::now();
            if guard.is_lost() {
                break;
            }
            actions.push(at);
            if at >= until {
                break;
            }
            sleep(Duration::from_millis(20)).await;
        }
        history.record(Hold {
            holder: holder.to_owned(),
            fence: guard.fence(),
            acquired,
            actions,
            lost: guard.lost_reason(),
        });
        guard.release_in_background().await;
    }
}
