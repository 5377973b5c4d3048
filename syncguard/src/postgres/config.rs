//! Configuration of the PostgreSQL backend, and the schema it needs.

use std::time::Duration;

use crate::error::LockError;
use crate::timeouts::check_timeouts;

/// Every setting of a [`PostgresBackend`](super::PostgresBackend) but where it connects: what
/// [`PostgresBackend::connect_with`](super::PostgresBackend::connect_with) (beside the URL) and
/// [`PostgresBackend::new`](super::PostgresBackend::new) (beside your pool) take.
///
/// Set with `with_*`, read with the bare name. Checked when the backend is made, before any
/// I/O: names (the release channel's included) must be plain SQL identifiers
/// (`[A-Za-z_][A-Za-z0-9_]*`), the lock table at most 40 bytes (its name prefixes the names of
/// the indexes and functions the backend installs), the others at most 63, and the two tables
/// must differ; timeouts must be at least 1 ms. Anything else, injection attempts included, is
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) naming the setting, and nothing is made.
///
/// # Default
/// | setting | default |
/// |---|---|
/// | [`lock_table`](Self::with_lock_table) | `syncguard_locks` |
/// | [`fence_table`](Self::with_fence_table) | `syncguard_fence_counters` |
/// | [`schema`](Self::with_schema) | none: the connection's `search_path` decides |
/// | [`cleanup_in_is_locked`](Self::with_cleanup_in_is_locked) | `false` |
/// | [`release_notifications`](Self::with_release_notifications) | `true` |
/// | [`release_channel`](Self::with_release_channel) | `<lock table>_released`, prefixed with `<schema>_` when a schema is set and the name fits in 63 bytes |
/// | [`connect_timeout`](Self::with_connect_timeout) | 2 s |
/// | [`operation_timeout`](Self::with_operation_timeout) | 2 s |
/// | [`max_connections`](Self::with_max_connections) | 10 (only for the pool `connect_with` opens) |
///
/// The timeouts fail fast: a lock service that takes half a minute to say the database is
/// down holds up every caller.
///
/// ```
/// use std::time::Duration;
/// use syncguard::postgres::PostgresConfig;
///
/// let config = PostgresConfig::new()
///     .with_schema("locking")
///     .with_lock_table("app_locks")
///     .with_fence_table("app_fence_counters")
///     .with_operation_timeout(Duration::from_secs(3));
/// assert!(config.validate().is_ok());
/// assert_eq!(config.operation_timeout(), Duration::from_secs(3));
/// assert!(PostgresConfig::new().with_lock_table("locks; DROP TABLE users").validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresConfig {
    lock_table: String,
    fence_table: String,
    schema: Option<String>,
    cleanup_in_is_locked: bool,
    release_notifications: bool,
    release_channel: Option<String>,
    connect_timeout: Duration,
    operation_timeout: Duration,
    /// Only for the pool `connect_with` opens: `None` unless set, so that `new` can tell.
    max_connections: Option<u32>,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// Longest lock table name: leaves room for the `_lock_id`/`_expires` index and
/// `_acquire`/`_clear_holder` function suffixes within PostgreSQL's 63-byte identifier limit.
const MAX_LOCK_TABLE_LEN: usize = 40;
const MAX_IDENTIFIER_LEN: usize = 63;
/// sqlx's default pool size, the size of the pool `connect_with` opens unless set.
const DEFAULT_MAX_CONNECTIONS: u32 = 10;

impl PostgresConfig {
    /// The default configuration (see the table above).
    pub fn new() -> Self {
        Self {
            lock_table: "syncguard_locks".to_owned(),
            fence_table: "syncguard_fence_counters".to_owned(),
            schema: None,
            cleanup_in_is_locked: false,
            release_notifications: true,
            release_channel: None,
            connect_timeout: Duration::from_secs(2),
            operation_timeout: Duration::from_secs(2),
            max_connections: None,
        }
    }

