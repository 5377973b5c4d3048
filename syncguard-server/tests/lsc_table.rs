//! The LSC-table mode (issue 19, item 5): the server on LockServiceCentral's own PostgreSQL
//! table, sharing it with LSC's statements run by hand (copied from LSC's specification,
//! section 5.2, with the table name substituted).
//!
//! Needs the test PostgreSQL: `bash scripts/with-services.sh cargo test -p syncguard-server
//! --all-features --test lsc_table` (a test fails, saying so, when it is missing).

#[path = "support/replica.rs"]
mod replica;
mod support;

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use replica::postgres_url;
use serde_json::json;
use sqlx::{AssertSqlSafe, PgPool};
use support::{TestServer, now_seconds};
use syncguard::backend::{AcquireOutcome, LockBackend};
use syncguard_server::{Auth, BackendSettings, LscTableBackend, open_backend};

/// A table name no other test (or run) uses.
fn fresh_table(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("lsc_{tag}_{}_{nanos}", std::process::id())
}

/// LSC's DDL (its PostgreSQL module's README), for `table`.
fn lsc_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    namespace      VARCHAR(255) NOT NULL,
    lock_name      VARCHAR(255) NOT NULL,
    owner          VARCHAR(255) NOT NULL,
    instance_id    VARCHAR(255) NOT NULL,
    lease_duration BIGINT       NOT NULL,
    expiry         BIGINT       NOT NULL,
    PRIMARY KEY (namespace, lock_name)
);
CREATE INDEX IF NOT EXISTS idx_{table}_expiry ON {table} (expiry);"
    )
}

/// LSC's statements on one table, run as LSC runs them (auto-commit, API clock for the
/// written expiry).
struct Lsc {
    pool: PgPool,
    table: String,
}

impl Lsc {
    /// LSC's acquire: `true` iff a row is returned.
    async fn acquire(
        &self,
        ns: &str,
        name: &str,
        owner: &str,
        instance: &str,
        d: i64,
        app_now: i64,
    ) -> bool {
        let sql = format!(
            "INSERT INTO {t} (namespace, lock_name, owner, instance_id, lease_duration, expiry)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (namespace, lock_name) DO UPDATE SET
    owner = EXCLUDED.owner, instance_id = EXCLUDED.instance_id,
    lease_duration = EXCLUDED.lease_duration, expiry = EXCLUDED.expiry
WHERE {t}.expiry < EXTRACT(EPOCH FROM now())::bigint
   OR ({t}.owner = EXCLUDED.owner AND {t}.instance_id = EXCLUDED.instance_id)
RETURNING namespace",
            t = self.table
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(ns)
            .bind(name)
            .bind(owner)
            .bind(instance)
            .bind(d)
            .bind(app_now + d)
            .fetch_optional(&self.pool)
            .await
            .unwrap()
            .is_some()
    }

    /// LSC's renew: `(lease_duration, expiry)` when a row is returned.
    async fn renew(
        &self,
        ns: &str,
        name: &str,
        owner: &str,
        instance: &str,
        d: i64,
    ) -> Option<(i64, i64)> {
        let sql = format!(
            "UPDATE {t} SET lease_duration = lease_duration + $1, expiry = expiry + $2
WHERE namespace = $3 AND lock_name = $4
  AND expiry >= EXTRACT(EPOCH FROM now())::bigint
  AND owner = $5 AND instance_id = $6
RETURNING lease_duration, expiry",
            t = self.table
        );
        sqlx::query_as(AssertSqlSafe(sql))
            .bind(d)
            .bind(d)
            .bind(ns)
            .bind(name)
            .bind(owner)
            .bind(instance)
            .fetch_optional(&self.pool)
            .await
            .unwrap()
    }

    /// The first statement of LSC's release (the holder's row deleted, even if expired).
    async fn release(&self, ns: &str, name: &str, owner: &str, instance: &str) -> bool {
        let sql = format!(
            "DELETE FROM {t} WHERE namespace = $1 AND lock_name = $2 AND owner = $3 AND instance_id = $4
RETURNING namespace",
            t = self.table
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(ns)
            .bind(name)
            .bind(owner)
            .bind(instance)
            .fetch_optional(&self.pool)
            .await
            .unwrap()
            .is_some()
    }

    /// Makes the rows of `lock_name` expired 5 s ago, as time passing would.
    async fn lapse(&self, lock_name: &str) {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET expiry = $1 WHERE lock_name = $2",
            self.table
        )))
        .bind(now() - 5)
        .bind(lock_name)
        .execute(&self.pool)
        .await
        .unwrap();
    }

    /// The fence counter of a lock (our side table), `None` before any acquisition counted.
    async fn counter(&self, ns: &str, name: &str) -> Option<u64> {
        let sql = format!(
            "SELECT fence FROM {t}_fences WHERE namespace = $1 AND lock_name = $2",
            t = self.table
        );
        let row: Option<(i64,)> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(ns)
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .unwrap();
        row.map(|(fence,)| u64::try_from(fence).unwrap())
    }

    /// LSC's get: `(owner, instance_id, lease_duration, expiry)`.
    async fn get(&self, ns: &str, name: &str) -> Option<(String, String, i64, i64)> {
        let sql = format!(
            "SELECT owner, instance_id, lease_duration, expiry FROM {t} WHERE namespace = $1 AND lock_name = $2",
            t = self.table
        );
        sqlx::query_as(AssertSqlSafe(sql))
            .bind(ns)
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .unwrap()
    }
}

