//! The [`LockBackend`] implementation of the in-process backend: every operation answers at
//! once, under the backend's mutex, with the local clock as the time authority.

use std::time::Duration;

use super::MemoryBackend;
use super::entries::Held;
use crate::backend::key::normalize_key;
use crate::backend::time::{check_expiry, now_ms, ttl_millis};
use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockInfo, Lookup,
    ReleaseNotifier, ReleaseOutcome, TimeAuthority, check_holder,
};
use crate::error::LockError;
use crate::lock_id::LockId;

impl MemoryBackend {
    /// Applies `view` to the live lock the query names, if any.
    fn find_live<R>(
        &self,
        query: Lookup<'_>,
        view: impl FnOnce(&Held) -> R,
    ) -> Result<Option<R>, LockError> {
        let now = now_ms();
        let state = self.state();
        let found = match query {
            Lookup::Key(key) => state.by_key(&normalize_key(key)?),
            Lookup::LockId(lock_id) => state.by_lock_id(lock_id),
        };
        Ok(found.filter(|held| held.is_live(now)).map(view))
    }
}

impl MemoryBackend {
    fn acquire_with(
        &self,
        key: &str,
        ttl: Duration,
        holder: Option<&str>,
    ) -> Result<AcquireOutcome, LockError> {
        let key = normalize_key(key)?;
        let ttl_ms = ttl_millis(ttl)?;
        if let Some(holder) = holder {
            check_holder(holder)?;
        }
        self.state().acquire(&key, holder, ttl_ms, now_ms())
    }
}

impl LockBackend for MemoryBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        let outcome = self.acquire_with(key, ttl, None);
        Box::pin(async move { outcome })
    }

    fn acquire_as<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        let outcome = self.acquire_with(key, ttl, Some(holder));
        Box::pin(async move { outcome })
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        let now = now_ms();
        let (outcome, released) = self.state().release(lock_id, now);
        if let Some(held) = released {
            self.notifier.released(held.key.as_str());
        }
        Box::pin(async move { Ok(outcome) })
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let outcome = ttl_millis(ttl).map(|ttl_ms| {
            let now = now_ms();
            self.state()
                .extend(lock_id, now, |_| now.saturating_add(ttl_ms))
        });
        Box::pin(async move { outcome })
    }

    fn extend_by<'a>(
        &'a self,
        lock_id: &'a LockId,
        by: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let outcome = ttl_millis(by).map(|by_ms| {
            self.state().extend(lock_id, now_ms(), |expires_at_ms| {
                expires_at_ms.saturating_add(by_ms)
            })
        });
        Box::pin(async move { outcome })
    }

    fn expire_at<'a>(
        &'a self,
        lock_id: &'a LockId,
        expires_at_ms: u64,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let outcome =
            check_expiry(expires_at_ms).map(|at| self.state().extend(lock_id, now_ms(), |_| at));
        Box::pin(async move { outcome })
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        let locked = self
            .find_live(Lookup::Key(key), |_| ())
            .map(|found| found.is_some());
        Box::pin(async move { locked })
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        let info = self.find_live(query, |held| {
            LockInfo::new(
                held.key.to_owned_string(),
                held.lock_id.clone(),
                held.expires_at_ms,
                held.acquired_at_ms,
                held.fence,
            )
            .with_holder(held.holder.as_deref().map(str::to_owned))
        });
        Box::pin(async move { info })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("memory", TimeAuthority::Client).with_holders()
    }

    fn release_notifier(&self) -> Option<ReleaseNotifier> {
        Some(self.notifier.clone())
    }
}
