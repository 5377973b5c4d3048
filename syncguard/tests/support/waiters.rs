//! Waiters for the tests of waking on release: a policy that polls at a fixed pace, a waiter
//! in a task of its own, and the lock it must get in time.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use syncguard::backend::LockBackend;
use syncguard::{Backoff, Jitter, LockError, LockGuard, LockOptions, RetryPolicy};
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// Waiters that poll every `poll`, for up to a minute, with a 30 s ttl.
pub fn waiting_every(poll: Duration) -> LockOptions {
    LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .retry(
            RetryPolicy::wait_for(Duration::from_secs(60))
                .with_backoff(Backoff::Fixed)
                .with_jitter(Jitter::None)
                .with_base_delay(poll),
        )
        .build()
        .expect("valid options")
}

/// `syncguard::acquire` of `key` with `options`, in a task of its own.
pub fn spawn_waiter<B: LockBackend + Clone + 'static>(
    backend: &B,
    key: &str,
    options: LockOptions,
) -> JoinHandle<Result<LockGuard, LockError>> {
    let (backend, key) = (backend.clone(), key.to_owned());
    tokio::spawn(async move { syncguard::acquire(&backend, &key, &options).await })
}

/// The guard of a waiter that must get the lock within `within`.
pub async fn taken(
    waiter: JoinHandle<Result<LockGuard, LockError>>,
    within: Duration,
) -> LockGuard {
    timeout(within, waiter)
        .await
        .unwrap_or_else(|_| panic!("the waiter did not get the lock within {within:?}"))
        .expect("the waiter task")
        .expect("the waiter takes the lock")
}
