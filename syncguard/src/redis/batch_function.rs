//! How the batch reaches the server: as a Redis function (Redis 7 and later), or as a script.
//!
//! As a function library, `lua/batch.lua` is loaded once per server and its helpers are
//! defined once; by EVALSHA, the script defines them again on every call (on a lone
//! acquire+release cycle, about 3.5 µs of the server's time per cycle; see BENCHMARKS.md). A
//! backend calls the function (`FCALL`), loading its library when the server does not have
//! it, and goes by EVALSHA from then on when the server cannot take functions (Redis 6, other
//! servers without them) or its user may not (`NOPERM`). A call refused for lack of memory
//! goes by EVALSHA alone: a function is refused whole over `maxmemory`, where the script still
//! runs what frees memory (a release) and refuses only what would add to it.
//!
//! The library's name is derived from the script's hash, so backends of different syncguard
//! versions on one server each call their own.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use ::redis::aio::ConnectionLike;
use ::redis::{Arg, Cmd, RedisError, Value};

use super::scripts::{self, BATCH, BatchLibrary};

/// The batch library: its name (also the function's) and its code.
static LIBRARY: LazyLock<BatchLibrary> = LazyLock::new(BatchLibrary::new);

/// Whether one backend calls the batch as a function, or as a script since it learned that
/// its server or user cannot have the function.
#[derive(Default)]
pub(crate) struct BatchFunction {
    scripts_only: AtomicBool,
}

impl BatchFunction {
    /// The start of a batch call (`FCALL <function> <nkeys>`, or `EVALSHA <sha> <nkeys>`),
    /// with room for the keys and arguments that follow.
    pub(super) fn command(&self, keys: usize, args: usize, data_bytes: usize) -> Cmd {
        if self.scripts_only.load(Ordering::Relaxed) {
            return BATCH.evalsha(keys, args, data_bytes);
        }
        scripts::call("FCALL", &LIBRARY.name, keys, args, data_bytes)
    }

    /// Runs a batch call made by [`command`](Self::command). Every error this handles was a
    /// refusal of the whole call before it ran, so that sending it again runs it once.
    pub(super) async fn run<C: ConnectionLike>(
        &self,
        conn: &mut C,
        cmd: &Cmd,
    ) -> Result<Value, RedisError> {
        if !is_fcall(cmd) {
            return BATCH.run_on(conn, cmd).await;
        }
        let error = match cmd.query_async::<Value>(conn).await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        if is_function_not_found(&error) {
            // A server that never had the library, or lost it (FUNCTION FLUSH, a failover to
            // a replica that was not sent it): load it, then call again.
            match load_on(conn).await {
                Ok(()) => return cmd.query_async::<Value>(conn).await,
                Err(error) if is_load_refused(&error) => self.use_scripts(),
                Err(error) if is_out_of_memory(&error) => {}
                Err(error) => return Err(error),
            }
        } else if is_unavailable(&error) {
            self.use_scripts();
        } else if !is_out_of_memory(&error) {
            return Err(error);
        }
        BATCH.run_on(conn, &as_evalsha(cmd)).await
    }

    /// Loads the library on the server up front, or learns that the batch goes by EVALSHA.
    /// A user who may not load the library may still call it, when someone else loaded it:
    /// its first call finds out.
    pub(super) async fn load<C: ConnectionLike>(&self, conn: &mut C) -> Result<(), RedisError> {
        match load_on(conn).await {
            Err(error) if error.code() == Some("NOPERM") => Ok(()),
            Err(error) if is_load_refused(&error) => {
                self.use_scripts();
                Ok(())
            }
            loaded => loaded,
        }
    }

    fn use_scripts(&self) {
        self.scripts_only.store(true, Ordering::Relaxed);
    }
}

/// `FUNCTION LOAD` of the library; a library of that name already there is the same code.
async fn load_on<C: ConnectionLike>(conn: &mut C) -> Result<(), RedisError> {
    let loaded = ::redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(LIBRARY.code.as_str())
        .query_async::<Value>(conn)
        .await;
    match loaded {
        Err(error)
            if error
                .detail()
                .is_some_and(|detail| detail.contains("already exists")) =>
        {
            Ok(())
        }
        loaded => loaded.map(drop),
    }
}

fn is_fcall(cmd: &Cmd) -> bool {
    matches!(cmd.args_iter().next(), Some(Arg::Simple(b"FCALL")))
}

/// The same call as `EVALSHA <sha>`: the function's keys and arguments are the script's.
fn as_evalsha(cmd: &Cmd) -> Cmd {
    let args = cmd.args_iter().skip(2);
    let mut evalsha = Cmd::with_capacity(args.len() + 2, 256);
    evalsha.arg("EVALSHA").arg(BATCH.script.get_hash());
    for arg in args {
        if let Arg::Simple(bytes) = arg {
            evalsha.arg(bytes);
        }
    }
    evalsha
}

fn is_function_not_found(error: &RedisError) -> bool {
    error.code() == Some("ERR")
        && error
            .detail()
            .is_some_and(|detail| detail.starts_with("Function not found"))
}

/// The server has no functions (`unknown command`), or the user may not load or call them.
fn is_unavailable(error: &RedisError) -> bool {
    match error.code() {
        Some("NOPERM") => true,
        Some("ERR") => error.detail().is_some_and(|detail| {
            let detail = detail.to_ascii_lowercase();
            detail.starts_with("unknown command") || detail.starts_with("unknown subcommand")
        }),
        _ => false,
    }
}

/// `FUNCTION LOAD` refused for good: not permitted, or any `ERR` (no such command, a server
/// whose functions differ). It ran nothing, so the batch can go by EVALSHA instead; a
/// passing state (`LOADING`, `READONLY`, `OOM`, I/O) is not a refusal.
fn is_load_refused(error: &RedisError) -> bool {
    matches!(error.code(), Some("NOPERM" | "ERR"))
}

fn is_out_of_memory(error: &RedisError) -> bool {
    error.code() == Some("OOM")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str, detail: &str) -> RedisError {
        ::redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
    }

    #[test]
    fn classifies_the_refusals_it_can_get_past() {
        assert!(is_function_not_found(&server("ERR", "Function not found")));
        assert!(!is_function_not_found(&server(
            "ERR",
            "unknown command 'FCALL'"
        )));
        assert!(is_unavailable(&server(
            "ERR",
            "unknown command 'FCALL', with args beginning with: "
        )));
        assert!(is_unavailable(&server(
            "NOPERM",
            "User app has no permissions to run the 'fcall' command"
        )));
        assert!(!is_unavailable(&server("ERR", "Error running script")));
        assert!(!is_unavailable(&server("READONLY", "You can't write")));
        assert!(is_out_of_memory(&server("OOM", "command not allowed")));
        assert!(is_load_refused(&server("ERR", "Engine 'lua' not found")));
        assert!(!is_load_refused(&server("LOADING", "Redis is loading")));
    }

    #[test]
    fn an_fcall_becomes_the_same_evalsha() {
        let function = BatchFunction::default();
        let mut cmd = function.command(1, 2, 16);
        cmd.arg("lk").arg("x").arg(7);
        assert!(is_fcall(&cmd));
        let evalsha = as_evalsha(&cmd);
        let args: Vec<_> = evalsha
            .args_iter()
            .map(|arg| match arg {
                Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            })
            .collect();
        assert_eq!(
            args,
            ["EVALSHA", BATCH.script.get_hash(), "1", "lk", "x", "7"]
        );
        function.use_scripts();
        assert!(!is_fcall(&function.command(1, 2, 16)));
    }
}
