//! Holders on Redis (`acquire_as`, `extend_by`): the optional `holder` field of the lock JSON
//! (written only when given, byte-compatible with what cjson writes), records written the way
//! the reference writes them (never re-entered), the reference's cjson extend (keeps the
//! holder), locks shared by holder between backends, and exclusivity under batched
//! concurrent calls.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::AsyncCommands as _;
use redis::aio::MultiplexedConnection;
use syncguard::backend::time::TIME_TOLERANCE_MS;
use syncguard::backend::{AcquireOutcome, ExtendOutcome, Lease, LockBackend};
use syncguard::redis::RedisBackend;
use syncguard::{Fence, LockId, get_by_id, get_by_key};
use tokio::time::{Instant, sleep};

use crate::{acquired, both_backends, raw, redis_url, unique};

/// A holder with everything JSON escapes: quotes, a slash (cjson writes `\/`), a backslash,
/// a control character and non-ASCII text.
const TRICKY: &str = "{\"owner\":\"svc/a\\b\",\"instanceId\":\"w\t1 é€\"}";

async fn acquired_as(backend: &RedisBackend, key: &str, ttl: Duration, holder: &str) -> Lease {
    match backend.acquire_as(key, ttl, holder).await {
        Ok(AcquireOutcome::Acquired(lease)) => lease,
        other => panic!("{holder:?} should take {key:?}, got {other:?}"),
    }
}

async fn stored_json(conn: &mut MultiplexedConnection, lock_key: &str) -> String {
    let json: Option<String> = conn.get(lock_key).await.unwrap();
    json.unwrap_or_else(|| panic!("no lock data under {lock_key}"))
}

/// Whether lock JSON has a `holder` field (of any value).
fn has_holder(json: &str) -> bool {
    let data: serde_json::Value = serde_json::from_str(json).unwrap();
    data.as_object().unwrap().contains_key("holder")
}

/// What the reference's acquire script stores (`cjson.encode` of its table), with `holder`
/// added first to the table when given (`nil` leaves it out).
async fn cjson_record(
    conn: &mut MultiplexedConnection,
    lease: &Lease,
    acquired_at_ms: u64,
    key: &str,
    holder: Option<&str>,
) -> String {
    crate::eval(
        "local holder = ARGV[6] ~= '' and ARGV[6] or nil \
         return cjson.encode({holder=holder, lockId=ARGV[1], expiresAtMs=tonumber(ARGV[2]), \
         acquiredAtMs=tonumber(ARGV[3]), key=ARGV[4], fence=ARGV[5]})",
        &[],
    )
    .arg(lease.lock_id.as_str())
    .arg(lease.expires_at_ms)
    .arg(acquired_at_ms)
    .arg(key)
    .arg(lease.fence.to_string())
    .arg(holder.unwrap_or(""))
    .query_async(conn)
    .await
    .unwrap()
}

/// The PTTL of a Redis key.
async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    conn.pttl(key).await.unwrap()
}

