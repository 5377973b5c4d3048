//! One leader at a time: under contention, with a stalled heartbeat, with a deleted lock.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::Rng as _;
use syncguard::backend::LockBackend;
use syncguard::conformance::history::History;
use syncguard::{Fence, LostReason};
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

use crate::backends::Kind;
use crate::record::{FencedResource, Term, checked, election, unique_name};
use crate::{PROMPT, SCENARIO_LIMIT};

/// Four candidates (two per instance) campaign, lead for a moment, and resign or drop their
/// leadership, for four seconds: the history shows one leader at a time, terms in order,
/// each granted once, and each leader reads itself back as the leader.
pub(crate) async fn one_leader_at_a_time_under_contention(kind: Kind) {
    let name = unique_name("contention");
    let ttl = Duration::from_secs(5);
    let history = Arc::new(History::new());
    let stop = CancellationToken::new();
    let mut candidates = Vec::new();
    for instance in 0..2 {
        let backend = kind.instance().await;
        for candidate in 0..2 {
            let election = election(&backend, &name, &format!("i{instance}-c{candidate}"), ttl);
            let (history, stop) = (Arc::clone(&history), stop.clone());
            candidates.push(tokio::spawn(async move {
                let mut terms = 0;
                loop {
                    let leadership = tokio::select! {
                        () = stop.cancelled() => return terms,
                        leadership = election.campaign() => leadership.expect("campaign"),
                    };
                    terms += 1;
                    let mut term = Term::begin(&leadership, &history);
                    let me = election
                        .leader()
                        .await
                        .expect("read the leader")
                        .expect("a leader");
                    assert_eq!(
                        (me.term, me.identity.as_str()),
                        (leadership.term(), election.identity())
                    );
                    let hold = Duration::from_millis(rand::rng().random_range(20..150));
                    let until = Instant::now() + hold;
                    while Instant::now() < until && term.act() {
                        sleep(Duration::from_millis(5)).await;
                    }
                    term.act();
                    drop(term);
                    if rand::rng().random_bool(0.25) {
                        drop(leadership); // resigns in the background
                    } else {
                        assert!(leadership.resign().await.expect("resign"));
                    }
                }
            }));
        }
    }
    sleep(Duration::from_secs(4)).await;
    stop.cancel();
    let mut led = 0;
    for candidate in candidates {
        if candidate.await.expect("a candidate panicked") > 0 {
            led += 1;
        }
    }
    let checked = checked(&history);
    println!("contention: {checked:?}, {led} of 4 candidates led");
    assert!(checked.acting >= 8, "{checked:?}");
    assert_eq!(checked.lost, 0, "{checked:?}");
    assert!(led >= 2, "leadership moved between candidates");
}

/// The leader's extends hang: it counts itself deposed when its lease runs out, which is
/// before the store lets a successor in. No fencing needed: the history shows no overlap.
pub(crate) async fn a_stalled_heartbeat_deposes_the_leader_before_its_successor_leads(kind: Kind) {
    let name = unique_name("stall");
    let ttl = Duration::from_secs(2);
    let history = Arc::new(History::new());
    let stalling = kind.faulty().await;
    let stalling_backend: Arc<dyn LockBackend> = Arc::new(stalling.clone());
    let leader = election(&stalling_backend, &name, "stalling", ttl);
    let leadership = leader.campaign().await.expect("campaign");
    let first_term = leadership.term();

    let mut successors = Vec::new();
    for candidate in 0..2 {
        let backend = kind.instance().await;
        let election = election(&backend, &name, &format!("successor-{candidate}"), ttl);
        let history = Arc::clone(&history);
        successors.push(tokio::spawn(async move {
            let leadership = election.campaign().await.expect("campaign");
            let mut term = Term::begin(&leadership, &history);
            for _ in 0..20 {
                assert!(term.act(), "the successor keeps leading");
                sleep(Duration::from_millis(5)).await;
            }
            drop(term);
            leadership.resign().await.expect("resign");
        }));
    }
    let mut term = Term::begin(&leadership, &history);
    for _ in 0..20 {
        assert!(term.act());
        sleep(Duration::from_millis(10)).await;
    }
    let stalled = Instant::now();
    stalling.stall_extends(true);
    while term.act() {
        sleep(Duration::from_millis(5)).await;
    }
    let noticed = stalled.elapsed();
    drop(term);
    assert_eq!(leadership.lost_reason(), Some(LostReason::LeaseExpired));
    assert!(
        noticed <= ttl + PROMPT,
        "the loss is noticed within the lease: {noticed:?}"
    );
    drop(leadership);
    for successor in successors {
        timeout(SCENARIO_LIMIT, successor)
            .await
            .expect("both successors led")
            .expect("a successor panicked");
    }
    stalling.stall_extends(false);
    let checked = checked(&history);
    assert_eq!(checked.acting, 3, "{checked:?}");
    assert_eq!(checked.lost, 1, "{checked:?}");
    let mut terms: Vec<Fence> = history.holds().iter().map(|hold| hold.fence).collect();
    terms.sort();
    assert_eq!(terms[0], first_term, "the successors' terms are higher");
}

