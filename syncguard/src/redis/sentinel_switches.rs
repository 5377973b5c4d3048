//! The Sentinels' announcements of a failover (`+switch-master`), heard on every Sentinel of
//! the URL: the backend's connection leaves the old primary the moment one says the primary
//! changed. A planned failover leaves the old primary up, answering and accepting writes until
//! the Sentinels turn it into a replica (seconds later), so that a connection that waited for
//! an error would keep granting locks there while other clients grant them on the new one.

use std::sync::Weak;
use std::time::Duration;

use ::redis::Client;
use futures_core::Stream;
use tokio::time::{sleep, timeout};

use super::sentinel_conn::SentinelConn;

/// The channel a Sentinel announces a new primary on: `<name> <old ip> <old port> <new ip>
/// <new port>`.
const SWITCH_MASTER: &str = "+switch-master";
/// How often a listener without news checks that its backend is still there.
const CHECK_EVERY: Duration = Duration::from_secs(1);
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

/// Listens on each of `sentinels` for the switches of `master_name`, each switch turning
/// `conn` to the new primary, until the backend that holds `conn` is dropped.
pub(crate) fn follow(
    conn: &Weak<SentinelConn>,
    sentinels: Vec<Client>,
    master_name: &str,
    connect_timeout: Duration,
) {
    for sentinel in sentinels {
        let (conn, master_name) = (conn.clone(), master_name.to_owned());
        tokio::spawn(async move { listen(conn, sentinel, master_name, connect_timeout).await });
    }
}

async fn listen(
    conn: Weak<SentinelConn>,
    sentinel: Client,
    master_name: String,
    connect_timeout: Duration,
) {
    let mut pause = FIRST_PAUSE;
    while conn.strong_count() > 0 {
        match subscribe(&sentinel, connect_timeout).await {
            Ok(mut switches) => {
                pause = FIRST_PAUSE;
                loop {
                    let next = timeout(CHECK_EVERY, next_message(&mut switches)).await;
                    let Some(conn) = conn.upgrade() else {
                        return;
                    };
                    match next {
                        // Nothing in a while: the backend is still there; listen on.
                        Err(_) => {}
                        Ok(None) => break,
                        Ok(Some(message)) => {
                            if names(&message, &master_name) {
                                tracing::info!(switch = %message, "syncguard: the Redis Sentinels switched the primary");
                                conn.primary_switched();
                            }
                        }
                    }
                }
            }
            Err(error) => {
                tracing::debug!(%error, "syncguard: cannot listen to a Redis Sentinel's failovers; trying again");
            }
        }
        sleep(pause).await;
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

type Switches = std::pin::Pin<Box<dyn Stream<Item = ::redis::Msg> + Send>>;

async fn subscribe(sentinel: &Client, connect_timeout: Duration) -> Result<Switches, String> {
    let subscribed = async {
        let mut pubsub = sentinel.get_async_pubsub().await?;
        pubsub.subscribe(SWITCH_MASTER).await?;
        Ok::<_, ::redis::RedisError>(Box::pin(pubsub.into_on_message()) as Switches)
    };
    match timeout(connect_timeout, subscribed).await {
        Ok(Ok(switches)) => Ok(switches),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no subscription within {connect_timeout:?}")),
    }
}

/// The next announcement's payload; `None` when the connection is gone.
async fn next_message(switches: &mut Switches) -> Option<String> {
    let message = std::future::poll_fn(|cx| switches.as_mut().poll_next(cx)).await?;
    Some(message.get_payload::<String>().unwrap_or_default())
}

/// Whether a `+switch-master` payload is about `master_name`.
fn names(payload: &str, master_name: &str) -> bool {
    payload.split(' ').next() == Some(master_name)
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn a_switch_is_matched_by_the_primary_s_name() {
        assert!(names("locks 10.0.0.1 6379 10.0.0.2 6379", "locks"));
        assert!(!names("locks-eu 10.0.0.1 6379 10.0.0.2 6379", "locks"));
        assert!(!names("", "locks"));
    }
}
