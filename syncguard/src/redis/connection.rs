//! The connection a backend runs its scripts on: one multiplexed `ConnectionManager`, or a
//! deadpool-redis pool; script calls by EVALSHA, with the EVAL fallback after a NOSCRIPT.

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::{Arg, Cmd, ErrorKind, ServerErrorKind, Value};

use super::error::{self, map_pool_error, map_redis_error};
use super::scripts::{self, LuaScript};
use crate::LockError;

/// How a backend reaches Redis: the connection it was built with.
#[derive(Clone)]
pub(super) enum Conn {
    Manager(ConnectionManager),
    Pool(deadpool_redis::Pool),
}

/// Why a script call failed: the command, or (pool mode) getting a connection.
pub(super) enum ConnError {
    Redis(::redis::RedisError),
    Pool(deadpool_redis::PoolError),
}

impl ConnError {
    pub(super) fn into_lock_error(self) -> LockError {
        match self {
            ConnError::Redis(error) => map_redis_error(error),
            ConnError::Pool(error) => map_pool_error(error),
        }
    }

    /// [`into_lock_error`](Self::into_lock_error) for an error shared by several callers.
    pub(super) fn to_lock_error(&self) -> LockError {
        match self {
            ConnError::Redis(error) => map_redis_error(error.clone()),
            ConnError::Pool(error) => error::pool_error(error),
        }
    }
}

impl Conn {
    /// Runs one script command on a connection of this mode, reloading the script once on
    /// NOSCRIPT.
    pub(super) async fn eval(&self, lua: &LuaScript, cmd: &Cmd) -> Result<Value, ConnError> {
        match self {
            Conn::Manager(manager) => eval_on(&mut manager.clone(), lua, cmd).await,
            Conn::Pool(pool) => {
                let mut pooled = pool.get().await.map_err(ConnError::Pool)?;
                eval_on(&mut pooled, lua, cmd).await
            }
        }
        .map_err(ConnError::Redis)
    }
}

/// `EVALSHA <sha> <nkeys>`, with room for the keys and arguments that follow.
pub(super) fn evalsha(lua: &LuaScript, keys: usize, args: usize, data_bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + keys + args, data_bytes + 64);
    cmd.arg("EVALSHA").arg(lua.script.get_hash()).arg(keys);
    cmd
}

async fn eval_on<C: ConnectionLike>(
    conn: &mut C,
    lua: &LuaScript,
    cmd: &Cmd,
) -> Result<Value, ::redis::RedisError> {
    match cmd.query_async::<Value>(conn).await {
        Ok(value) => Ok(value),
        Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            // The script cache was emptied (SCRIPT FLUSH, restart, failover): send the same
            // call once as EVAL, which runs the script and caches it again in one round trip.
            let args = cmd.args_iter().skip(2);
            let mut eval = Cmd::with_capacity(args.len() + 2, lua.code.len() + 256);
            eval.arg("EVAL").arg(lua.code);
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

pub(super) async fn load_all<C: ConnectionLike>(conn: &mut C) -> Result<(), LockError> {
    for lua in scripts::all() {
        lua.script.load_async(conn).await.map_err(map_redis_error)?;
    }
    Ok(())
}

/// Makes *ring* rustls' process-wide default provider unless one is installed: redis-rs
/// builds its TLS configuration with that default, and panics when there is none, as there is
/// whenever the build holds two providers (rustls then picks neither).
#[cfg(feature = "redis-tls")]
pub(super) fn install_crypto_provider() {
    // An error only says that a default (the application's, or ours) is already in place.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
