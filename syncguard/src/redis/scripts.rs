//! The Lua scripts, one per operation, run by EVALSHA; after a NOSCRIPT (SCRIPT FLUSH,
//! restart, failover) the same call is sent once as EVAL, which also caches the script again.

use std::sync::LazyLock;

use ::redis::Script;

/// A script: its `redis::Script` (SHA-1, `SCRIPT LOAD`) and its source for the EVAL fallback.
pub(crate) struct LuaScript {
    pub(crate) script: Script,
    pub(crate) code: &'static str,
}

impl LuaScript {
    fn new(code: &'static str) -> Self {
        Self {
            script: Script::new(code),
            code,
        }
    }
}

/// Takes a lock: `KEYS` lock, index, fence; `ARGV` lock id, ttl, tolerance, user key, index
/// prefix. Returns `0` (contended) or `{1, fence, expiresAtMs}`.
pub(crate) static ACQUIRE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("lua/acquire.lua")));
/// Releases by lock id: `KEYS` index; `ARGV` lock id, tolerance. Returns `1`, `0` (another
/// owner), `-1` (not found) or `-2` (expired).
pub(crate) static RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("lua/release.lua")));
/// Extends by lock id: `KEYS` index; `ARGV` lock id, tolerance, ttl. Returns `{1, expiresAtMs}`,
/// `0`, `-1` or `-2` as release.
pub(crate) static EXTEND: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("lua/extend.lua")));
/// Liveness of a key: `KEYS` lock; `ARGV` tolerance, cleanup guard (0 = off), index prefix.
/// Returns `1` or `0`.
pub(crate) static IS_LOCKED: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("lua/is_locked.lua")));
/// Lock data by key: `KEYS` lock. Returns `{}` or `{nowMs, json}`.
pub(crate) static LOOKUP_KEY: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("lua/lookup_key.lua")));
/// Lock data by lock id: `KEYS` index. Returns `{}` or `{nowMs, json}`.
pub(crate) static LOOKUP_ID: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("lua/lookup_id.lua")));

/// Every script, for loading them all up front.
pub(crate) fn all() -> [&'static LuaScript; 6] {
    [
        &ACQUIRE,
        &RELEASE,
        &EXTEND,
        &IS_LOCKED,
        &LOOKUP_KEY,
        &LOOKUP_ID,
    ]
}
