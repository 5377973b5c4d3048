//! The operations: acquire (also as a holder), release and extend (also by an amount) through
//! the batcher, `is_locked` and lookup by their own scripts, and the [`LockBackend`]
//! implementation on top.

use std::time::Duration;

use ::redis::{Cmd, Value};
use serde::{Deserialize, Deserializer};

use super::RedisBackend;
use super::batch::{self, NewExpiry};
use super::config::RedisLayout;
use super::connection::ConnError;
use super::error::unexpected_reply;
use super::keys::{Located, Placement};
use super::scripts::{self, LuaScript};
use crate::backend::key::normalize_key;
use crate::backend::time::{TIME_TOLERANCE_MS, check_expiry, is_live, ttl_millis};
use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, Lease, LockBackend, LockInfo, Lookup,
    NotHeldReason, ReleaseNotifier, ReleaseOutcome, TimeAuthority, check_holder,
};
use crate::error::LockError;
use crate::fence::Fence;
use crate::lock_id::LockId;

impl RedisBackend {
    /// Runs one script command, reloading the script once on NOSCRIPT, within the operation
    /// timeout.
    async fn eval(&self, script: &LuaScript, cmd: &Cmd) -> Result<Value, LockError> {
        let call = async {
            self.inner
                .conn
                .eval(script, cmd)
                .await
                .map_err(ConnError::into_lock_error)
        };
        self.within_operation_timeout("answer", call).await
    }

    /// One acquire; with a `holder` (`acquire_as`), re-entrant by that holder, who is stored
    /// with the lock.
    async fn acquire_once(
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
        let Placement {
            lock_key,
            index_key,
            fence_key,
            lock_id,
        } = self.inner.layout.place(&key)?;

        let reply = self
            .inner
            .batcher
            .run(batch::Op::Acquire {
                lock_key: lock_key.clone(),
                index_key,
                fence_key,
                lock_id: lock_id.clone(),
                ttl_ms,
                key: key.into_owned(),
                holder: holder.map(str::to_owned),
            })
            .await?;
        let (lock_id, fence) = match &reply.value {
            // Refused: the live holder's stored expiry, which the waiter may wait for.
            Value::Int(expires) => {
                let expires = u64::try_from(*expires)
                    .ok()
                    .filter(|&expires| expires > 0)
                    .ok_or_else(|| unexpected_reply("acquire", &reply.value))?;
                return Ok(AcquireOutcome::contended(Some(expires)));
            }
            Value::BulkString(fence) => match std::str::from_utf8(fence)
                .map_err(|_| unexpected_reply("acquire", &reply.value))
                .and_then(str::parse::<Fence>)
            {
                Ok(fence) => (lock_id, fence),
                Err(error) => {
                    // Past the fence maximum (or garbage): do not leave the lock held for its
                    // ttl. Boxed: a rare path, kept out of every acquire's future.
                    let _ = Box::pin(self.release_once(&lock_id)).await;
                    return Err(error);
                }
            },
            // An `acquire_as` re-entered its holder's live lock: its lock id and fence, kept.
            Value::Array(kept) if holder.is_some() => {
                reentered(kept).ok_or_else(|| unexpected_reply("acquire", &reply.value))??
            }
            _ => return Err(unexpected_reply("acquire", &reply.value)),
        };
        if self.inner.layout.kind() == RedisLayout::Reference {
            self.inner.known.insert(lock_id.clone(), lock_key, ttl);
        }
        Ok(AcquireOutcome::Acquired(Lease::new(
            lock_id,
            reply.now_ms + ttl_ms,
            fence,
        )))
    }

    /// Where the lock of `lock_id` is: in the reference layout, through the lock key this
    /// backend knows when it took the lock (forgotten for a release), else the index.
    fn locate(&self, lock_id: &LockId, release: bool) -> Result<Located, LockError> {
        let layout = &self.inner.layout;
        let known = match layout.kind() {
            RedisLayout::Reference if release => self.inner.known.take(lock_id),
            RedisLayout::Reference => self.inner.known.get(lock_id),
            // Derived from the lock id.
            RedisLayout::Cluster => None,
        };
        layout.locate(lock_id, known)
    }

    async fn release_once(&self, lock_id: &LockId) -> Result<ReleaseOutcome, LockError> {
        let reply = self
            .inner
            .batcher
            .run(batch::Op::Release {
                at: self.locate(lock_id, true)?,
                lock_id: lock_id.clone(),
                wake_here: self.inner.releases.has_waiters(),
            })
            .await?
            .value;
        match reply {
            Value::Int(1) => Ok(ReleaseOutcome::Released),
            // Released without a publish: this process's own waiters of the key are woken here.
            Value::BulkString(key) => {
                self.inner
                    .releases
                    .released_here(&String::from_utf8_lossy(&key));
                Ok(ReleaseOutcome::Released)
            }
            Value::Int(code) => match not_held_reason(code) {
                Some(reason) => Ok(ReleaseOutcome::NotHeld(Some(reason))),
                None => Err(unexpected_reply("release", &reply)),
            },
            _ => Err(unexpected_reply("release", &reply)),
        }
    }