/// The leader's lock is released behind its back (an operator's release from another
/// instance): the waiting candidate, woken by that release, leads at once, while the old
/// leader believes it leads until its next heartbeat. The term fences it off: the resource
/// refuses its late writes, and the accepted writes form a correct history.
pub(crate) async fn a_leader_whose_lock_is_deleted_is_fenced_off_and_deposed(kind: Kind) {
    let name = unique_name("deleted");
    let ttl = Duration::from_secs(3);
    let history = Arc::new(History::new());
    let resource = Arc::new(FencedResource::default());
    let old_backend = kind.instance().await;
    let old = election(&old_backend, &name, "old", ttl);
    let leadership = old.campaign().await.expect("campaign");

    let new_backend = kind.instance().await;
    let new = election(&new_backend, &name, "new", ttl);
    let successor = {
        let (history, resource) = (Arc::clone(&history), Arc::clone(&resource));
        tokio::spawn(async move {
            let leadership = new.campaign().await.expect("campaign");
            let mut term = Term::begin(&leadership, &history);
            let mut accepted = 0;
            let until = Instant::now() + ttl;
            while Instant::now() < until {
                if resource.write(&mut term) {
                    accepted += 1;
                }
                sleep(Duration::from_millis(5)).await;
            }
            drop(term);
            assert!(accepted > 0, "the new leader's writes are accepted");
            leadership.resign().await.expect("resign");
        })
    };
    // The new candidate waits; the old leader writes.
    let mut term = Term::begin(&leadership, &history);
    for _ in 0..20 {
        assert!(resource.write(&mut term));
        sleep(Duration::from_millis(10)).await;
    }
    let admin = kind.instance().await;
    let lock = syncguard::get_by_key(admin.as_ref(), old.key())
        .await
        .unwrap()
        .map(syncguard::LockInfo::reveal)
        .expect("the leader's lock");
    assert_eq!(lock.info.fence, leadership.term());
    let deleted = Instant::now();
    assert!(admin.release(&lock.lock_id).await.unwrap().is_released());
    let mut late_writes = 0;
    while !leadership.is_lost() {
        resource.write(&mut term);
        late_writes += 1;
        sleep(Duration::from_millis(5)).await;
    }
    let noticed = deleted.elapsed();
    drop(term);
    assert_eq!(leadership.lost_reason(), Some(LostReason::NotHeld));
    assert!(
        noticed <= ttl + PROMPT,
        "noticed at the next heartbeat: {noticed:?}"
    );
    drop(leadership);
    successor.await.expect("the successor panicked");
    let checked = checked(&history);
    println!(
        "deleted lock: noticed after {noticed:?}, {late_writes} writes tried meanwhile, {} refused; {checked:?}",
        resource.refused.load(Ordering::SeqCst)
    );
    assert_eq!(checked.acting, 2, "{checked:?}");
}
