//! A release within `min_hold` held up by a partition, and delivered when it heals: it must not
//! keep the lock past the end of the minimum hold (on the store's clock), however late it lands.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use syncguard::backend::LockBackend;
use syncguard::{LockOptions, RetryPolicy, get_by_key};
use tokio::time::{Instant, sleep, sleep_until, timeout};

use crate::proxy::Proxy;

const TTL: Duration = Duration::from_secs(1);
const MIN_HOLD: Duration = Duration::from_secs(2);

/// `cut_off` reaches the store through `proxy`; `direct` does not. The release is given up on
/// after `give_up` (the backend's own timeout should come first, where it has one). `lands`:
/// the held release is delivered when the partition heals (the backend keeps the connection
/// it was sent on), and the test sees it set the expiry.
pub async fn a_min_hold_release_landing_late_keeps_nothing_past_min_hold<B>(
    cut_off: B,
    direct: B,
    proxy: &Proxy,
    key: &str,
    give_up: Duration,
    lands: bool,
) where
    B: LockBackend + Clone + 'static,
{
    let options = LockOptions::builder()
        .ttl(TTL)
        .min_hold(MIN_HOLD)
        .retry(RetryPolicy::single_attempt())
        .build()
        .unwrap();
    let started = Instant::now();
    let guard = syncguard::acquire(&cut_off, key, &options)
        .await
        .expect("a free key");
    let fence = guard.fence();
    let stored = get_by_key(&direct, key)
        .await
        .unwrap()
        .expect("the lock is stored");
    let keep_until_ms = stored.acquired_at_ms + millis(MIN_HOLD);

    sleep_until(started + Duration::from_millis(100)).await;
    proxy.stall();
    sleep_until(started + Duration::from_millis(200)).await;
    // Within min_hold: the release keeps the lock until its end. Cut off, it is not answered
    // (the backend's timeout, or ours: the guard then lets go in the background).
    let released = timeout(give_up, guard.release()).await;
    assert!(
        !matches!(released, Ok(Ok(_))),
        "a release through a stalled proxy cannot have been answered: {released:?}"
    );
    // The partition heals late in the lease's tolerance: the held request lands now.
    sleep_until(started + Duration::from_millis(1_850)).await;
    proxy.resume();

    // However it landed, the store never holds the lock past the end of the minimum hold.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut landed = false;
    loop {
        match get_by_key(&direct, key).await.unwrap() {
            Some(info) if info.fence == fence => {
                assert!(
                    info.expires_at_ms <= keep_until_ms,
                    "the lock is kept until {} ms, {} ms past the end of its minimum hold",
                    info.expires_at_ms,
                    info.expires_at_ms - keep_until_ms
                );
                landed |= info.expires_at_ms == keep_until_ms;
            }
            _ => break,
        }
        assert!(Instant::now() < deadline, "the lock never lapsed");
        sleep(Duration::from_millis(50)).await;
    }
    assert!(
        landed || !lands,
        "the held release never set the expiry to the end of the minimum hold"
    );
    let waiting = LockOptions::builder()
        .retry(RetryPolicy::wait_for(Duration::from_secs(10)))
        .build()
        .unwrap();
    let next = syncguard::acquire(&direct, key, &waiting)
        .await
        .expect("the key is free once the minimum hold (and the tolerance) is over");
    assert!(next.fence() > fence);
    next.release().await.unwrap();
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap()
}
