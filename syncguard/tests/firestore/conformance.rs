//! The conformance suite, and exclusion among racing clients: one backend, separate
//! clients, transactions aborted by contention, a holder whose runtime freezes.

use std::sync::Arc;
use std::time::Duration;

use syncguard::backend::LockBackend;
use syncguard::firestore::FirestoreConfig;
use syncguard::{ErrorCode, conformance};
use tokio::sync::Barrier;

use crate::{backend, backend_in, frozen, project, warm_up_emulator};

mod conformance_suite {
    syncguard::conformance_tests!(crate::backend());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_acquires_give_exactly_one_holder() {
    let backend = backend().await;
    for round in 0..6 {
        let key = conformance::unique_key(&format!("race{round}"));
        let barrier = Arc::new(Barrier::new(32));
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let (backend, key, barrier) = (backend.clone(), key.clone(), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    backend.acquire(&key, Duration::from_secs(30)).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for task in tasks {
            let outcome = task.await.unwrap().expect("acquire answered");
            if let Some(lease) = outcome.lease() {
                winners.push(lease);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one holder");
        let info = syncguard::get_by_key(&backend, &key)
            .await
            .unwrap()
            .map(syncguard::LockInfo::reveal)
            .unwrap();
        assert_eq!(
            info.lock_id, winners[0].lock_id,
            "the stored lock is the winner's"
        );
        assert_eq!(winners[0].fence.get(), 1);
    }
}

/// `tasks` acquires of one fresh key at once, each through its own client and backend (as from
/// separate processes); returns the winners' count and the errors.
async fn race_separate_clients(
    project: &str,
    config: &FirestoreConfig,
    tasks: usize,
    label: &str,
) -> (usize, Vec<syncguard::LockError>) {
    let mut backends = Vec::new();
    for _ in 0..tasks {
        backends.push(backend_in(project, config.clone()).await);
    }
    let key = conformance::unique_key(label);
    let barrier = Arc::new(Barrier::new(tasks));
    let handles: Vec<_> = backends
        .into_iter()
        .map(|backend| {
            let (key, barrier) = (key.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                let began = std::time::Instant::now();
                let outcome = backend.acquire(&key, Duration::from_secs(30)).await;
                if std::env::var_os("SYNCGUARD_TEST_TRACE").is_some() {
                    eprintln!(
                        "{:?} {:?}",
                        began.elapsed(),
                        outcome.as_ref().map(|o| o.is_contended())
                    );
                }
                outcome
            })
        })
        .collect();
    let (mut winners, mut errors) = (0, Vec::new());
    for handle in handles {
        match handle.await.unwrap() {
            Ok(outcome) => winners += usize::from(outcome.lease().is_some()),
            Err(error) => errors.push(error),
        }
    }
    (winners, errors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_clients_racing_give_exactly_one_holder() {
    // Separate clients do not share the in-process turn-taking: Firestore's commits alone
    // decide, and the losers retry, then see the winner's lock.
    let project = project();
    for round in 0..5 {
        let (winners, errors) = race_separate_clients(
            &project,
            &FirestoreConfig::new(),
            32,
            &format!("clients{round}"),
        )
        .await;
        assert!(winners <= 1, "round {round}: {winners} holders at once");
        assert!(errors.is_empty(), "round {round}: {errors:?}");
        assert_eq!(winners, 1, "round {round}: exactly one holder");
        eprintln!("round {round}: {winners} holder, {} gave up", errors.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transaction_aborts_map_to_service_unavailable() {
    // Without retries, a commit that lost the race (precondition failed, or Firestore aborted
    // the transaction) must come out as a retryable ServiceUnavailable, and never break mutual
    // exclusion.
    let config = FirestoreConfig::new().with_max_transaction_retries(0);
    let project = project();
    // Whether racing commits overlap depends on timing: on a loaded machine the emulator may
    // serve a whole round one client after another (the losers then see the lock, with no
    // conflict). Race again, on a fresh key, until one round has conflicts; each round must
    // keep the guarantees.
    let mut failed = 0;
    for round in 0..10 {
        let (winners, errors) =
            race_separate_clients(&project, &config, 8, &format!("abort{round}")).await;
        assert!(winners <= 1, "round {round}: {winners} holders at once");
        for error in &errors {
            assert_eq!(error.code(), ErrorCode::ServiceUnavailable, "{error}");
            assert!(error.is_retryable());
        }
        failed += errors.len();
        if failed > 0 {
            break;
        }
    }
    assert!(failed > 0, "10 rounds of 8 racing commits never conflicted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_takes_no_step_past_its_lease() {
    warm_up_emulator().await;
    let project = project();
    let make = move || {
        let project = project.clone();
        async move { backend_in(&project, FirestoreConfig::new()).await }
    };
    frozen::a_frozen_holder_takes_no_step_past_its_lease(make, "frozen:holder").await;
}
