//! Running work only while leading: campaign, run, stop on loss, campaign again (with a
//! backoff when leadership keeps being lost), and resign on shutdown.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Election, Leadership};
use crate::error::LockError;

/// The pause before campaigning again after the second setback in a row; doubled after each
/// further one, up to the ttl.
const FIRST_PAUSE: Duration = Duration::from_millis(250);

impl Election {
    /// Runs `work` on one candidate at a time: the common "singleton background task".
    ///
    /// It [campaigns](Self::campaign), runs `work(&leadership)` while leading, and:
    /// - **on loss** drops the work (with the default [`OnLost::Cancel`](crate::OnLost)) and
    ///   campaigns again: at once after the first loss, then, while terms keep ending in a
    ///   loss before a ttl has passed, after a pause that starts at 250 ms and doubles up to
    ///   the ttl (with jitter). Campaigns that fail with a retryable backend error are
    ///   retried the same way;
    /// - **on `shutdown`** (cancelled) drops the work, resigns (waiting up to a second for the
    ///   release, so that another candidate takes over at once) and returns `Ok(None)`. While
    ///   campaigning, it stops waiting at once; an attempt already sent is first answered
    ///   (within the backend's operation timeout), and a lock it took is released before the
    ///   call returns, so that a process that exits right after leaves no lock behind;
    /// - **when the work returns** while leading, resigns and returns `Ok(Some(output))`.
    ///
    /// One call runs one copy of the work at a time: the next term's copy starts only once
    /// the last one was dropped. Across candidates, a copy runs only while its candidate
    /// leads, and is stopped when leadership is lost, before the store lets the next leader
    /// in; a leader whose lock is taken from it behind its back (deleted by hand, the store's
    /// data lost) learns of it at its next heartbeat, so pass
    /// [`Leadership::term`] to what the work writes to.
    ///
    /// The work is cancelled by dropping its future: anything it must not leave half done
    /// belongs in one step between two `.await`s, or behind the term.
    ///
    /// When the call runs in a spawned task, write `async move |leadership| ...`, with
    /// captures the closure owns (clones of what it shares): an async closure that borrows
    /// its captures makes rustc refuse the task with "implementation of `Send` is not general
    /// enough" (a limitation of today's compiler with borrowing async closures).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use std::time::Duration;
    /// use syncguard::MemoryBackend;
    /// use syncguard::leader::Election;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// let backend = MemoryBackend::new();
    /// let election = Election::builder(&backend, "cache-warmer").identity("replica-1").build()?;
    /// let shutdown = CancellationToken::new();
    /// # let stop = shutdown.clone();
    /// # tokio::spawn(async move { tokio::time::sleep(Duration::from_millis(50)).await; stop.cancel() });
    /// let stopped = election
    ///     .run_while_leader(shutdown.clone(), async |leadership| {
    ///         loop {
    ///             let _fence = leadership.term(); // ... warm the cache, writing with it ...
    ///             tokio::time::sleep(Duration::from_millis(10)).await;
    ///         }
    ///     })
    ///     .await?;
    /// assert!(stopped.is_none(), "stopped by the shutdown token");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Campaign errors that are not retryable ([`LockError::is_retryable`]: bad arguments,
    /// credentials, internal errors).
    pub async fn run_while_leader<T>(
        &self,
        shutdown: CancellationToken,
        mut work: impl AsyncFnMut(&Leadership) -> T,
    ) -> Result<Option<T>, LockError> {
        let mut setbacks = Setbacks::new(self.ttl());
        loop {
            if let Some(pause) = setbacks.pause() {
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return Ok(None),
                    () = tokio::time::sleep(pause) => {}
                }
            }
            // A shutdown stops the campaign's waiting at once; an attempt under way is
            // finished, and a leadership it won is resigned below, before returning.
            let leadership = match self.campaign_until(Some(&shutdown)).await {
                Ok(Some(leadership)) => leadership,
                Ok(None) => return Ok(None),
                Err(error) if error.is_retryable() => {
                    tracing::warn!(%error, election = self.name(), "syncguard campaign failed; campaigning again");
                    setbacks.failed();
                    continue;
                }
                Err(error) => return Err(error),
            };
            let term = leadership.term();
            let elected = Instant::now();
            tracing::info!(election = self.name(), identity = self.identity(), %term, "syncguard candidate leads");
            let outcome = tokio::select! {
                biased;
                () = shutdown.cancelled() => None,
                outcome = leadership.run(work(&leadership)) => Some(outcome),
            };
            match outcome {
                None => {
                    leadership.guard.release_in_background().await;
                    return Ok(None);
                }
                Some(Ok(output)) => {
                    leadership.guard.release_in_background().await;
                    return Ok(Some(output));
                }
                Some(Err(lost)) => {
                    tracing::warn!(error = %lost, election = self.name(), %term, "syncguard leadership lost; the work was stopped");
                    setbacks.lost(elected.elapsed());
                    drop(leadership);
                }
            }
        }
    }
}

/// Losses and failed campaigns in a row, and the pause they call for.
struct Setbacks {
    ttl: Duration,
    in_a_row: u32,
}

impl Setbacks {
    fn new(ttl: Duration) -> Self {
        Self { ttl, in_a_row: 0 }
    }

    /// A term that ended in a loss after `held`: one that lasted a ttl or more was stable,
    /// and starts a new count.
    fn lost(&mut self, held: Duration) {
        self.in_a_row = if held >= self.ttl {
            1
        } else {
            self.in_a_row.saturating_add(1)
        };
    }

    fn failed(&mut self) {
        self.in_a_row = self.in_a_row.saturating_add(1);
    }

    /// None after no setback or a first one; then 250 ms, 500 ms, ... up to the ttl, with
    /// equal jitter (half of it random), so that candidates that failed together spread out.
    fn pause(&self) -> Option<Duration> {
        let doublings = self.in_a_row.checked_sub(2)?;
        let pause = FIRST_PAUSE
            .saturating_mul(2_u32.saturating_pow(doublings))
            .min(self.ttl);
        let half = pause / 2;
        Some(half + half.mul_f64(rand::random::<f64>()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_start_at_the_second_setback_and_stop_growing_at_the_ttl() {
        let ttl = Duration::from_secs(2);
        let mut setbacks = Setbacks::new(ttl);
        assert_eq!(setbacks.pause(), None);
        setbacks.lost(Duration::from_millis(10));
        assert_eq!(setbacks.pause(), None, "the first loss campaigns at once");
        let mut last = Duration::ZERO;
        for _ in 0..10 {
            setbacks.failed();
            let pause = setbacks.pause().unwrap();
            assert!(pause <= ttl, "{pause:?}");
            assert!(pause >= last / 2, "{pause:?} after {last:?}");
            last = pause;
        }
        assert!(last >= ttl / 2);
        setbacks.lost(ttl);
        assert_eq!(setbacks.pause(), None, "a stable term starts a new count");
        setbacks.lost(Duration::ZERO);
        let pause = setbacks.pause().unwrap();
        assert!(
            pause >= FIRST_PAUSE / 2 && pause <= FIRST_PAUSE,
            "{pause:?}"
        );
    }
}