/// The server on a fresh LSC table (created by the server's setup unless `lsc_first`, where
/// LSC's DDL creates it first), with the fence trigger, and LSC's statements on the same table.
async fn start(tag: &str, lsc_first: bool) -> (TestServer, Lsc, Arc<dyn LockBackend>) {
    start_with(tag, lsc_first, true).await
}

/// As [`start`], with the fence trigger only if `fence_trigger`.
async fn start_with(
    tag: &str,
    lsc_first: bool,
    fence_trigger: bool,
) -> (TestServer, Lsc, Arc<dyn LockBackend>) {
    let url = postgres_url();
    let table = fresh_table(tag);
    let pool = syncguard::PostgresBackend::pool_options()
        .max_connections(4)
        .connect(&url)
        .await
        .unwrap();
    if lsc_first {
        sqlx::raw_sql(AssertSqlSafe(lsc_ddl(&table)))
            .execute(&pool)
            .await
            .unwrap();
    }
    let settings = BackendSettings::new(url)
        .lsc_table(&table)
        .lsc_fence_trigger(fence_trigger);
    let backend = open_backend(&settings).await.unwrap();
    assert_eq!(backend.capabilities().backend, "postgres-lsc-table");
    let server = TestServer::start(backend.clone(), Auth::disabled()).await;
    (server, Lsc { pool, table }, backend)
}

/// Acquires `ns/name` through the server as `instance` and releases it: the hold's token.
async fn hold_once(server: &TestServer, ns: &str, name: &str, instance: &str) -> u64 {
    let fence = server.acquire(ns, name, instance, 60).await.fence_value();
    let released = server.release(ns, name, instance).await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.text);
    fence
}

fn now() -> i64 {
    i64::try_from(now_seconds()).unwrap()
}