/// `holder` is in the JSON exactly when the lock was taken with one, written as cjson writes
/// it; re-entry rewrites the record with a fresh lease and renews both TTLs; `extend_by` adds
/// to the expiry and to both TTLs; lookup reads the holder back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_holds_the_holder_only_when_given() {
    let mut conn = raw(&redis_url()).await;
    for backend in both_backends().await {
        let key = format!("{}:a/é", unique("holder-json"));
        let lock_key = backend.lock_key(&key).unwrap();
        let lease = acquired_as(&backend, &key, Duration::from_secs(30), TRICKY).await;
        let index_key = backend.index_key(&lease.lock_id).unwrap();

        let json = stored_json(&mut conn, &lock_key).await;
        let data: serde_json::Value = serde_json::from_str(&json).unwrap();
        let object = data.as_object().unwrap();
        assert_eq!(object.len(), 7, "{json}");
        assert_eq!(object["unclaimed"], true, "taken with a holder: unclaimed");
        assert_eq!(object["holder"], TRICKY);
        assert_eq!(object["lockId"], lease.lock_id.as_str());
        assert_eq!(object["fence"], lease.fence.to_string());
        assert_eq!(object["expiresAtMs"], lease.expires_at_ms);
        let acquired_at = object["acquiredAtMs"].as_u64().unwrap();
        assert_eq!(acquired_at + 30_000, lease.expires_at_ms);
        let reference = cjson_record(&mut conn, &lease, acquired_at, &key, Some(TRICKY)).await;
        let reference = format!(
            "{},\"unclaimed\":true}}",
            reference.strip_suffix('}').unwrap()
        );
        assert_eq!(
            json, reference,
            "what cjson writes for the same table, then the mark"
        );
        assert!(json.contains("\\/"), "cjson escapes '/': {json}");
        let raw_info = get_by_key(&backend, &key)
            .await
            .unwrap()
            .map(syncguard::LockInfo::reveal)
            .expect("held");
        assert_eq!(raw_info.holder.as_deref(), Some(TRICKY));

        // Re-entry: same lock id and fence, acquired now, expiring now + the new ttl; both
        // keys live for the new lease.
        sleep(Duration::from_millis(20)).await;
        let again = acquired_as(&backend, &key, Duration::from_secs(60), TRICKY).await;
        assert_eq!((&again.lock_id, again.fence), (&lease.lock_id, lease.fence));
        let json = stored_json(&mut conn, &lock_key).await;
        let data: serde_json::Value = serde_json::from_str(&json).unwrap();
        let reacquired_at = data["acquiredAtMs"].as_u64().unwrap();
        assert!(
            reacquired_at > acquired_at,
            "{acquired_at} then {reacquired_at}"
        );
        assert_eq!(reacquired_at + 60_000, again.expires_at_ms);
        let reference = cjson_record(&mut conn, &again, reacquired_at, &key, Some(TRICKY)).await;
        assert_eq!(json, reference, "re-entry writes the same layout, claimed");
        for redis_key in [&lock_key, &index_key] {
            let left = pttl(&mut conn, redis_key).await;
            assert!(
                left > 59_000 && left <= 61_000,
                "{redis_key}: {left} ms left"
            );
        }

        // extend_by: added to the expiry, and to both TTLs; only the expiry's digits change.
        let extended = backend
            .extend_by(&lease.lock_id, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(extended.expires_at_ms(), Some(again.expires_at_ms + 30_000));
        let after = stored_json(&mut conn, &lock_key).await;
        assert_eq!(
            after,
            json.replace(
                &again.expires_at_ms.to_string(),
                &(again.expires_at_ms + 30_000).to_string()
            )
        );
        for redis_key in [&lock_key, &index_key] {
            let left = pttl(&mut conn, redis_key).await;
            assert!(
                left > 89_000 && left <= 91_000,
                "{redis_key}: {left} ms left"
            );
        }
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());

        // Without a holder: no field at all (not null), none read back.
        let plain = acquired(&backend, &key, Duration::from_secs(30)).await;
        let json = stored_json(&mut conn, &lock_key).await;
        assert!(!has_holder(&json), "{json}");
        let data: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(data.as_object().unwrap().len(), 5, "{json}");
        let raw_info = get_by_key(&backend, &key)
            .await
            .unwrap()
            .map(syncguard::LockInfo::reveal)
            .expect("held");
        assert_eq!(raw_info.holder, None);
        let extended = backend
            .extend_by(&plain.lock_id, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(extended.expires_at_ms(), Some(plain.expires_at_ms + 5_000));
        assert!(!has_holder(&stored_json(&mut conn, &lock_key).await));
        assert!(backend.release(&plain.lock_id).await.unwrap().is_released());
    }
}

/// Stores a live lock the way the reference's acquire script does (its table through cjson,
/// both keys with `PX` = ttl), with `holder` set to what `holder_lua` evaluates to (`nil`: no
/// field). Returns the lock id, the fence and the JSON.
async fn store_like_the_reference(
    conn: &mut MultiplexedConnection,
    backend: &RedisBackend,
    key: &str,
    holder_lua: &str,
) -> (LockId, Fence, String) {
    let lock_key = backend.lock_key(key).unwrap();
    let lock_id = LockId::generate();
    let script = format!(
        "local t = redis.call('TIME') \
         local now = t[1] * 1000 + math.floor(t[2] / 1000) \
         local fence = string.format('%015d', redis.call('INCR', KEYS[3])) \
         local data = cjson.encode({{lockId=ARGV[1], expiresAtMs=now + 30000, \
           acquiredAtMs=now, key=ARGV[2], fence=fence, holder={holder_lua}}}) \
         redis.call('SET', KEYS[1], data, 'PX', 30000) \
         redis.call('SET', KEYS[2], KEYS[1], 'PX', 30000) \
         return {{fence, data}}"
    );
    let index_key = backend.index_key(&lock_id).unwrap();
    let fence_key = backend.fence_key(key).unwrap();
    let (fence, json): (String, String) =
        crate::eval(&script, &[&lock_key, &index_key, &fence_key])
            .arg(lock_id.as_str())
            .arg(key)
            .query_async(conn)
            .await
            .unwrap();
    (lock_id, fence.parse().unwrap(), json)
}