    /// The table holding live locks.
    #[must_use]
    pub fn with_lock_table(mut self, name: impl Into<String>) -> Self {
        self.lock_table = name.into();
        self
    }

    /// The table holding fence counters (never deleted from).
    #[must_use]
    pub fn with_fence_table(mut self, name: impl Into<String>) -> Self {
        self.fence_table = name.into();
        self
    }

    /// The schema both tables (and the backend's functions) live in.
    #[must_use]
    pub fn with_schema(mut self, name: impl Into<String>) -> Self {
        self.schema = Some(name.into());
        self
    }

    /// Whether `is_locked` deletes the expired lock row it finds, in the background, once it
    /// is more than 2 s past the tolerance (so it can never race an extend). Off by default:
    /// `is_locked` is then a pure read. Fence counters are never deleted.
    #[must_use]
    pub const fn with_cleanup_in_is_locked(mut self, enabled: bool) -> Self {
        self.cleanup_in_is_locked = enabled;
        self
    }

    /// Whether this backend announces releases and listens for them (on by default; see
    /// [waiting](super#waiting)); the same switch as the Redis backend's
    /// `RedisConfig::with_release_notifications` (feature `redis`).
    ///
    /// On, a release of a live lock that an acquire was refused during also runs
    /// `pg_notify(<release channel>, <key>)`, and the backend opens one listening connection
    /// once something waits, so that its waiters wake when the lock is released. Off, this
    /// backend neither announces releases nor listens for them: its waiters poll, at the retry
    /// policy's delays and at the holder's lease end, and its releases wake nobody (other
    /// processes' waiters poll for them too). Turn it off behind a connection proxy that cannot
    /// carry `LISTEN` (PgBouncer's transaction pooling), or where the cost of notifying contended
    /// releases matters more than waking on release (see [waiting](super#waiting)).
    ///
    /// ```
    /// use syncguard::postgres::PostgresConfig;
    ///
    /// assert!(PostgresConfig::new().release_notifications());
    /// let polling = PostgresConfig::new().with_release_notifications(false);
    /// assert!(!polling.release_notifications());
    /// ```
    #[must_use]
    pub const fn with_release_notifications(mut self, enabled: bool) -> Self {
        self.release_notifications = enabled;
        self
    }

    /// The channel releases are announced on (a plain SQL identifier of at most 63 bytes).
    /// Every backend sharing the tables should use the same one: a release announced on a
    /// channel nobody listens to wakes nobody, and waiters then poll. The default is derived
    /// from the table names (see the table above); two configurations sharing a channel only
    /// cost each other's waiters an attempt now and then, when a key of one is released while
    /// the same key of the other is held.
    #[must_use]
    pub fn with_release_channel(mut self, name: impl Into<String>) -> Self {
        self.release_channel = Some(name.into());
        self
    }

