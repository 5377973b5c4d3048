//! `run_while_leader`: one copy at a time, only while leading; clean stops.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use syncguard::backend::LockBackend;
use syncguard::conformance::history::History;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

use crate::PROMPT;
use crate::backends::Kind;
use crate::record::{Term, checked, election, leader_other_than, unique_name};

/// Three candidates run the same work with `run_while_leader`, each on its instance, while
/// the leader's heartbeat is stalled again and again: at most one copy runs at any moment
/// (counted across all of them), the copies' actions form a correct history, leadership
/// moves, and a shutdown stops every candidate and leaves the key free.
pub(crate) async fn run_while_leader_runs_one_copy_at_a_time_only_while_leading(kind: Kind) {
    let name = unique_name("singleton");
    let ttl = Duration::from_secs(1);
    let history = Arc::new(History::new());
    let running = Arc::new(AtomicUsize::new(0));
    let most_at_once = Arc::new(AtomicUsize::new(0));
    let shutdown = CancellationToken::new();
    let mut instances = HashMap::new();
    let mut candidates = Vec::new();
    for candidate in 0..3 {
        let identity = format!("replica-{candidate}");
        let faulty = kind.faulty().await;
        let backend: Arc<dyn LockBackend> = Arc::new(faulty.clone());
        instances.insert(identity.clone(), faulty);
        let election = election(&backend, &name, &identity, ttl);
        let (history, running, most, shutdown) = (
            Arc::clone(&history),
            Arc::clone(&running),
            Arc::clone(&most_at_once),
            shutdown.clone(),
        );
        candidates.push(tokio::spawn(async move {
            election
                .run_while_leader(shutdown, async move |leadership| {
                    let _copy = Copy::start(&running, &most);
                    let mut term = Term::begin(leadership, &history);
                    loop {
                        term.act();
                        sleep(Duration::from_millis(10)).await;
                    }
                })
                .await
        }));
    }
    let observer_backend = kind.instance().await;
    let observer = election(&observer_backend, &name, "observer", ttl);
    let mut stalled_before = None;
    for _ in 0..4 {
        let leader = leader_other_than(&observer, stalled_before).await;
        sleep(Duration::from_millis(500)).await;
        // Stall the leader until another one leads.
        let instance = &instances[&leader.identity];
        instance.stall_extends(true);
        let next = timeout(
            ttl * 4 + PROMPT,
            leader_other_than(&observer, Some(leader.term)),
        )
        .await
        .expect("a new leader after the stall");
        instance.stall_extends(false);
        assert!(next.term > leader.term);
        stalled_before = Some(leader.term);
    }
    shutdown.cancel();
    for candidate in candidates {
        let stopped = timeout(PROMPT, candidate)
            .await
            .expect("a candidate stopped on shutdown")
            .unwrap()
            .expect("run_while_leader");
        assert!(stopped.is_none());
    }
    assert_eq!(running.load(Ordering::SeqCst), 0, "every copy was dropped");
    assert_eq!(most_at_once.load(Ordering::SeqCst), 1, "one copy at a time");
    let checked = checked(&history);
    println!("run_while_leader under stalls: {checked:?}");
    assert!(checked.acting >= 4, "{checked:?}");
    assert!(checked.lost >= 3, "{checked:?}");
    // The last leader resigned, and a candidate stopped while its campaign's attempt was under
    // way released what it took (`a_shutdown_during_a_campaign_attempt_leaves_no_lock`); the
    // wait allows for a resignation whose release outlasted the second it is waited for.
    let deadline = tokio::time::Instant::now() + PROMPT;
    while let Some(leader) = observer.leader().await.unwrap() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the last leader resigned, and no dropped campaign's lock stays: {leader:?} leads"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// A running copy of the work, counted while it lives.
pub(crate) struct Copy {
    running: Arc<AtomicUsize>,
}

impl Copy {
    pub(crate) fn start(running: &Arc<AtomicUsize>, most: &AtomicUsize) -> Self {
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        most.fetch_max(now, Ordering::SeqCst);
        Self {
            running: Arc::clone(running),
        }
    }
}

impl Drop for Copy {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A shutdown while leading drops the work and resigns, and the waiting candidate leads at
/// once; a shutdown while campaigning returns at once; a work that ends resigns and returns
/// its output.
pub(crate) async fn run_while_leader_stops_cleanly_on_shutdown_and_when_the_work_ends(kind: Kind) {
    let name = unique_name("shutdown");
    let ttl = Duration::from_secs(60);
    let backends = [kind.instance().await, kind.instance().await];
    let leader = election(&backends[0], &name, "leader", ttl);
    let standby = election(&backends[1], &name, "standby", ttl);
    let stop_leader = CancellationToken::new();
    let stop_standby = CancellationToken::new();
    let started = Arc::new(tokio::sync::Notify::new());
    let dropped = Arc::new(AtomicBool::new(false));

    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    let leading = tokio::spawn({
        let (leader, stop, started, dropped) = (
            leader.clone(),
            stop_leader.clone(),
            Arc::clone(&started),
            Arc::clone(&dropped),
        );
        async move {
            leader
                .run_while_leader(stop, async move |_leadership| {
                    let _dropped = SetOnDrop(Arc::clone(&dropped));
                    started.notify_one();
                    std::future::pending::<()>().await;
                })
                .await
        }
    });
    timeout(PROMPT, started.notified())
        .await
        .expect("the work started");
    let term = leader.leader().await.unwrap().unwrap().term;

    // The standby campaigns; a shutdown meanwhile returns at once.
    let waiting = tokio::spawn({
        let (standby, stop) = (standby.clone(), stop_standby.clone());
        async move {
            standby
                .run_while_leader(stop, async |leadership| leadership.term())
                .await
        }
    });
    sleep(Duration::from_millis(300)).await;
    stop_standby.cancel();
    let stopped = timeout(PROMPT, waiting).await.unwrap().unwrap().unwrap();
    assert_eq!(stopped, None, "stopped while campaigning");

    // The standby again, whose work ends at once: it leads as soon as the leader stops.
    let standby_run = tokio::spawn({
        let standby = standby.clone();
        async move {
            standby
                .run_while_leader(CancellationToken::new(), async |leadership| {
                    leadership.term()
                })
                .await
        }
    });
    sleep(Duration::from_millis(300)).await;
    assert!(!standby_run.is_finished());
    let stopping = Instant::now();
    stop_leader.cancel();
    let stopped = timeout(PROMPT, leading).await.unwrap().unwrap().unwrap();
    assert_eq!(stopped, None);
    assert!(dropped.load(Ordering::SeqCst), "the work was dropped");
    let next_term = timeout(PROMPT, standby_run)
        .await
        .expect("the standby leads at once, not after the 60 s ttl")
        .unwrap()
        .unwrap()
        .expect("the work's output");
    println!(
        "shutdown to the standby's work done: {:?}",
        stopping.elapsed()
    );
    assert!(next_term > term);
    assert_eq!(
        leader.leader().await.unwrap(),
        None,
        "the standby resigned when its work ended"
    );
}

/// A shutdown while a campaign's attempt is on the wire (the store took the lock, its answer
/// is held up): the attempt is answered and the lock it took released before
/// `run_while_leader` returns, so that a process that exits right after leaves no leader
/// behind; the work never starts.
pub(crate) async fn a_shutdown_during_a_campaign_attempt_leaves_no_lock(kind: Kind) {
    let name = unique_name("shutdown-attempt");
    let ttl = Duration::from_secs(60);
    let faulty = kind.faulty().await;
    let shared: Arc<dyn LockBackend> = Arc::new(faulty.clone());
    let candidate = election(&shared, &name, "candidate", ttl);
    let observer = election(&kind.instance().await, &name, "observer", ttl);
    let stop = CancellationToken::new();
    let worked = Arc::new(AtomicBool::new(false));
    faulty.slow_acquire_replies(true);
    let running = tokio::spawn({
        let (candidate, stop, worked) = (candidate.clone(), stop.clone(), Arc::clone(&worked));
        async move {
            candidate
                .run_while_leader(stop, async move |_leadership| {
                    worked.store(true, Ordering::SeqCst);
                })
                .await
        }
    });
    let deadline = Instant::now() + PROMPT;
    while faulty.acquires() == 0 {
        assert!(Instant::now() < deadline, "the campaign made an attempt");
        sleep(Duration::from_millis(5)).await;
    }
    stop.cancel();
    let stopped = timeout(PROMPT, running)
        .await
        .expect("it returns once the attempt is answered")
        .unwrap()
        .expect("run_while_leader");
    assert_eq!(stopped, None, "stopped by the shutdown");
    assert!(!worked.load(Ordering::SeqCst), "the work never started");
    assert_eq!(
        observer.leader().await.expect("read the leader"),
        None,
        "the lock the attempt took was released before run_while_leader returned"
    );
}

/// A shutdown while a campaign's attempt is on the way to a store that is gone (the attempt
/// fails, retryably, after a delay): the call returns `Ok(None)` once the attempt has failed,
/// instead of campaigning again, and nothing is held.
pub(crate) async fn a_shutdown_during_a_failing_campaign_attempt_returns(kind: Kind) {
    let name = unique_name("shutdown-failing");
    let ttl = Duration::from_secs(60);
    let faulty = kind.faulty().await;
    let shared: Arc<dyn LockBackend> = Arc::new(faulty.clone());
    let candidate = election(&shared, &name, "candidate", ttl);
    let observer = election(&kind.instance().await, &name, "observer", ttl);
    let stop = CancellationToken::new();
    faulty.slow(true);
    faulty.fail(true);
    let running = tokio::spawn({
        let (candidate, stop) = (candidate.clone(), stop.clone());
        async move {
            candidate
                .run_while_leader(stop, async |_leadership| ())
                .await
        }
    });
    // Well inside the attempt's 700 ms wait before it fails.
    sleep(Duration::from_millis(100)).await;
    stop.cancel();
    let stopped = timeout(PROMPT, running)
        .await
        .expect("it returns once the attempt has failed")
        .unwrap()
        .expect("a retryable failure after the shutdown is no error");
    assert_eq!(stopped, None, "stopped by the shutdown");
    assert_eq!(faulty.acquires(), 0, "no attempt reached the store");
    assert_eq!(observer.leader().await.expect("read the leader"), None);
}
