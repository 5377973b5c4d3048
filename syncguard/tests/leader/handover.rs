//! Handovers: resignations woken at once, twin identities kept apart, observers that see
//! every change in order.

use std::sync::Arc;
use std::time::Duration;

use syncguard::RetryPolicy;
use syncguard::backend::LockBackend;
use syncguard::leader::{Election, Leader};
use tokio::time::{Instant, sleep, timeout};

use crate::PROMPT;
use crate::backends::Kind;
use crate::record::{election, spawn_campaign, unique_name};

/// A resignation wakes the waiting candidate (of another instance, or of the same) at once,
/// with a ttl (60 s) whose polls (every 7.5 to 15 s) cannot explain a handover under 5 s; an
/// observer of a third instance, reading every 60 s otherwise, sees each successor as soon.
pub(crate) async fn resign_hands_over_well_within_the_ttl(kind: Kind) {
    let name = unique_name("resign");
    let ttl = Duration::from_secs(60);
    let backends = [kind.instance().await, kind.instance().await];
    let mut leadership = election(&backends[0], &name, "first", ttl)
        .campaign()
        .await
        .expect("campaign");
    let mut watch = election(&kind.instance().await, &name, "observer", ttl)
        .observe()
        .await
        .expect("observe");
    assert_eq!(
        watch.current().map(|leader| leader.term),
        Some(leadership.term())
    );
    let mut handovers = Vec::new();
    let mut seen_after = Vec::new();
    for round in 1..=4 {
        // Every other round, the successor shares the leader's instance.
        let backend = &backends[(round / 2) % 2];
        let waiting = spawn_campaign(&election(backend, &name, &format!("r{round}"), ttl));
        sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "the candidate waits");
        let term = leadership.term();
        let resigned = Instant::now();
        assert!(leadership.resign().await.expect("resign"));
        leadership = timeout(PROMPT, waiting)
            .await
            .expect("the successor leads")
            .unwrap()
            .expect("campaign");
        handovers.push(resigned.elapsed());
        assert!(leadership.term() > term);
        assert_eq!(leadership.identity(), format!("r{round}"));
        let successor = leadership.term();
        let seen = timeout(
            PROMPT,
            watch.wait_for(|leader| leader.is_some_and(|leader| leader.term == successor)),
        )
        .await
        .expect("the observer sees the successor")
        .unwrap();
        seen_after.push(resigned.elapsed());
        assert_eq!(seen.unwrap().identity, format!("r{round}"));
    }
    println!(
        "resign to the successor's leadership: {handovers:?}; seen by the observer after {seen_after:?}"
    );
    for handover in handovers.iter().chain(&seen_after) {
        assert!(
            *handover < Duration::from_secs(5),
            "woken by the release, not a poll: {handovers:?}, {seen_after:?}"
        );
    }
    leadership.resign().await.expect("resign");
}

