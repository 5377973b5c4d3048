//! The Lua scripts, run by EVALSHA (acquire, release and extend batched in one); after a
//! NOSCRIPT (SCRIPT FLUSH, restart, failover) the same call is sent once as EVAL, which also
//! caches the script again. The batch is also a function library (see `batch_function`).

use std::sync::LazyLock;

use ::redis::aio::ConnectionLike;
use ::redis::{Arg, Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};

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

    /// `EVALSHA <sha> <nkeys>`, with room for the keys and arguments that follow.
    pub(crate) fn evalsha(&self, keys: usize, args: usize, data_bytes: usize) -> Cmd {
        call("EVALSHA", self.script.get_hash(), keys, args, data_bytes)
    }

    /// Runs `cmd` (an EVALSHA of this script), sent once more as EVAL after a NOSCRIPT.
    pub(crate) async fn run_on<C: ConnectionLike>(
        &self,
        conn: &mut C,
        cmd: &Cmd,
    ) -> Result<Value, RedisError> {
        match cmd.query_async::<Value>(conn).await {
            Ok(value) => Ok(value),
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // The script cache was emptied (SCRIPT FLUSH, restart, failover): send the
                // same call once as EVAL, which runs the script and caches it again in one
                // round trip.
                let args = cmd.args_iter().skip(2);
                let mut eval = Cmd::with_capacity(args.len() + 2, self.code.len() + 256);
                eval.arg("EVAL").arg(self.code);
                for arg in args {
                    if let Arg::Simple(bytes) = arg {
                        eval.arg(bytes);
                    }
                }
                eval.query_async::<Value>(conn).await
            }
            Err(error) => Err(error),
        }
    }
}

/// `<command> <script or function> <nkeys>` (EVALSHA, FCALL), with room for the keys and
/// arguments that follow.
pub(crate) fn call(command: &str, name: &str, keys: usize, args: usize, data_bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + keys + args, data_bytes + 64);
    cmd.arg(command).arg(name).arg(keys);
    cmd
}

/// Acquire, release and extend operations in one call: `KEYS` and `ARGV` per operation as
/// described in `lua/batch.lua`; replies the batch's server time, then one reply per operation
/// (the reference's outcome codes; a refused acquire replies the holder's expiry). A release
/// of a live lock publishes its key on the release channel.
pub(crate) static BATCH: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(concat!(
        include_str!("lua/batch.lua"),
        "return batch(KEYS, ARGV)\n"
    ))
});

/// `lua/batch.lua`: the batch as a local function, `batch(KEYS, ARGV)`, and its helpers.
const BATCH_CODE: &str = include_str!("lua/batch.lua");

/// The batch as a function library: `FUNCTION LOAD` code, and the name of the library and of
/// its one function (`syncguard_` and the start of the script's hash: a changed script is
/// another library). The function may reach keys of any slot its node serves
/// (`allow-cross-slot-keys`: a node call of a Redis Cluster, see `lua/batch.lua`).
pub(crate) struct BatchLibrary {
    pub(crate) name: String,
    pub(crate) code: String,
}

impl BatchLibrary {
    pub(crate) fn new() -> Self {
        let name = format!("syncguard_{}", &BATCH.script.get_hash()[..16]);
        let code = format!(
            "#!lua name={name}\n{BATCH_CODE}redis.register_function{{function_name='{name}', \
             callback=batch, flags={{'allow-cross-slot-keys'}}}}\n"
        );
        Self { name, code }
    }
}
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
