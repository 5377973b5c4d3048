//! A backend wrapper that times every call, so the suite can check that each one returned
//! within the backend's configured timeouts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use syncguard::backend::{BoxFuture, LockBackend};
use tokio::time::Instant;

use crate::forward::{Call, Intercept, Intercepted};

/// The slowest call of each kind, and how many calls were made.
#[derive(Default)]
pub(crate) struct CallTimes {
    worst: Mutex<BTreeMap<&'static str, Duration>>,
    calls: Mutex<usize>,
}

impl CallTimes {
    fn note(&self, what: &'static str, took: Duration) {
        let mut worst = self.worst.lock().unwrap();
        let slot = worst.entry(what).or_default();
        *slot = (*slot).max(took);
        *self.calls.lock().unwrap() += 1;
    }

    pub(crate) fn worst(&self) -> BTreeMap<&'static str, Duration> {
        self.worst.lock().unwrap().clone()
    }

    pub(crate) fn slowest(&self) -> Duration {
        self.worst().values().copied().max().unwrap_or_default()
    }

    pub(crate) fn calls(&self) -> usize {
        *self.calls.lock().unwrap()
    }
}

/// Times each call into the shared [`CallTimes`].
#[derive(Clone)]
pub(crate) struct Timing(pub(crate) Arc<CallTimes>);

impl Intercept for Timing {
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        call: Call<'a>,
        forward: impl FnOnce() -> BoxFuture<'a, T> + Send + 'a,
    ) -> BoxFuture<'a, T> {
        Box::pin(async move {
            let started = Instant::now();
            let result = forward().await;
            self.0.note(call.name(), started.elapsed());
            result
        })
    }
}

/// A backend instance, timed.
pub(crate) type Timed = Intercepted<Arc<dyn LockBackend>, Timing>;

/// `backend`, timed into `times`.
pub(crate) fn timed(backend: impl LockBackend + 'static, times: &Arc<CallTimes>) -> Timed {
    Intercepted::new(Arc::new(backend), Timing(Arc::clone(times)))
}