/// A record written as the reference writes it (no `holder`, or a JSON `null` one) is taken
/// by nobody: no holder re-enters it, nothing of it changes (but the contended mark of the
/// first refusal), and lookup shows no holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_records_without_holder_are_never_reentered() {
    let mut conn = raw(&redis_url()).await;
    for backend in both_backends().await {
        for holder_lua in ["nil", "cjson.null"] {
            let key = unique("reference-record");
            let lock_key = backend.lock_key(&key).unwrap();
            let (lock_id, fence, json) =
                store_like_the_reference(&mut conn, &backend, &key, holder_lua).await;
            assert_eq!(has_holder(&json), holder_lua != "nil", "{json}");

            let raw_info = get_by_key(&backend, &key)
                .await
                .unwrap()
                .map(syncguard::LockInfo::reveal)
                .expect("held");
            assert_eq!(raw_info.holder, None);
            assert_eq!((&raw_info.lock_id, raw_info.info.fence), (&lock_id, fence));

            let lock_id_text = lock_id.to_string();
            let fence_text = fence.to_string();
            for holder in [
                "anyone",
                "null",
                "nil",
                "false",
                " ",
                lock_id_text.as_str(),
                fence_text.as_str(),
                key.as_str(),
                TRICKY,
            ] {
                let outcome = backend
                    .acquire_as(&key, Duration::from_secs(10), holder)
                    .await
                    .unwrap();
                assert!(outcome.is_contended(), "{holder:?}: {outcome:?}");
            }
            // Unchanged but for the mark the first refusal adds (its release then publishes).
            let marked = format!("{},\"contended\":true}}", json.strip_suffix('}').unwrap());
            assert_eq!(stored_json(&mut conn, &lock_key).await, marked, "unchanged");
            // The reference's lock stays its own: released by its lock id.
            assert!(backend.release(&lock_id).await.unwrap().is_released());
        }
    }
}