    /// How long opening a connection may take (TCP, TLS and authentication): the first
    /// connection of [`connect_with`](super::PostgresBackend::connect_with) (which it bounds),
    /// the fresh connection an operation is retried on after its own was found dead (within
    /// the operation timeout as well), and the waiters' listening connection. A refused
    /// connection (no server on that port) is reported at once as
    /// [`ErrorCode::ServiceUnavailable`](crate::ErrorCode::ServiceUnavailable), not after this.
    ///
    /// ```
    /// use std::time::Duration;
    /// use syncguard::postgres::PostgresConfig;
    ///
    /// let config = PostgresConfig::new().with_connect_timeout(Duration::from_secs(5));
    /// assert_eq!(config.connect_timeout(), Duration::from_secs(5));
    /// ```
    #[must_use]
    pub const fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one lock operation may take, end to end: waiting for a pooled connection
    /// (opening one included), the statement, and its one retry on a fresh connection when the
    /// first was found dead. Past it, [`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout) (or
    /// [`ErrorCode::RateLimited`](crate::ErrorCode::RateLimited) when every pooled connection stayed busy), and a connection
    /// whose statement was cut is closed rather than reused (its state is unknown). It also
    /// bounds the listening connection's `LISTEN` and its checks.
    ///
    /// ```
    /// use std::time::Duration;
    /// use syncguard::postgres::PostgresConfig;
    ///
    /// let config = PostgresConfig::new().with_operation_timeout(Duration::from_millis(500));
    /// assert_eq!(config.operation_timeout(), Duration::from_millis(500));
    /// ```
    #[must_use]
    pub const fn with_operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// The most connections the pool that
    /// [`connect_with`](super::PostgresBackend::connect_with) opens may hold (default 10, as
    /// sqlx's). Only for that pool: [`PostgresBackend::new`](super::PostgresBackend::new) runs
    /// on your pool, sized by you (`PgPoolOptions::max_connections`), and refuses a
    /// configuration that sets it. At least 1.
    ///
    /// ```
    /// use syncguard::postgres::PostgresConfig;
    ///
    /// assert_eq!(PostgresConfig::new().max_connections(), 10);
    /// assert_eq!(PostgresConfig::new().with_max_connections(32).max_connections(), 32);
    /// ```
    #[must_use]
    pub const fn with_max_connections(mut self, max: u32) -> Self {
        self.max_connections = Some(max);
        self
    }

    /// How long opening a connection may take.
    pub const fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// How long one lock operation may take, end to end.
    pub const fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// The most connections the pool `connect_with` opens may hold.
    pub const fn max_connections(&self) -> u32 {
        match self.max_connections {
            Some(max) => max,
            None => DEFAULT_MAX_CONNECTIONS,
        }
    }

    /// The first setting of `self` that only a pool syncguard opens can apply, if one is set:
    /// what [`PostgresBackend::new`](super::PostgresBackend::new) refuses.
    pub(super) fn connect_only_setting(&self) -> Option<&'static str> {
        self.max_connections.map(|_| "with_max_connections")
    }

    /// The lock table name.
    pub fn lock_table(&self) -> &str {
        &self.lock_table
    }

    /// The fence table name.
    pub fn fence_table(&self) -> &str {
        &self.fence_table
    }

    /// The schema, if set.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// Whether `is_locked` cleans up expired rows.
    pub const fn cleanup_in_is_locked(&self) -> bool {
        self.cleanup_in_is_locked
    }

    /// Whether this backend announces releases and listens for them (see
    /// [`with_release_notifications`](Self::with_release_notifications)).
    pub const fn release_notifications(&self) -> bool {
        self.release_notifications
    }

    /// The channel releases are announced on: the one set, or the one derived from the table
    /// names.
    ///
    /// ```
    /// use syncguard::postgres::PostgresConfig;
    ///
    /// assert_eq!(PostgresConfig::new().release_channel(), "syncguard_locks_released");
    /// let config = PostgresConfig::new().with_schema("billing").with_lock_table("locks");
    /// assert_eq!(config.release_channel(), "billing_locks_released");
    /// ```
    pub fn release_channel(&self) -> String {
        if let Some(channel) = &self.release_channel {
            return channel.clone();
        }
        let unqualified = format!("{}_released", self.lock_table);
        match &self.schema {
            Some(schema) if schema.len() + 1 + unqualified.len() <= MAX_IDENTIFIER_LEN => {
                format!("{schema}_{unqualified}")
            }
            _ => unqualified,
        }
    }

    /// Checks the names and the timeouts.
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) saying which name or
    /// timeout is wrong and what is accepted.
    pub fn validate(&self) -> Result<(), LockError> {
        check_timeouts(
            "PostgresConfig",
            &[
                ("with_connect_timeout", self.connect_timeout),
                ("with_operation_timeout", self.operation_timeout),
            ],
        )?;
        if self.max_connections == Some(0) {
            return Err(LockError::invalid_argument(
                "PostgresConfig::with_max_connections must be at least 1, got 0",
            ));
        }
        check_identifier("lock table", &self.lock_table, MAX_LOCK_TABLE_LEN)?;
        check_identifier("fence table", &self.fence_table, MAX_IDENTIFIER_LEN)?;
        if let Some(schema) = &self.schema {
            check_identifier("schema", schema, MAX_IDENTIFIER_LEN)?;
        }
        if let Some(channel) = &self.release_channel {
            check_identifier("release channel", channel, MAX_IDENTIFIER_LEN)?;
        }
        if self.lock_table == self.fence_table {
            return Err(LockError::invalid_argument(
                "the fence table must differ from the lock table (cleanup of locks must never reach fence counters)",
            ));
        }
        Ok(())
    }

    /// The DDL that creates the tables, indexes and functions for this configuration; what
    /// [`setup_schema`](super::setup_schema) runs. For the default names it is the bundled
    /// `schema.sql` ([`SCHEMA_SQL`](super::SCHEMA_SQL)), for migrations.
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    pub fn schema_sql(&self) -> Result<String, LockError> {
        self.validate()?;
        let names = Names::new(self);
        let mut sql = String::new();
        if let Some(schema) = &self.schema {
            sql.push_str(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\";\n\n"));
        }
        sql.push_str(
            &SCHEMA_TEMPLATE
                .replace("{locks}", &names.locks)
                .replace("{fences}", &names.fences)
                .replace("{acquire}", &names.acquire)
                .replace("{clear_holder}", &names.clear_holder)
                .replace("{idx_lock_id}", &names.index("lock_id"))
                .replace("{idx_expires}", &names.index("expires")),
        );
        Ok(sql)
    }
}

