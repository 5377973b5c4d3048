//! The backend conformance suite: the lock contract, checked against a live backend.
//!
//! Every built-in backend runs it (the in-memory one, and PostgreSQL, Redis and the Firestore
//! emulator against real servers); run it on your own [`LockBackend`](crate::backend::LockBackend) the same way. Each check
//! is an async function that panics on a violation; [`conformance_tests!`](crate::conformance_tests)
//! turns them all into `#[tokio::test]`s:
//!
//! ```
//! // tests/memory.rs (needs tokio with "macros" and "rt-multi-thread" as a dev-dependency);
//! // for your backend, build it in the async block instead.
//! syncguard::conformance_tests!(async { syncguard::MemoryBackend::new() });
//! # fn main() {}
//! ```
//!
//! Checks use random keys, so they can share one store and run concurrently. Some wait for
//! real expiry (the 1 s tolerance included), so the suite takes a few seconds.

mod entry_points;
mod exclusion;
mod faulty;
mod fences;
mod heartbeat;
pub mod history;
mod holders;
mod input;
mod lease_safety;
mod lifecycle;
mod min_hold;
mod support;
mod waiting;

pub use entry_points::{
    acquire_waits_only_when_asked, errors_name_the_lock, handle_agrees_with_the_guard,
    try_acquire_on_a_held_key_changes_nothing,
};
pub use exclusion::{mutual_exclusion, mutual_exclusion_with};
pub use faulty::FaultyBackend;
pub use fences::{fences_are_monotonic_per_key, fences_survive_expiry};
pub use heartbeat::{
    heartbeat_keeps_short_ttl_lock, lock_removed_behind_back_is_lost,
    with_lock_cancels_work_on_loss,
};
pub use holders::{
    a_lock_without_holder_is_not_reentered, bad_holders_change_nothing,
    extend_by_adds_to_the_expiry, holders_are_reentrant_and_exclusive,
};
pub use input::{invalid_input_changes_nothing, keys_are_nfc_normalized};
pub use lease_safety::{
    a_manual_extend_waits_for_the_heartbeats, a_stalled_holder_learns_of_its_loss,
    huge_durations_never_overflow, work_that_outlived_its_lease_is_not_a_success,
};
pub use lifecycle::{
    capabilities_declare_fencing, contention, expiry_honours_tolerance,
    extend_sets_authoritative_expiry, lifecycle, lookups_are_sanitized, ownership_is_verified,
};
pub use min_hold::{expire_at_sets_a_fixed_expiry, min_hold_keeps_a_released_lock};
pub use support::unique_key;
pub use waiting::{
    a_cancelled_wait_leaves_nothing_behind, a_waiter_whose_turn_comes_waits_for_the_release,
    waiters_take_turns_in_arrival_order, waiters_wake_on_release, waiters_wake_when_the_lease_ends,
};

/// Generates one `#[tokio::test]` per conformance check, each on the backend that `$make`
/// (an expression evaluating to a future of the backend) creates.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            lifecycle, contention, expiry_honours_tolerance, extend_sets_authoritative_expiry,
            ownership_is_verified, fences_are_monotonic_per_key, fences_survive_expiry,
            lookups_are_sanitized, invalid_input_changes_nothing, keys_are_nfc_normalized,
            mutual_exclusion, heartbeat_keeps_short_ttl_lock, lock_removed_behind_back_is_lost,
            with_lock_cancels_work_on_loss, capabilities_declare_fencing,
            huge_durations_never_overflow, a_manual_extend_waits_for_the_heartbeats,
            a_stalled_holder_learns_of_its_loss, work_that_outlived_its_lease_is_not_a_success,
            try_acquire_on_a_held_key_changes_nothing, acquire_waits_only_when_asked,
            errors_name_the_lock, handle_agrees_with_the_guard,
            holders_are_reentrant_and_exclusive, a_lock_without_holder_is_not_reentered,
            extend_by_adds_to_the_expiry, bad_holders_change_nothing,
            waiters_wake_on_release, waiters_wake_when_the_lease_ends,
            waiters_take_turns_in_arrival_order, a_cancelled_wait_leaves_nothing_behind,
            a_waiter_whose_turn_comes_waits_for_the_release, min_hold_keeps_a_released_lock,
            expire_at_sets_a_fixed_expiry
        );
    };
    (@each $make:expr; $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                let backend = $make.await;
                $crate::conformance::$check(backend).await;
            }
        )*
    };
}