/// The reference's extend (as its specification prescribes: `cjson.decode`, set
/// `expiresAtMs`, `cjson.encode`) keeps the `holder` field, reordered: the holder still
/// re-enters the lock, another holder still does not, and `extend_by` still works on it. (The
/// reference's own scripts are not in this repository; this is their prescribed pattern.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_references_cjson_extend_keeps_the_holder() {
    let mut conn = raw(&redis_url()).await;
    let [backend, _] = both_backends().await;
    let key = unique("reference-extend");
    let lock_key = backend.lock_key(&key).unwrap();
    let lease = acquired_as(&backend, &key, Duration::from_secs(5), TRICKY).await;
    let index_key = backend.index_key(&lease.lock_id).unwrap();

    let extended_to: u64 = crate::eval(
        "local lockKey = redis.call('GET', KEYS[1]) \
         local data = cjson.decode(redis.call('GET', lockKey)) \
         if data.lockId ~= ARGV[1] then return 0 end \
         local t = redis.call('TIME') \
         local now = t[1] * 1000 + math.floor(t[2] / 1000) \
         data.expiresAtMs = now + tonumber(ARGV[2]) \
         redis.call('SET', lockKey, cjson.encode(data), 'PX', ARGV[2]) \
         redis.call('SET', KEYS[1], lockKey, 'PX', ARGV[2]) \
         return data.expiresAtMs",
        &[&index_key],
    )
    .arg(lease.lock_id.as_str())
    .arg(20_000)
    .query_async(&mut conn)
    .await
    .unwrap();
    let json = stored_json(&mut conn, &lock_key).await;
    let data: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(data["holder"], TRICKY, "kept: {json}");
    assert_eq!(data["expiresAtMs"], extended_to);

    let raw_info = get_by_id(&backend, &lease.lock_id)
        .await
        .unwrap()
        .map(syncguard::LockInfo::reveal)
        .expect("held");
    assert_eq!(raw_info.holder.as_deref(), Some(TRICKY));
    assert_eq!(raw_info.info.expires_at_ms, extended_to);
    assert!(
        backend
            .acquire_as(&key, Duration::from_secs(5), "client-b")
            .await
            .unwrap()
            .is_contended()
    );
    let by = backend
        .extend_by(&lease.lock_id, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(by.expires_at_ms(), Some(extended_to + 1_000));
    let again = acquired_as(&backend, &key, Duration::from_secs(10), TRICKY).await;
    assert_eq!((&again.lock_id, again.fence), (&lease.lock_id, lease.fence));
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

/// Two backends (two server processes) share a lock by holder: the other one re-enters it,
/// extends it by an amount and releases it, each through the reverse index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_share_locks_by_holder() {
    let mut conn = raw(&redis_url()).await;
    let [first, second] = both_backends().await;
    let key = unique("shared-holder");
    let lease = acquired_as(&first, &key, Duration::from_secs(5), "client-a").await;
    assert!(
        second
            .acquire_as(&key, Duration::from_secs(5), "client-b")
            .await
            .unwrap()
            .is_contended()
    );
    let again = acquired_as(&second, &key, Duration::from_secs(5), "client-a").await;
    assert_eq!((&again.lock_id, again.fence), (&lease.lock_id, lease.fence));
    let extended = second
        .extend_by(&lease.lock_id, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(extended.expires_at_ms(), Some(again.expires_at_ms + 2_000));
    assert!(second.release(&lease.lock_id).await.unwrap().is_released());
    assert!(!first.is_locked(&key).await.unwrap());
    assert!(matches!(
        first
            .extend_by(&lease.lock_id, Duration::from_secs(2))
            .await
            .unwrap(),
        ExtendOutcome::NotHeld(_)
    ));
    let gone: Option<String> = conn.get(first.lock_key(&key).unwrap()).await.unwrap();
    assert!(gone.is_none(), "not revived: {gone:?}");
}

/// One lock (one lock id) as the contending tasks saw it, in server time.
#[derive(Default)]
struct Seen {
    holders: Vec<usize>,
    fences: Vec<Fence>,
    /// When it was first granted, and last (re-entered).
    first_granted_ms: Option<u64>,
    last_granted_ms: u64,
    /// The expiry of its latest re-entry: with one ttl for all, its final expiry.
    last_expires_ms: u64,
    released: bool,
}

/// 32 tasks for 4 holders hammer one key with `acquire_as` (batched together), with short
/// leases: after 4 acquisitions of a lock, its holder releases it (even fences) or lets it
/// expire (odd fences, its tasks pausing past the expiry and tolerance). A lock id only ever
/// goes to one holder, re-entries keep its fence, and no lock is taken while an earlier one is
/// live. The check is in server time: a lease expires at its batch's `TIME` + ttl, so it says
/// when it was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_acquire_as_keeps_exclusivity() {
    const TTL_MS: u64 = 100;
    const TTL: Duration = Duration::from_millis(TTL_MS);
    const PAUSE: Duration = Duration::from_millis(TTL_MS + TIME_TOLERANCE_MS + 100);
    for backend in both_backends().await {
        let key = unique("holders-hammer");
        let seen: Arc<Mutex<BTreeMap<LockId, Seen>>> = Arc::default();
        let paused: Arc<Mutex<[Instant; 4]>> = Arc::new(Mutex::new([Instant::now(); 4]));
        let until = Instant::now() + Duration::from_millis(3_000);
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..32_usize {
            let (backend, key) = (backend.clone(), key.clone());
            let (seen, paused) = (Arc::clone(&seen), Arc::clone(&paused));
            tasks.spawn(async move {
                let holder = task % 4;
                let name = format!("client-{holder}");
                let mut round = 0_u64;
                while Instant::now() < until {
                    round += 1;
                    if Instant::now() < paused.lock().unwrap()[holder] {
                        sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                    let outcome = backend.acquire_as(&key, TTL, &name).await.unwrap();
                    if let AcquireOutcome::Acquired(lease) = outcome {
                        let granted = lease.expires_at_ms - TTL_MS;
                        let fourth = {
                            let mut seen = seen.lock().unwrap();
                            let entry = seen.entry(lease.lock_id.clone()).or_default();
                            entry.holders.push(holder);
                            entry.fences.push(lease.fence);
                            entry.first_granted_ms =
                                Some(entry.first_granted_ms.unwrap_or(granted).min(granted));
                            entry.last_granted_ms = entry.last_granted_ms.max(granted);
                            entry.last_expires_ms = entry.last_expires_ms.max(lease.expires_at_ms);
                            entry.holders.len() == 4
                        };
                        if fourth && lease.fence.get() % 2 == 0 {
                            let released = backend.release(&lease.lock_id).await.unwrap();
                            if released.is_released() {
                                let mut seen = seen.lock().unwrap();
                                seen.get_mut(&lease.lock_id).unwrap().released = true;
                            }
                        } else if fourth {
                            paused.lock().unwrap()[holder] = Instant::now() + PAUSE;
                        }
                    }
                    sleep(Duration::from_millis(round % 3)).await;
                }
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined.unwrap();
        }

        let seen = std::mem::take(&mut *seen.lock().unwrap());
        let mut locks: Vec<Seen> = seen.into_values().collect();
        for lock in &locks {
            assert!(
                lock.holders.iter().all(|&h| h == lock.holders[0]),
                "one lock id, one holder: {:?}",
                lock.holders
            );
            assert!(
                lock.fences.iter().all(|&f| f == lock.fences[0]),
                "re-entry keeps the fence: {:?}",
                lock.fences
            );
        }
        assert!(
            locks.len() >= 3,
            "the lock changed hands: {} locks",
            locks.len()
        );
        assert!(locks.iter().any(|lock| lock.released), "some were released");
        assert!(
            locks.iter().any(|lock| lock.holders.len() > 1),
            "some lock was re-entered"
        );
        locks.sort_by_key(|lock| lock.fences[0]);
        for pair in locks.windows(2) {
            let (earlier, later) = (&pair[0], &pair[1]);
            assert!(earlier.fences[0] < later.fences[0], "fences are unique");
            let taken = later.first_granted_ms.unwrap();
            assert!(
                earlier.last_granted_ms <= taken,
                "holder {} re-entered at {} after holder {} took the lock at {taken}",
                earlier.holders[0],
                earlier.last_granted_ms,
                later.holders[0],
            );
            // A lock that was not released ends at its expiry, plus the tolerance.
            assert!(
                earlier.released || earlier.last_expires_ms + TIME_TOLERANCE_MS <= taken,
                "holder {} took the lock at {taken} while holder {}'s lease ran to {} (+ {} ms \
                 tolerance)",
                later.holders[0],
                earlier.holders[0],
                earlier.last_expires_ms,
                TIME_TOLERANCE_MS
            );
        }
    }
}

/// The release of an acquire as a holder whose caller never learnt its outcome (the batch's
/// `O` operation, which the backend sends for such an acquire in doubt): it releases the lock
/// the acquire took while it is unclaimed, not once a re-entry handed its lock id to another
/// caller, nor once an extend of any kind used it (as `syncguard-server`'s renew does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_release_leaves_a_claimed_lock() {
    let backend = crate::manager_backend().await;
    let batch = format!(
        "{}\nreturn batch(KEYS, ARGV)",
        include_str!("../../src/redis/lua/batch.lua")
    );
    // The reply of the `O` operation on `lock_id`.
    let release_unclaimed = async |lock_id: &LockId| -> redis::Value {
        let index_key = backend.index_key(lock_id).unwrap();
        let prefix = index_key.strip_suffix(lock_id.as_str()).unwrap().to_owned();
        let mut cmd = crate::eval(&batch, &[&index_key]);
        cmd.arg(TIME_TOLERANCE_MS)
            .arg(prefix)
            .arg("")
            .arg("O")
            .arg(lock_id.as_str());
        let mut conn = raw(&redis_url()).await;
        let reply: Vec<redis::Value> = cmd.query_async(&mut conn).await.unwrap();
        reply[1].clone()
    };
    let ttl = Duration::from_secs(30);

    let key = unique("orphan-unclaimed");
    let taken = acquired_as(&backend, &key, ttl, "client-a").await;
    let reply = release_unclaimed(&taken.lock_id).await;
    assert_eq!(reply, redis::Value::Int(1), "released: {reply:?}");
    assert!(!backend.is_locked(&key).await.unwrap());

    for claim in ["re-entry", "extend", "extend_by", "expire_at"] {
        let key = unique("orphan-claimed");
        let taken = acquired_as(&backend, &key, ttl, "client-a").await;
        let id = &taken.lock_id;
        let expires_at_ms = match claim {
            "re-entry" => Some(
                acquired_as(&backend, &key, ttl, "client-a")
                    .await
                    .expires_at_ms,
            ),
            "extend" => backend.extend(id, ttl).await.unwrap().expires_at_ms(),
            "extend_by" => backend.extend_by(id, ttl).await.unwrap().expires_at_ms(),
            _ => {
                let at = taken.expires_at_ms + 5_000;
                backend.expire_at(id, at).await.unwrap().expires_at_ms()
            }
        };
        assert!(expires_at_ms.is_some(), "{claim} applied");
        let reply = release_unclaimed(id).await;
        assert_eq!(
            reply,
            redis::Value::Int(0),
            "left after a {claim}: {reply:?}"
        );
        let info = get_by_key(&backend, &key)
            .await
            .unwrap()
            .map(syncguard::LockInfo::reveal)
            .expect("still held");
        assert_eq!(&info.lock_id, id, "{claim}");
        assert!(backend.release(id).await.unwrap().is_released());
    }
}