fn check_identifier(what: &str, name: &str, max_len: usize) -> Result<(), LockError> {
    let mut chars = name.chars();
    let well_formed = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !well_formed {
        return Err(LockError::invalid_argument(format!(
            "{what} name {name:?} is not a plain SQL identifier: use letters, digits and '_', not starting with a digit"
        )));
    }
    if name.len() > max_len {
        return Err(LockError::invalid_argument(format!(
            "{what} name {name:?} is {} bytes; at most {max_len} are accepted",
            name.len()
        )));
    }
    Ok(())
}

/// Quoted, schema-qualified names of everything the backend touches.
#[derive(Debug, Clone)]
pub(super) struct Names {
    pub(super) locks: String,
    pub(super) fences: String,
    pub(super) acquire: String,
    /// The trigger function that clears the holder of a row given another lock id.
    pub(super) clear_holder: String,
    lock_table: String,
}

impl Names {
    pub(super) fn new(config: &PostgresConfig) -> Self {
        let qualify = |name: &str| match &config.schema {
            Some(schema) => format!("\"{schema}\".\"{name}\""),
            None => format!("\"{name}\""),
        };
        Self {
            locks: qualify(&config.lock_table),
            fences: qualify(&config.fence_table),
            acquire: qualify(&format!("{}_acquire", config.lock_table)),
            clear_holder: qualify(&format!("{}_clear_holder", config.lock_table)),
            lock_table: config.lock_table.clone(),
        }
    }

    /// Index names are never schema-qualified in `CREATE INDEX`: an index lives in its table's
    /// schema.
    fn index(&self, suffix: &str) -> String {
        format!("\"idx_{}_{suffix}\"", self.lock_table)
    }
}