    /// One extend, to the expiry `expiry` says (its amount checked by the caller).
    async fn extend_once(
        &self,
        lock_id: &LockId,
        expiry: Result<NewExpiry, LockError>,
    ) -> Result<ExtendOutcome, LockError> {
        let expiry = expiry?;
        let reply = self
            .inner
            .batcher
            .run(batch::Op::Extend {
                at: self.locate(lock_id, false)?,
                lock_id: lock_id.clone(),
                expiry,
            })
            .await?;
        let expires_at_ms = match (&reply.value, expiry) {
            (Value::Int(1), NewExpiry::FromNow(ttl_ms)) => reply.now_ms + ttl_ms,
            (Value::Array(extended), NewExpiry::Added(_) | NewExpiry::At(_)) => {
                match extended.as_slice() {
                    [Value::Int(1), Value::Int(expires)] => u64::try_from(*expires)
                        .map_err(|_| unexpected_reply("extend", &reply.value))?,
                    _ => return Err(unexpected_reply("extend", &reply.value)),
                }
            }
            (Value::Int(code), _) => {
                let reason = not_held_reason(*code)
                    .ok_or_else(|| unexpected_reply("extend", &reply.value))?;
                self.inner.known.extended(lock_id, None);
                return Ok(ExtendOutcome::NotHeld(Some(reason)));
            }
            _ => return Err(unexpected_reply("extend", &reply.value)),
        };
        let lives_for = Duration::from_millis(expires_at_ms.saturating_sub(reply.now_ms));
        self.inner.known.extended(lock_id, Some(lives_for));
        Ok(ExtendOutcome::Extended { expires_at_ms })
    }

    async fn is_locked_once(&self, key: &str) -> Result<bool, LockError> {
        let key = normalize_key(key)?;
        let layout = &self.inner.layout;
        let lock_key = layout.lock_key(&key)?;
        let mut cmd = scripts::IS_LOCKED.evalsha(1, 3, lock_key.len() + 128);
        cmd.arg(lock_key.as_str())
            .arg(TIME_TOLERANCE_MS)
            .arg(self.inner.cleanup_guard_ms)
            .arg(layout.index_prefix());
        let reply = self.eval(&scripts::IS_LOCKED, &cmd).await?;
        match reply {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            _ => Err(unexpected_reply("is_locked", &reply)),
        }
    }

    async fn lookup_once(&self, query: Lookup<'_>) -> Result<Option<LockInfo>, LockError> {
        let layout = &self.inner.layout;
        let mut wanted_key = None;
        let (script, redis_key, owner): (&LuaScript, String, Option<&LockId>) = match query {
            Lookup::Key(key) => {
                let key = normalize_key(key)?;
                let lock_key = layout.lock_key(&key)?;
                // Only the cluster layout can find another key's lock under a key's Redis key.
                if layout.kind() == RedisLayout::Cluster {
                    wanted_key = Some(key);
                }
                (&scripts::LOOKUP_KEY, lock_key, None)
            }
            Lookup::LockId(lock_id) => match layout.locate(lock_id, None)? {
                // The cluster layout: the lock key, from the lock id.
                Located {
                    lock_key: Some(lock_key),
                    ..
                } => (&scripts::LOOKUP_KEY, lock_key, Some(lock_id)),
                Located {
                    index_key: Some(index_key),
                    ..
                } => (&scripts::LOOKUP_ID, index_key, Some(lock_id)),
                Located { .. } => {
                    return Err(LockError::internal(
                        "the Redis key layout found neither the lock key nor the index of a \
                         lock id",
                    ));
                }
            },
        };
        let mut cmd = script.evalsha(1, 0, redis_key.len() + 64);
        cmd.arg(redis_key.as_str());
        let reply = self.eval(script, &cmd).await?;
        let Value::Array(items) = &reply else {
            return Err(unexpected_reply("lookup", &reply));
        };
        let (now_ms, json) = match items.as_slice() {
            [] => return Ok(None),
            [Value::Int(now), Value::BulkString(json)] => (*now, json.as_slice()),
            _ => return Err(unexpected_reply("lookup", &reply)),
        };
        let now_ms = u64::try_from(now_ms).map_err(|_| unexpected_reply("lookup", &reply))?;
        let stored: StoredLock = serde_json::from_slice(json).map_err(|error| {
            LockError::invalid_argument(
                "the data under a lock key is not SyncGuard lock JSON; another program writes \
                 under this key prefix, use a prefix of your own",
            )
            .with_source(error)
        })?;
        // ADR-003: the index may be stale; only the lock id stored in the data counts.
        if owner.is_some_and(|owner| owner.as_str() != stored.lock_id) {
            return Ok(None);
        }
        // Another key's lock under the same Redis key: two keys whose cluster-layout tags (a
        // 64-bit hash) collide.
        if wanted_key.is_some_and(|wanted| wanted != stored.key.as_str()) {
            return Ok(None);
        }
        if !is_live(stored.expires_at_ms, now_ms) {
            return Ok(None);
        }
        let lock_id = match owner {
            Some(owner) => owner.clone(),
            None => LockId::parse(&stored.lock_id).map_err(|_| {
                LockError::invalid_argument(
                    "the lock data under a lock key has a malformed lockId; another program \
                     writes under this key prefix, use a prefix of your own",
                )
            })?,
        };
        let fence: Fence = stored.fence.parse()?;
        Ok(Some(
            LockInfo::new(
                stored.key,
                lock_id,
                stored.expires_at_ms,
                stored.acquired_at_ms,
                fence,
            )
            .with_holder(stored.holder),
        ))
    }
}

