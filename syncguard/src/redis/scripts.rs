//! The Lua scripts, run by EVALSHA (acquire, release and extend batched in one); after a
//! NOSCRIPT (SCRIPT FLUSH, restart, failover) the same call is sent once as EVAL, which also
//! caches the script again.

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

/// Acquire, release and extend operations in one call: `KEYS` and `ARGV` per operation as
/// described in `lua/batch.lua`; replies the batch's server time, then one reply per operation
/// (the reference's outcome codes; a refused acquire replies the holder's expiry). A release
/// of a live lock publishes its key on the release channel.
pub(crate) static BATCH: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("lua/batch.lua")));
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
pub(crate) fn all() -> [&'static LuaScript; 4] {
    [&BATCH, &IS_LOCKED, &LOOKUP_KEY, &LOOKUP_ID]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_distinct() {
        let hashes: std::collections::HashSet<_> = all()
            .iter()
            .map(|s| s.script.get_hash().to_owned())
            .collect();
        assert_eq!(hashes.len(), all().len());
    }
}
