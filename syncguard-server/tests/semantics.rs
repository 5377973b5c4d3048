//! LockServiceCentral's lock semantics (its specification's section 4) over real HTTP, with
//! real time: leases are whole seconds, so the time-dependent cases use 1 to 2 s leases and
//! wait with generous margins; and the fencing tokens on top.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::json;
use support::{Reply, TestServer, now_seconds};
use syncguard::MemoryBackend;
use syncguard::backend::LockBackend;
use syncguard_server::Auth;

const NS: &str = "semantics";

/// Polls GET until the lock is free, checking on the way that it stays held through its
/// `expiry` second (LSC's expiry is inclusive). Returns the epoch second at which it was
/// seen free.
async fn wait_until_free(server: &TestServer, name: &str, expiry: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(6);
    loop {
        let reply = server.status(NS, name).await;
        let after = now_seconds();
        let held = reply.json().get("expiry").is_some();
        if !held {
            assert!(
                after > expiry,
                "free only after its expiry second {expiry}: seen at {after}"
            );
            assert_eq!(reply.fence(), None);
            return after;
        }
        assert!(
            Instant::now() < deadline,
            "the lock with expiry {expiry} never lapsed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn lease(reply: &Reply) -> u64 {
    reply.json()["leaseDuration"]
        .as_u64()
        .expect("a leaseDuration")
}

#[tokio::test]
async fn worked_timeline() {
    // LSC's section 4.6 in real time: the same steps, with a short lease at the reset (1 s
    // instead of 5) so that the wait for its expiry is brief.
    let server = TestServer::memory().await;
    let name = "timeline";

    let before = now_seconds();
    let a = server.acquire(NS, name, "instance-a", 10).await;
    assert_eq!(a.status, StatusCode::OK);
    let first_expiry = a.expiry();
    assert!((before + 10..=now_seconds() + 10).contains(&first_expiry));
    assert_eq!(lease(&a), 10);
    let fence_a = a.fence_value();

    assert_eq!(
        server.acquire(NS, name, "instance-b", 10).await.status,
        StatusCode::LOCKED
    );

    let renewed = server.renew(NS, name, "instance-a", 10).await;
    assert_eq!(renewed.status, StatusCode::OK);
    assert_eq!(
        renewed.expiry(),
        first_expiry + 10,
        "renew adds to the old expiry"
    );
    assert_eq!(lease(&renewed), 20, "and to the total lease");

    let before = now_seconds();
    let reset = server.acquire(NS, name, "instance-a", 1).await;
    assert_eq!(reset.status, StatusCode::OK);
    let expiry = reset.expiry();
    assert!(
        (before + 1..=now_seconds() + 1).contains(&expiry),
        "a same-holder acquire resets the lease to now + D"
    );
    assert!(expiry < first_expiry + 10, "which can shorten it");
    assert_eq!(lease(&reset), 1, "and resets the total");
    assert_eq!(
        reset.fence_value(),
        fence_a,
        "same holder, same acquisition, same fence"
    );

    let status = server.status(NS, name).await;
    assert_eq!(
        status.json(),
        json!({"namespace":NS,"lockName":name,"owner":"anonymous","expiry":expiry})
    );
    assert_eq!(
        server.acquire(NS, name, "instance-b", 10).await.status,
        StatusCode::LOCKED
    );

    wait_until_free(&server, name, expiry).await;
    assert_eq!(
        server.renew(NS, name, "instance-a", 10).await.status,
        StatusCode::LOCKED,
        "an expired lock is not renewed"
    );
    let release_b = server.release(NS, name, "instance-b").await;
    assert_eq!(
        release_b.status,
        StatusCode::OK,
        "expired counts as released"
    );
    assert_eq!(
        release_b.json(),
        json!({"success":true,"namespace":NS,"lockName":name})
    );

    let before = now_seconds();
    let b = server.acquire(NS, name, "instance-b", 10).await;
    assert_eq!(b.status, StatusCode::OK);
    assert!((before + 10..=now_seconds() + 10).contains(&b.expiry()));
    assert!(
        b.fence_value() > fence_a,
        "a new holder gets a larger fence"
    );
}

#[tokio::test]
async fn renew_is_additive_and_uncapped_in_total() {
    let server = TestServer::memory().await;
    let acquired = server.acquire(NS, "additive", "abc", 10).await;
    let expiry = acquired.expiry();
    let once = server.renew(NS, "additive", "abc", 10).await;
    assert_eq!((once.expiry(), lease(&once)), (expiry + 10, 20));
    let twice = server.renew(NS, "additive", "abc", 5).await;
    assert_eq!((twice.expiry(), lease(&twice)), (expiry + 15, 25));
    let big = server.renew(NS, "additive", "abc", 86_400).await;
    let bigger = server.renew(NS, "additive", "abc", 86_400).await;
    assert_eq!(bigger.status, StatusCode::OK);
    assert_eq!(lease(&big), 86_425);
    assert_eq!(lease(&bigger), 172_825, "the 86400 cap is per request");
    assert_eq!(bigger.expiry(), expiry + 172_815);
    assert_eq!(
        server.status(NS, "additive").await.expiry(),
        expiry + 172_815
    );
}

#[tokio::test]
async fn refusals() {
    let server = TestServer::memory().await;
    // Renew of nothing.
    let missing = server.renew(NS, "nothing", "abc", 10).await;
    assert_eq!(missing.status, StatusCode::LOCKED);
    assert_eq!(
        missing.json(),
        json!({"success":false,"namespace":NS,"lockName":"nothing"})
    );
    assert_eq!(missing.fence(), None);
    assert_eq!(
        server.status(NS, "nothing").await.fence(),
        None,
        "renew does not create"
    );

    let held = server.acquire(NS, "held", "owner-instance", 30).await;
    let expiry = held.expiry();
    // Same owner (anonymous), another instance: a conflict for every mutation.
    assert_eq!(
        server
            .acquire(NS, "held", "other-instance", 30)
            .await
            .status,
        StatusCode::LOCKED
    );
    assert_eq!(
        server.renew(NS, "held", "other-instance", 30).await.status,
        StatusCode::LOCKED
    );
    let release = server.release(NS, "held", "other-instance").await;
    assert_eq!(release.status, StatusCode::LOCKED);
    assert_eq!(
        release.json(),
        json!({"success":false,"namespace":NS,"lockName":"held"})
    );
    let after = server.status(NS, "held").await;
    assert_eq!(after.expiry(), expiry, "refusals change nothing");
    assert_eq!(after.fence_value(), held.fence_value());
}

#[tokio::test]
async fn releases() {
    let server = TestServer::memory().await;
    let missing = server.release(NS, "never-taken", "abc").await;
    assert_eq!(missing.status, StatusCode::OK);
    assert_eq!(
        missing.json(),
        json!({"success":true,"namespace":NS,"lockName":"never-taken"})
    );

    server.acquire(NS, "mine", "abc", 30).await;
    assert_eq!(
        server.release(NS, "mine", "abc").await.status,
        StatusCode::OK
    );
    assert_eq!(server.status(NS, "mine").await.fence(), None, "released");
    assert_eq!(
        server.release(NS, "mine", "abc").await.status,
        StatusCode::OK,
        "twice is fine"
    );
    assert_eq!(
        server.acquire(NS, "mine", "xyz", 30).await.status,
        StatusCode::OK,
        "free for others"
    );

    let short = server.acquire(NS, "lapsing", "abc", 1).await;
    wait_until_free(&server, "lapsing", short.expiry()).await;
    let expired = server.release(NS, "lapsing", "someone-else").await;
    assert_eq!(
        expired.status,
        StatusCode::OK,
        "another's expired lock counts as released"
    );
    assert_eq!(
        server.release(NS, "lapsing", "abc").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn expired_locks_are_taken_over() {
    let server = TestServer::memory().await;
    let first = server.acquire(NS, "takeover", "first", 1).await;
    wait_until_free(&server, "takeover", first.expiry()).await;
    let second = server.acquire(NS, "takeover", "second", 5).await;
    assert_eq!(second.status, StatusCode::OK);
    assert!(second.fence_value() > first.fence_value());
    assert_eq!(
        server.renew(NS, "takeover", "first", 5).await.status,
        StatusCode::LOCKED,
        "the old holder cannot renew the new holder's lock"
    );
    let again = server.acquire(NS, "takeover", "first", 5).await;
    assert_eq!(again.status, StatusCode::LOCKED);
}

#[tokio::test]
async fn reacquire_after_expiry_is_a_new_acquisition() {
    let server = TestServer::memory().await;
    let first = server.acquire(NS, "comeback", "same", 1).await;
    wait_until_free(&server, "comeback", first.expiry()).await;
    let again = server.acquire(NS, "comeback", "same", 5).await;
    assert_eq!(again.status, StatusCode::OK);
    assert!(
        again.fence_value() > first.fence_value(),
        "a new acquisition, a new fence"
    );
}

#[tokio::test]
async fn fences_strictly_increase_across_holders() {
    let server = TestServer::memory().await;
    let mut last = 0;
    for round in 0..5 {
        let instance = format!("holder-{round}");
        let acquired = server.acquire(NS, "fenced", &instance, 30).await;
        let fence = acquired.fence_value();
        assert!(fence > last, "round {round}: {fence} > {last}");
        assert_eq!(
            server.renew(NS, "fenced", &instance, 5).await.fence_value(),
            fence
        );
        assert_eq!(
            server
                .acquire(NS, "fenced", &instance, 30)
                .await
                .fence_value(),
            fence
        );
        assert_eq!(server.status(NS, "fenced").await.fence_value(), fence);
        let refused = server.acquire(NS, "fenced", "intruder", 30).await;
        assert_eq!(refused.fence(), None);
        let released = server.release(NS, "fenced", &instance).await;
        assert_eq!(released.fence(), None);
        last = fence;
    }
    // Each lock has its own counter.
    let other = server.acquire(NS, "other-lock", "abc", 5).await;
    assert_eq!(other.fence_value(), 1);
}

#[tokio::test]
async fn concurrent_acquires_have_one_winner() {
    let server = Arc::new(TestServer::memory().await);
    let mut tasks = Vec::new();
    for i in 0..16 {
        let server = Arc::clone(&server);
        tasks.push(tokio::spawn(async move {
            server
                .acquire(NS, "contended", &format!("racer-{i}"), 30)
                .await
                .status
        }));
    }
    let mut winners = 0;
    for task in tasks {
        match task.await.unwrap() {
            StatusCode::OK => winners += 1,
            StatusCode::LOCKED => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(winners, 1);
}

#[tokio::test]
async fn locks_of_direct_clients_have_no_owner() {
    let backend = Arc::new(MemoryBackend::new());
    let server = TestServer::start(backend.clone(), Auth::disabled()).await;
    let lease = backend
        .acquire("semantics:direct", Duration::from_secs(30))
        .await
        .unwrap()
        .lease()
        .expect("free");
    let status = server.status(NS, "direct").await;
    assert_eq!(
        status.json(),
        json!({"namespace":NS,"lockName":"direct","expiry":lease.expires_at_ms / 1000}),
        "held, by nobody the API knows"
    );
    assert_eq!(status.fence_value(), lease.fence.get());
    assert_eq!(
        server.acquire(NS, "direct", "abc", 5).await.status,
        StatusCode::LOCKED
    );
    assert_eq!(
        server.renew(NS, "direct", "abc", 5).await.status,
        StatusCode::LOCKED
    );
    assert_eq!(
        server.release(NS, "direct", "abc").await.status,
        StatusCode::LOCKED
    );
    assert!(
        backend.release(&lease.lock_id).await.unwrap().is_released(),
        "untouched"
    );
}

#[tokio::test]
async fn servers_on_one_backend_share_holders() {
    // Two replicas on one store: the holder lives in storage, not in a process.
    let backend = Arc::new(MemoryBackend::new());
    let one = TestServer::start(backend.clone(), Auth::disabled()).await;
    let two = TestServer::start(backend, Auth::disabled()).await;
    let acquired = one.acquire(NS, "shared", "abc", 30).await;
    assert_eq!(
        two.acquire(NS, "shared", "xyz", 30).await.status,
        StatusCode::LOCKED
    );
    let renewed = two.renew(NS, "shared", "abc", 30).await;
    assert_eq!(renewed.status, StatusCode::OK);
    assert_eq!(renewed.fence_value(), acquired.fence_value());
    assert_eq!(
        two.release(NS, "shared", "abc").await.status,
        StatusCode::OK
    );
    assert_eq!(one.status(NS, "shared").await.fence(), None);
}
