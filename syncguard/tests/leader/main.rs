//! Leader election (`syncguard::leader`) on memory, PostgreSQL and Redis: one leader at a time
//! under contention and faults (a heartbeat that stalls, a lock deleted behind the leader's
//! back, a leader that dies), recorded with the fault suite's history checker; terms that
//! strictly increase; resignations handed over at once; observers that see every change in
//! order; `run_while_leader` running one copy at a time and stopping cleanly.
//!
//! Each scenario runs on every backend (`memory::`, `postgres::`, `redis::`). A backend
//! *instance* plays a process: PostgreSQL and Redis instances have connections and release
//! listeners of their own; memory instances share one store (and its notifier). Against the
//! servers `bash scripts/with-services.sh cargo test -p syncguard --all-features --test leader`
//! starts (`SYNCGUARD_TEST_POSTGRES_URL`, `SYNCGUARD_TEST_REDIS_URL`). Real time with
//! generous margins: a 2-core machine runs the suites side by side.
//!
//! One concern per module: the backends and their faults ([`backends`]), recording terms
//! into the history ([`record`]), one leader at a time ([`exclusion`]), handovers and
//! observers ([`handover`]), `run_while_leader` ([`singleton`]), and what an election
//! refuses ([`settings`]).

mod backends;
mod exclusion;
mod handover;
mod record;
mod settings;
mod singleton;
#[path = "../support/urls.rs"]
mod urls;

use std::future::Future;
use std::time::Duration;

use tokio::time::timeout;

use backends::Kind;
use exclusion::{
    a_leader_whose_lock_is_deleted_is_fenced_off_and_deposed,
    a_stalled_heartbeat_deposes_the_leader_before_its_successor_leads,
    one_leader_at_a_time_under_contention,
};
use handover::{
    candidates_with_one_identity_never_share_leadership, observers_see_every_change_in_order,
    resign_hands_over_well_within_the_ttl,
};
use singleton::{
    a_shutdown_during_a_campaign_attempt_leaves_no_lock,
    a_shutdown_during_a_failing_campaign_attempt_returns,
    run_while_leader_runs_one_copy_at_a_time_only_while_leading,
    run_while_leader_stops_cleanly_on_shutdown_and_when_the_work_ends,
};

/// The longest any scenario may take before it counts as hung.
pub(crate) const SCENARIO_LIMIT: Duration = Duration::from_secs(180);

/// A loaded 2-core machine's worst case for something that takes milliseconds.
pub(crate) const PROMPT: Duration = Duration::from_secs(10);

macro_rules! on_every_backend {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::within_limit(super::$scenario(super::Kind::memory())).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::within_limit(super::$scenario(super::Kind::Postgres)).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::within_limit(super::$scenario(super::Kind::Redis)).await;
                }
            )*
        }
    };
}

on_every_backend!(
    one_leader_at_a_time_under_contention,
    a_stalled_heartbeat_deposes_the_leader_before_its_successor_leads,
    a_leader_whose_lock_is_deleted_is_fenced_off_and_deposed,
    resign_hands_over_well_within_the_ttl,
    candidates_with_one_identity_never_share_leadership,
    observers_see_every_change_in_order,
    run_while_leader_runs_one_copy_at_a_time_only_while_leading,
    run_while_leader_stops_cleanly_on_shutdown_and_when_the_work_ends,
    a_shutdown_during_a_campaign_attempt_leaves_no_lock,
    a_shutdown_during_a_failing_campaign_attempt_returns,
);

async fn within_limit(scenario: impl Future<Output = ()>) {
    timeout(SCENARIO_LIMIT, scenario)
        .await
        .expect("the scenario finished in time");
}