/// Two campaigns with one identity, on one instance and on two: the nonce keeps them apart
/// (no re-entrant acquire), the holder is the documented JSON, and terms increase.
pub(crate) async fn candidates_with_one_identity_never_share_leadership(kind: Kind) {
    let name = unique_name("twins");
    let ttl = Duration::from_secs(10);
    let one = kind.instance().await;
    let other = kind.instance().await;
    let first = election(&one, &name, "twin", ttl);
    let leadership = first.campaign().await.expect("campaign");

    let lock = syncguard::get_by_key(one.as_ref(), &format!("leader:{name}"))
        .await
        .unwrap()
        .map(syncguard::LockInfo::reveal)
        .expect("the leader's lock");
    let holder = lock.holder.expect("a holder");
    let nonce = holder
        .strip_prefix(r#"{"leader":"twin","campaign":""#)
        .and_then(|rest| rest.strip_suffix(r#""}"#))
        .unwrap_or_else(|| panic!("the documented holder: {holder}"));
    assert!(!nonce.is_empty() && !nonce.contains('"'), "{holder}");

    let hasty = RetryPolicy::wait_for(Duration::from_millis(500));
    for backend in [&one, &other] {
        let twin = Election::builder(backend, &name)
            .identity("twin")
            .ttl(ttl)
            .retry(hasty)
            .build()
            .unwrap();
        let refused = twin.campaign().await.expect_err("the twin does not lead");
        assert!(refused.is_contended(), "{refused}");
        let once = Election::builder(backend, &name)
            .identity("twin")
            .retry(RetryPolicy::single_attempt())
            .build()
            .unwrap();
        assert!(once.campaign().await.unwrap_err().is_contended());
    }
    let twin = election(&other, &name, "twin", ttl);
    let waiting = spawn_campaign(&twin);
    sleep(Duration::from_millis(200)).await;
    let term = leadership.term();
    leadership.resign().await.unwrap();
    let next = timeout(PROMPT, waiting).await.unwrap().unwrap().unwrap();
    assert!(next.term() > term);
    let leader = first.leader().await.unwrap().unwrap();
    assert_eq!(
        (leader.term, leader.identity.as_str()),
        (next.term(), "twin")
    );
    next.resign().await.unwrap();
}

/// Two observers (one on the candidates' instance, one on an instance of its own) record
/// every leader they see while leadership goes a → b (resign) → c (b dies: its lock expires)
/// → vacancy → a again → vacancy. Each sees exactly those leaders, in order.
pub(crate) async fn observers_see_every_change_in_order(kind: Kind) {
    let name = unique_name("observed");
    let ttl = Duration::from_secs(2);
    let every = Duration::from_millis(200);
    let shared = kind.instance().await;
    let dying = kind.faulty().await;
    let dying_backend: Arc<dyn LockBackend> = Arc::new(dying.clone());
    let make = |backend: &Arc<dyn LockBackend>, identity: &str| {
        Election::builder(backend, &name)
            .identity(identity)
            .ttl(ttl)
            .observe_every(every)
            .build()
            .unwrap()
    };
    let a = make(&shared, "a");
    let b = make(&dying_backend, "b");
    let c = make(&shared, "c");
    let mut recorders = Vec::new();
    for backend in [shared.clone(), kind.instance().await] {
        let mut watch = make(&backend, "observer").observe().await.unwrap();
        assert_eq!(watch.current(), None);
        recorders.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                match watch.changed().await.unwrap() {
                    Some(leader) if leader.identity == "done" => return seen,
                    leader => seen.push(leader),
                }
            }
        }));
    }

    let mut expected = Vec::new();
    let leading = a.campaign().await.unwrap();
    expected.push(a.leader().await.unwrap().unwrap());
    let waiting = spawn_campaign(&b);
    sleep(Duration::from_millis(500)).await;
    leading.resign().await.unwrap();
    let leading = timeout(PROMPT, waiting).await.unwrap().unwrap().unwrap();
    expected.push(b.leader().await.unwrap().unwrap());
    let waiting = spawn_campaign(&c);
    sleep(Duration::from_millis(500)).await;
    dying.fail(true); // the process is gone: every call fails from now on
    drop(leading); // its release fails: the lock expires
    let leading = timeout(ttl * 3 + PROMPT, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    expected.push(c.leader().await.unwrap().unwrap());
    sleep(Duration::from_millis(500)).await;
    leading.resign().await.unwrap();
    sleep(Duration::from_millis(500)).await;
    let leading = a.campaign().await.unwrap();
    expected.push(a.leader().await.unwrap().unwrap());
    sleep(Duration::from_millis(500)).await;
    leading.resign().await.unwrap();
    sleep(Duration::from_millis(500)).await;
    // The end of the record: a lock whose holder reads "done".
    let done = make(&shared, "done").campaign().await.unwrap();

    for window in expected.windows(2) {
        assert!(window[0].term < window[1].term, "{expected:?}");
    }
    for recorder in recorders {
        let seen = timeout(PROMPT, recorder).await.unwrap().unwrap();
        let leaders: Vec<Leader> = seen.iter().flatten().cloned().collect();
        assert_eq!(leaders, expected, "seen: {seen:?}");
        // A vacancy may be too short to see (a → b); the one after a's last resignation
        // lasted half a second.
        assert_eq!(
            seen.last(),
            Some(&None),
            "the vacancy before `done`: {seen:?}"
        );
    }
    done.resign().await.unwrap();
}
