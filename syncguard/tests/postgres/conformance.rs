//! The conformance suite, mutual exclusion under load, and a holder whose runtime freezes past
//! its lease.

use std::time::Duration;

use syncguard::{LockId, conformance};

use crate::{backend, frozen};

mod conformance_suite {
    syncguard::conformance_tests!(crate::backend());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_workers_on_one_key_for_five_seconds() {
    conformance::mutual_exclusion_with(backend().await, 64, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_takes_no_step_past_its_lease() {
    let key = format!("frozen:{}", LockId::generate());
    frozen::a_frozen_holder_takes_no_step_past_its_lease(backend, &key).await;
}