#[tokio::test]
async fn the_api_on_the_lsc_table() {
    let (server, lsc, _) = start("api", false).await;
    let before = now();
    let acquired = server.acquire("billing", "nightly", "worker-1", 60).await;
    assert_eq!(acquired.status, StatusCode::OK, "{}", acquired.text);
    let expiry = acquired.expiry();
    assert!((before + 60..=now() + 60).contains(&i64::try_from(expiry).unwrap()));
    assert_eq!(
        acquired.json(),
        json!({"success": true, "namespace": "billing", "lockName": "nightly",
               "owner": "anonymous", "instanceId": "worker-1", "leaseDuration": 60, "expiry": expiry})
    );
    let first = acquired.fence_value();
    // Stored as LSC stores it.
    assert_eq!(
        lsc.get("billing", "nightly").await,
        Some((
            "anonymous".into(),
            "worker-1".into(),
            60,
            i64::try_from(expiry).unwrap()
        ))
    );

    let status = server.status("billing", "nightly").await;
    assert_eq!(
        status.json(),
        json!({"namespace": "billing", "lockName": "nightly", "owner": "anonymous", "expiry": expiry})
    );
    assert_eq!(status.fence_value(), first);

    let refused = server.acquire("billing", "nightly", "worker-2", 60).await;
    assert_eq!(refused.status, StatusCode::LOCKED);
    assert_eq!(
        refused.json(),
        json!({"success": false, "namespace": "billing", "lockName": "nightly"})
    );

    let renewed = server.renew("billing", "nightly", "worker-1", 30).await;
    assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.text);
    assert_eq!(renewed.expiry(), expiry + 30);
    assert_eq!(renewed.json()["leaseDuration"], 90);
    assert_eq!(renewed.fence_value(), first);
    assert_eq!(lsc.get("billing", "nightly").await.unwrap().2, 90);

    // A same-holder acquire resets the lease and keeps the fence.
    let again = server.acquire("billing", "nightly", "worker-1", 10).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.json()["leaseDuration"], 10);
    assert_eq!(again.fence_value(), first);

    assert_eq!(
        server
            .renew("billing", "nightly", "worker-2", 30)
            .await
            .status,
        StatusCode::LOCKED
    );
    assert_eq!(
        server
            .release("billing", "nightly", "worker-2")
            .await
            .status,
        StatusCode::LOCKED
    );
    let released = server.release("billing", "nightly", "worker-1").await;
    assert_eq!(released.status, StatusCode::OK);
    assert_eq!(
        released.json(),
        json!({"success": true, "namespace": "billing", "lockName": "nightly"})
    );
    assert_eq!(lsc.get("billing", "nightly").await, None);
    let free = server.status("billing", "nightly").await;
    assert_eq!(
        free.json(),
        json!({"namespace": "billing", "lockName": "nightly"})
    );
    assert_eq!(free.fence(), None);
    // Releasing a missing lock succeeds, renewing it does not.
    assert_eq!(
        server
            .release("billing", "nightly", "worker-1")
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        server
            .renew("billing", "nightly", "worker-1", 5)
            .await
            .status,
        StatusCode::LOCKED
    );

    let second = server.acquire("billing", "nightly", "worker-2", 60).await;
    assert_eq!(second.status, StatusCode::OK);
    assert!(second.fence_value() > first);
}

#[tokio::test]
async fn sharing_the_table_with_lsc() {
    let (server, lsc, _) = start("share", true).await;

    // A lock LSC took: seen with its owner, refused to another instance, renewed and
    // released through the server by its holder.
    assert!(
        lsc.acquire("ns1", "shared", "anonymous", "lsc-1", 60, now())
            .await
    );
    let expiry = lsc.get("ns1", "shared").await.unwrap().3;
    let status = server.status("ns1", "shared").await;
    assert_eq!(
        status.json(),
        json!({"namespace": "ns1", "lockName": "shared", "owner": "anonymous", "expiry": expiry})
    );
    let fence = status.fence_value();
    assert_eq!(
        server.acquire("ns1", "shared", "other", 60).await.status,
        StatusCode::LOCKED
    );
    let renewed = server.renew("ns1", "shared", "lsc-1", 30).await;
    assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.text);
    assert_eq!(renewed.json()["leaseDuration"], 90);
    assert_eq!(renewed.expiry(), u64::try_from(expiry + 30).unwrap());
    assert_eq!(renewed.fence_value(), fence);
    assert_eq!(
        lsc.get("ns1", "shared").await,
        Some(("anonymous".into(), "lsc-1".into(), 90, expiry + 30))
    );
    // LSC's renew of the same row keeps working beside the server's.
    assert_eq!(
        lsc.renew("ns1", "shared", "anonymous", "lsc-1", 10).await,
        Some((100, expiry + 40))
    );
    assert_eq!(
        server.release("ns1", "shared", "lsc-1").await.status,
        StatusCode::OK
    );
    assert_eq!(lsc.get("ns1", "shared").await, None);

    // An expired LSC row is taken over by the server.
    assert!(
        lsc.acquire("ns1", "stale", "anonymous", "lsc-old", 5, now() - 10)
            .await
    );
    assert_eq!(
        server.status("ns1", "stale").await.json(),
        json!({"namespace": "ns1", "lockName": "stale"})
    );
    let taken = server.acquire("ns1", "stale", "srv-1", 60).await;
    assert_eq!(taken.status, StatusCode::OK, "{}", taken.text);
    let taken_fence = taken.fence_value();
    let row = lsc.get("ns1", "stale").await.unwrap();
    assert_eq!(
        (row.0.as_str(), row.1.as_str(), row.2),
        ("anonymous", "srv-1", 60)
    );

    // LSC refuses the server's live lock to another holder ...
    assert!(
        !lsc.acquire("ns1", "stale", "anonymous", "lsc-2", 60, now())
            .await
    );
    assert!(
        !lsc.acquire("ns1", "stale", "someone", "srv-1", 60, now())
            .await
    );
    // ... renews it for its holder (seen by the server) ...
    assert_eq!(
        lsc.renew("ns1", "stale", "anonymous", "srv-1", 5).await,
        Some((65, row.3 + 5))
    );
    assert_eq!(
        server.status("ns1", "stale").await.expiry(),
        u64::try_from(row.3 + 5).unwrap()
    );
    // ... and its holder's release deletes it: the server sees it free.
    assert!(lsc.release("ns1", "stale", "anonymous", "srv-1").await);
    assert_eq!(
        server.status("ns1", "stale").await.json(),
        json!({"namespace": "ns1", "lockName": "stale"})
    );
    // The server's own release of the lock LSC released: nothing to release.
    assert_eq!(
        server.release("ns1", "stale", "srv-1").await.status,
        StatusCode::OK
    );
    let next = server.acquire("ns1", "stale", "srv-2", 60).await;
    assert_eq!(next.status, StatusCode::OK);
    assert!(next.fence_value() > taken_fence);

    // LSC takes over a lapsed server lock: the server's holder can no longer act on it.
    assert_eq!(
        server.acquire("ns1", "lapsed", "srv-3", 60).await.status,
        StatusCode::OK
    );
    lsc.lapse("lapsed").await;
    assert!(
        lsc.acquire("ns1", "lapsed", "anonymous", "lsc-4", 60, now())
            .await
    );
    assert_eq!(
        server.renew("ns1", "lapsed", "srv-3", 10).await.status,
        StatusCode::LOCKED
    );
    assert_eq!(
        server.release("ns1", "lapsed", "srv-3").await.status,
        StatusCode::LOCKED
    );
    assert_eq!(lsc.get("ns1", "lapsed").await.unwrap().1, "lsc-4");
}

