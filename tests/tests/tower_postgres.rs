//! `syncguard-tower` end to end on PostgreSQL: an axum server and a hyper client over loopback
//! HTTP (the scenario is in `support`).

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_layer_on_postgres() {
    support::one_key_at_a_time_over_http(support::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_on_postgres() {
    support::retry_after_follows_the_holds_over_http(support::postgres().await).await;
}
