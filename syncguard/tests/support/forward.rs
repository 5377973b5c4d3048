//! One home for the `LockBackend` forwarding a test's wrapper backend needs: a wrapper states
//! only what it does differently (time, count, fail, delay a call) by implementing
//! [`Intercept`], and [`Intercepted`] forwards everything to the backend it wraps.
//!
//! ```ignore
//! #[derive(Clone, Default)]
//! struct Counting(Arc<AtomicUsize>);
//!
//! impl Intercept for Counting {
//!     fn intercept<'a, T: Send + 'a>(
//!         &'a self,
//!         _call: Call<'a>,
//!         forward: impl FnOnce() -> BoxFuture<'a, T> + Send + 'a,
//!     ) -> BoxFuture<'a, T> {
//!         self.0.fetch_add(1, Ordering::SeqCst);
//!         forward()
//!     }
//! }
//!
//! let counted = Intercepted::new(MemoryBackend::new(), Counting::default());
//! ```

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use syncguard::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockInfo, LockObserver,
    Lookup, ReleaseOutcome,
};
use syncguard::{LockError, LockId};

/// One call of the storage contract, with its arguments.
#[derive(Debug, Clone, Copy)]
pub enum Call<'a> {
    Acquire { key: &'a str, ttl: Duration },
    Release { lock_id: &'a LockId },
    Extend { lock_id: &'a LockId, ttl: Duration },
    IsLocked { key: &'a str },
    Lookup(Lookup<'a>),
}

impl Call<'_> {
    /// The method's name: `"acquire"`, `"release"`, `"extend"`, `"is_locked"`, `"lookup"`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Acquire { .. } => "acquire",
            Self::Release { .. } => "release",
            Self::Extend { .. } => "extend",
            Self::IsLocked { .. } => "is_locked",
            Self::Lookup(_) => "lookup",
        }
    }
}

/// What a wrapper does to the calls that go through it. By default, nothing.
pub trait Intercept: Send + Sync {
    /// Runs `call`. `forward()` makes it on the wrapped backend; it is not made before
    /// `forward` is called, so an interceptor can fail a call without it reaching the store
    /// (some backends, such as `MemoryBackend`, do their work when called, not when awaited).
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        call: Call<'a>,
        forward: impl FnOnce() -> BoxFuture<'a, T> + Send + 'a,
    ) -> BoxFuture<'a, T> {
        let _ = call;
        forward()
    }
}

/// `inner`, with every call of the storage contract going through `interceptor`;
/// capabilities and the observer are `inner`'s.
#[derive(Clone, Default)]
pub struct Intercepted<B, I> {
    pub inner: B,
    pub interceptor: I,
}

impl<B, I> Intercepted<B, I> {
    pub fn new(inner: B, interceptor: I) -> Self {
        Self { inner, interceptor }
    }
}

impl<B: LockBackend, I: Intercept> LockBackend for Intercepted<B, I> {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        let call = Call::Acquire { key, ttl };
        self.interceptor
            .intercept(call, move || self.inner.acquire(key, ttl))
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        let call = Call::Release { lock_id };
        self.interceptor
            .intercept(call, move || self.inner.release(lock_id))
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let call = Call::Extend { lock_id, ttl };
        self.interceptor
            .intercept(call, move || self.inner.extend(lock_id, ttl))
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        let call = Call::IsLocked { key };
        self.interceptor
            .intercept(call, move || self.inner.is_locked(key))
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        self.interceptor
            .intercept(Call::Lookup(query), move || self.inner.lookup(query))
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn observer(&self) -> Option<Arc<dyn LockObserver>> {
        self.inner.observer()
    }
}