#[tokio::test]
async fn fences_never_go_back() {
    let (server, lsc, _) = start("fence", false).await;
    let first = server.acquire("ns2", "lock", "a-1", 60).await.fence_value();
    assert_eq!(
        server.release("ns2", "lock", "a-1").await.status,
        StatusCode::OK
    );
    let second = server.acquire("ns2", "lock", "a-1", 60).await.fence_value();
    assert_eq!(second, first + 1);
    // Rows deleted behind the server's back (LSC's release, a cleanup job): the counters stay.
    assert!(lsc.release("ns2", "lock", "anonymous", "a-1").await);
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {} WHERE expiry < EXTRACT(EPOCH FROM now())::bigint",
        lsc.table
    )))
    .execute(&lsc.pool)
    .await
    .unwrap();
    let third = server.acquire("ns2", "lock", "b-1", 60).await.fence_value();
    assert_eq!(third, second + 1);
    let other = server
        .acquire("ns2", "other", "b-1", 60)
        .await
        .fence_value();
    assert_eq!(other, 1, "counters are per lock");
}

#[tokio::test]
async fn the_backend_contract() {
    let url = postgres_url();
    let backend = LscTableBackend::connect(&url, &fresh_table("contract"))
        .await
        .unwrap();
    backend.setup().await.unwrap();
    backend.setup().await.unwrap(); // idempotent
    let holder = r#"{"owner":"anonymous","instanceId":"worker-1"}"#;
    let ttl = Duration::from_secs(30);
    // No holder, no lock; keys are `namespace:lockName`.
    assert!(backend.acquire("ns:x", ttl).await.is_err());
    assert!(backend.acquire_as("no-colon", ttl, holder).await.is_err());
    assert!(backend.acquire_as("ns:x", ttl, "worker-1").await.is_err());

    let AcquireOutcome::Acquired(lease) = backend.acquire_as("ns:x", ttl, holder).await.unwrap()
    else {
        panic!("free");
    };
    let info = syncguard::get_by_id(&backend, &lease.lock_id)
        .await
        .unwrap()
        .map(syncguard::LockInfo::reveal)
        .expect("live");
    assert_eq!(info.key, "ns:x");
    assert_eq!(info.holder.as_deref(), Some(holder));
    assert_eq!(info.info.expires_at_ms, lease.expires_at_ms);
    assert_eq!(info.info.acquired_at_ms, lease.expires_at_ms - 30_000);
    assert!(backend.is_locked("ns:x").await.unwrap());
    // extend_by takes whole seconds.
    assert!(
        backend
            .extend_by(&lease.lock_id, Duration::from_millis(1500))
            .await
            .is_err()
    );
    let extended = backend
        .extend_by(&lease.lock_id, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(extended.expires_at_ms(), Some(lease.expires_at_ms + 5_000));
    let reset = backend.extend(&lease.lock_id, ttl).await.unwrap();
    // An LSC takeover of the lapsed row invalidates the lock id (derived from the row).
    let lsc = Lsc {
        pool: backend.pool().clone(),
        table: backend.table().to_owned(),
    };
    lsc.lapse("x").await;
    assert!(
        lsc.acquire("ns", "y", "anonymous", "lsc-1", 60, now())
            .await
    );
    assert!(
        lsc.acquire("ns", "x", "anonymous", "lsc-1", 60, now())
            .await
    );
    assert!(!backend.release(&lease.lock_id).await.unwrap().is_released());
    assert!(
        backend
            .extend_by(&lease.lock_id, Duration::from_secs(5))
            .await
            .unwrap()
            .expires_at_ms()
            .is_none()
    );
    assert!(
        syncguard::get_by_id(&backend, &lease.lock_id)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(lsc.get("ns", "x").await.unwrap().1, "lsc-1");
    // The holder takes it again once LSC's holder let go.
    assert!(lsc.release("ns", "x", "anonymous", "lsc-1").await);
    let AcquireOutcome::Acquired(lease) = backend.acquire_as("ns:x", ttl, holder).await.unwrap()
    else {
        panic!("free again");
    };
    assert!(reset.expires_at_ms().unwrap() <= lease.expires_at_ms + 1_000);
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    assert!(!backend.release(&lease.lock_id).await.unwrap().is_released());
    assert!(!backend.is_locked("ns:x").await.unwrap());
    assert!(
        backend
            .extend(&lease.lock_id, ttl)
            .await
            .unwrap()
            .expires_at_ms()
            .is_none()
    );
}

/// With the fence trigger, every acquisition counts once, whoever makes it: LSC's advance the
/// counter, the server's bump it in their own statement (the trigger leaves them alone), and
/// renewals and same-holder re-entries of a live lock keep it.
#[tokio::test]
async fn lsc_acquisitions_advance_fences() {
    let (server, lsc, _) = start("Trig", false).await;
    let first = hold_once(&server, "ns3", "lock", "srv-1").await;
    assert_eq!(lsc.counter("ns3", "lock").await, Some(first));

    // LSC's holder gets the next token, kept through its renewals and re-entries.
    assert!(
        lsc.acquire("ns3", "lock", "anonymous", "lsc-1", 60, now())
            .await
    );
    let lsc_hold = server.status("ns3", "lock").await.fence_value();
    assert_eq!(lsc_hold, first + 1);
    assert!(
        lsc.renew("ns3", "lock", "anonymous", "lsc-1", 10)
            .await
            .is_some()
    );
    assert!(
        lsc.acquire("ns3", "lock", "anonymous", "lsc-1", 60, now())
            .await
    );
    assert_eq!(server.status("ns3", "lock").await.fence_value(), lsc_hold);
    // The server renewing LSC's holder keeps it too.
    assert_eq!(
        server.renew("ns3", "lock", "lsc-1", 5).await.fence_value(),
        lsc_hold
    );
    assert!(lsc.release("ns3", "lock", "anonymous", "lsc-1").await);

    // An expired row taken again by its own holder is a new hold.
    assert!(
        lsc.acquire("ns3", "lock", "anonymous", "lsc-2", 5, now() - 60)
            .await
    );
    assert_eq!(lsc.counter("ns3", "lock").await, Some(lsc_hold + 1));
    assert!(
        lsc.acquire("ns3", "lock", "anonymous", "lsc-2", 60, now())
            .await
    );
    assert_eq!(lsc.counter("ns3", "lock").await, Some(lsc_hold + 2));

    // The server's takeover of an expired LSC row counts once, and its token is the one
    // stored (no second bump by the trigger).
    lsc.lapse("lock").await;
    let taken = server.acquire("ns3", "lock", "srv-2", 60).await;
    assert_eq!(taken.status, StatusCode::OK, "{}", taken.text);
    assert_eq!(taken.fence_value(), lsc_hold + 3);
    assert_eq!(lsc.counter("ns3", "lock").await, Some(lsc_hold + 3));
    assert_eq!(
        server.status("ns3", "lock").await.fence_value(),
        lsc_hold + 3
    );
    assert_eq!(
        server
            .acquire("ns3", "lock", "srv-2", 60)
            .await
            .fence_value(),
        lsc_hold + 3,
        "a same-holder re-entry keeps the token"
    );
    assert_eq!(
        server.renew("ns3", "lock", "srv-2", 5).await.fence_value(),
        lsc_hold + 3
    );
    assert_eq!(lsc.counter("ns3", "lock").await, Some(lsc_hold + 3));
}

/// LSC and the server racing for one lock, round after round: each round has one winner, and
/// the counter ends at exactly the number of acquisitions (one bump each, never two, never
/// none), with the server's tokens strictly increasing.
#[tokio::test]
async fn racing_lsc_counts_every_acquisition_once() {
    let (server, lsc, _) = start("race", false).await;
    const ROUNDS: u64 = 40;
    let mut server_tokens = Vec::new();
    for round in 0..ROUNDS {
        let lsc_instance = format!("lsc-{round}");
        let server_instance = format!("srv-{round}");
        // LSC's statement is quicker than a request through the server: starting it a moment
        // later every other round lets either side win.
        let (lsc_won, reply) = tokio::join!(
            async {
                if round % 2 == 1 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                lsc.acquire("ns4", "hot", "lsc-owner", &lsc_instance, 60, now())
                    .await
            },
            server.acquire("ns4", "hot", &server_instance, 60)
        );
        let server_won = reply.status == StatusCode::OK;
        assert!(
            lsc_won != server_won,
            "round {round}: exactly one of LSC ({lsc_won}) and the server ({server_won}) wins"
        );
        if server_won {
            server_tokens.push(reply.fence_value());
            assert_eq!(
                server.release("ns4", "hot", &server_instance).await.status,
                StatusCode::OK
            );
        } else {
            assert!(lsc.release("ns4", "hot", "lsc-owner", &lsc_instance).await);
        }
    }
    let server_wins = u64::try_from(server_tokens.len()).unwrap();
    assert!(
        (1..ROUNDS).contains(&server_wins),
        "both sides won some rounds (the server won {server_wins} of {ROUNDS})"
    );
    assert_eq!(lsc.counter("ns4", "hot").await, Some(ROUNDS));
    assert!(
        server_tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{server_tokens:?}"
    );
}

/// Without the trigger LSC's table is left as it was, and a server that wants the trigger
/// but may not install it refuses to start rather than hand out tokens that could repeat.
#[tokio::test]
async fn the_fence_trigger_is_a_choice() {
    let (server, lsc, _) = start_with("notrig", false, false).await;
    let url = postgres_url();
    let plain = LscTableBackend::connect(&url, &lsc.table).await.unwrap();
    assert!(!plain.has_fence_trigger().await.unwrap());
    let first = hold_once(&server, "ns5", "lock", "srv-1").await;
    assert!(
        lsc.acquire("ns5", "lock", "anonymous", "lsc-1", 60, now())
            .await
    );
    assert_eq!(
        lsc.counter("ns5", "lock").await,
        Some(first),
        "without the trigger, LSC's acquisitions are not counted"
    );

    let wanted_without_setup = BackendSettings::new(url.clone())
        .lsc_table(&lsc.table)
        .setup_schema(false);
    let Err(error) = open_backend(&wanted_without_setup).await else {
        panic!("the trigger is wanted and missing");
    };
    let message = error.to_string();
    assert!(
        message.contains("SYNCGUARD_LSC_FENCE_TRIGGER") && message.contains(&lsc.table),
        "{message}"
    );
    // Installed once (setup on), then found by a server that may not install it.
    open_backend(&BackendSettings::new(url.clone()).lsc_table(&lsc.table))
        .await
        .unwrap();
    assert!(plain.has_fence_trigger().await.unwrap());
    open_backend(&wanted_without_setup).await.unwrap();
    // Installing again replaces it in place.
    plain.install_fence_trigger().await.unwrap();
    assert!(plain.has_fence_trigger().await.unwrap());
    assert!(lsc.release("ns5", "lock", "anonymous", "lsc-1").await);
    assert!(
        lsc.acquire("ns5", "lock", "anonymous", "lsc-2", 60, now())
            .await
    );
    assert_eq!(lsc.counter("ns5", "lock").await, Some(first + 1));
}
