//! `#[locked]` end to end on a real PostgreSQL server.

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locked_calls_exclude_and_outlive_the_ttl() {
    support::locked_calls_exclude_and_outlive_the_ttl(support::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lock_cancels_the_locked_body() {
    support::lost_lock_cancels_the_locked_body(support::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_is_reported_by_each_entry_point() {
    support::contention_is_reported_by_each_entry_point(support::postgres().await).await;
}