/// The schema for the configured names. Tables and columns are the reference design's, so
/// TypeScript SyncGuard services can share them; the function is this library's one-round-trip
/// acquire (TypeScript services do not need it).
const SCHEMA_TEMPLATE: &str = include_str!("schema.template.sql");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_render_the_bundled_schema() {
        let sql = PostgresConfig::new().schema_sql().unwrap();
        assert_eq!(sql, super::super::SCHEMA_SQL);
    }

    #[test]
    fn bad_names_are_rejected() {
        for bad in [
            "",
            "1locks",
            "locks;drop",
            "locks\"",
            "lö",
            "a b",
            "x\u{0}",
            "public.locks",
        ] {
            let err = PostgresConfig::new()
                .with_lock_table(bad)
                .validate()
                .unwrap_err();
            assert_eq!(err.code(), crate::ErrorCode::InvalidArgument, "{bad:?}");
            assert!(
                PostgresConfig::new()
                    .with_fence_table(bad)
                    .validate()
                    .is_err()
            );
            assert!(PostgresConfig::new().with_schema(bad).validate().is_err());
            assert!(
                PostgresConfig::new()
                    .with_release_channel(bad)
                    .validate()
                    .is_err()
            );
        }
        let long = "l".repeat(41);
        assert!(
            PostgresConfig::new()
                .with_lock_table(&long)
                .validate()
                .is_err()
        );
        assert!(
            PostgresConfig::new()
                .with_lock_table("same")
                .with_fence_table("same")
                .validate()
                .is_err()
        );
    }

    #[test]
    fn timeouts_must_be_positive_and_any_length_is_accepted() {
        let zero = Duration::ZERO;
        for config in [
            PostgresConfig::new().with_connect_timeout(zero),
            PostgresConfig::new().with_operation_timeout(Duration::from_micros(999)),
        ] {
            let error = config.validate().unwrap_err();
            assert!(error.to_string().contains("_timeout"), "{error}");
        }
        let error = PostgresConfig::new()
            .with_max_connections(0)
            .validate()
            .unwrap_err();
        assert!(
            error.to_string().contains("with_max_connections"),
            "{error}"
        );
        let patient = PostgresConfig::new()
            .with_connect_timeout(Duration::MAX)
            .with_operation_timeout(Duration::MAX);
        assert!(patient.validate().is_ok());
    }

    #[test]
    fn the_release_channel_is_derived_from_the_names_within_the_identifier_limit() {
        let channel = |config: PostgresConfig| {
            assert!(config.validate().is_ok());
            config.release_channel()
        };
        assert_eq!(
            channel(PostgresConfig::new().with_lock_table("Locks")),
            "Locks_released"
        );
        assert_eq!(
            channel(PostgresConfig::new().with_schema("s1")),
            "s1_syncguard_locks_released"
        );
        // A schema that would take the name past 63 bytes is left out.
        let long_table = "l".repeat(40);
        let long = channel(
            PostgresConfig::new()
                .with_schema("s".repeat(63))
                .with_lock_table(&long_table),
        );
        assert_eq!(long, format!("{long_table}_released"));
        assert_eq!(
            channel(PostgresConfig::new().with_release_channel("my_channel")),
            "my_channel"
        );
        // Every derived name is a valid channel.
        for config in [
            PostgresConfig::new()
                .with_schema("s".repeat(63))
                .with_lock_table(&long_table),
            PostgresConfig::new()
                .with_schema("s".repeat(13))
                .with_lock_table(&long_table),
        ] {
            let derived = config.release_channel();
            assert!(derived.len() <= MAX_IDENTIFIER_LEN, "{derived}");
            assert!(config.with_release_channel(derived).validate().is_ok());
        }
    }

    #[test]
    fn custom_names_are_quoted_and_qualified() {
        let sql = PostgresConfig::new()
            .with_schema("s1")
            .with_lock_table("Locks")
            .with_fence_table("fences")
            .schema_sql()
            .unwrap();
        assert!(sql.contains("CREATE SCHEMA IF NOT EXISTS \"s1\""));
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"s1\".\"Locks\""));
        assert!(sql.contains("\"s1\".\"fences\""));
        assert!(sql.contains("FUNCTION \"s1\".\"Locks_acquire\""));
        assert!(sql.contains("FUNCTION \"s1\".\"Locks_clear_holder\""));
        assert!(sql.contains("'\"s1\".\"Locks\"'::regclass"));
        assert!(!sql.contains("syncguard_locks"));
    }
}