/// The lock id and fence in the reply `{fence, lockId}` of a re-entry; `None` for another
/// shape, an error for a lock id or fence that does not parse.
fn reentered(kept: &[Value]) -> Option<Result<(LockId, Fence), LockError>> {
    let [Value::BulkString(fence), Value::BulkString(lock_id)] = kept else {
        return None;
    };
    let (Ok(fence), Ok(lock_id)) = (std::str::from_utf8(fence), std::str::from_utf8(lock_id))
    else {
        return None;
    };
    Some(LockId::parse(lock_id).and_then(|lock_id| Ok((lock_id, fence.parse()?))))
}

fn not_held_reason(code: i64) -> Option<NotHeldReason> {
    match code {
        0 | -1 => Some(NotHeldReason::NotFound),
        -2 => Some(NotHeldReason::Expired),
        _ => None,
    }
}

/// The lock data JSON, as the reference writes it, plus `holder` (written by `acquire_as`,
/// absent otherwise; the reference ignores it, and writes records without it).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredLock {
    lock_id: String,
    #[serde(deserialize_with = "millis")]
    expires_at_ms: u64,
    #[serde(deserialize_with = "millis")]
    acquired_at_ms: u64,
    key: String,
    fence: String,
    #[serde(default)]
    holder: Option<String>,
}

/// A Unix millisecond timestamp: Lua's cjson writes integral numbers, possibly in float form.
fn millis<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let number = serde_json::Number::deserialize(deserializer)?;
    number
        .as_u64()
        .or_else(|| {
            number
                .as_f64()
                .filter(|f| f.fract() == 0.0 && (0.0..9.0e15).contains(f))
                .map(|f| f as u64)
        })
        .ok_or_else(|| serde::de::Error::custom("expected a Unix millisecond timestamp"))
}

impl LockBackend for RedisBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.acquire_once(key, ttl, None))
    }

    fn acquire_as<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.acquire_once(key, ttl, Some(holder)))
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        Box::pin(self.release_once(lock_id))
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(self.extend_once(lock_id, ttl_millis(ttl).map(NewExpiry::FromNow)))
    }

    fn extend_by<'a>(
        &'a self,
        lock_id: &'a LockId,
        by: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(self.extend_once(lock_id, ttl_millis(by).map(NewExpiry::Added)))
    }

    fn expire_at<'a>(
        &'a self,
        lock_id: &'a LockId,
        expires_at_ms: u64,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let expiry = check_expiry(expires_at_ms).map(NewExpiry::At);
        Box::pin(self.extend_once(lock_id, expiry))
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(self.is_locked_once(key))
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(self.lookup_once(query))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("redis", TimeAuthority::Server).with_holders()
    }

    /// Starts the subscriber connection the first time something waits (see
    /// [waiting](super#waiting)); `None` when release notifications are off, or this backend
    /// does not know where to subscribe.
    fn release_notifier(&self) -> Option<ReleaseNotifier> {
        if !self.inner.release_notifications {
            return None;
        }
        self.inner.releases.notifier()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_lock_parses_cjson_numbers() {
        let json = br#"{"fence":"000000000000001","key":"a\/b","expiresAtMs":1767225600123,"lockId":"AAAAAAAAAAAAAAAAAAAAAA","acquiredAtMs":1.7672256e+12}"#;
        let stored: StoredLock = serde_json::from_slice(json).unwrap();
        assert_eq!(stored.key, "a/b");
        assert_eq!(stored.expires_at_ms, 1_767_225_600_123);
        assert_eq!(stored.acquired_at_ms, 1_767_225_600_000);
        let bad = br#"{"fence":"1","key":"k","expiresAtMs":1.5,"lockId":"x","acquiredAtMs":1}"#;
        assert!(serde_json::from_slice::<StoredLock>(bad).is_err());
        assert_eq!(stored.holder, None, "written without a holder");
    }

    #[test]
    fn stored_lock_reads_the_holder() {
        let json = br#"{"key":"k","lockId":"AAAAAAAAAAAAAAAAAAAAAA","fence":"000000000000001","acquiredAtMs":1,"holder":"{\"owner\":\"a\/b\"}","expiresAtMs":2}"#;
        let stored: StoredLock = serde_json::from_slice(json).unwrap();
        assert_eq!(stored.holder.as_deref(), Some(r#"{"owner":"a/b"}"#));
    }
}
