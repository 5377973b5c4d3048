//! The server's configuration: command-line flags, each with the environment variable LSC
//! reads (Spring Boot's relaxed binding of `server.port`, `authentication.disabled`,
//! `jwt.*`), plus ours (`SYNCGUARD_BACKEND_URL`, ...). A flag wins over its variable.
//!
//! Plain data: the modules that act on it ([`Auth`](crate::Auth),
//! [`open_backend`](crate::open_backend), [`run`](crate::run)) read it.

use std::net::IpAddr;
use std::time::Duration;

use clap::Parser;
use clap::builder::BoolishValueParser;

use crate::connections::{
    DEFAULT_BODY_READ_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_SHUTDOWN_TIMEOUT, ServeSettings,
};
use crate::trace::RequestLogLevel;

/// The default port, LSC's (Spring Boot's default, `EXPOSE 8080` in its image).
pub const DEFAULT_PORT: u16 = 8080;

/// How long a fetched JWKS is used before it is fetched again, by default (Spring Security's
/// default cache time: 5 minutes).
pub const DEFAULT_JWKS_CACHE: Duration = Duration::from_secs(300);

/// The least time between two fetches of the JWKS prompted by tokens signed with unknown
/// keys, by default: a flood of forged `kid`s cannot make the server hammer the key server.
pub const DEFAULT_JWKS_MIN_REFRESH: Duration = Duration::from_secs(30);

/// Everything `syncguard-server` is configured with.
///
/// ```
/// use clap::Parser;
/// use syncguard_server::ServerConfig;
///
/// let config = ServerConfig::try_parse_from(["syncguard-server", "--port", "9090"])?;
/// assert_eq!(config.port, 9090);
/// # Ok::<(), clap::Error>(())
/// ```
#[derive(Debug, Clone, Parser)]
#[command(
    name = "syncguard-server",
    version,
    about = "LockServiceCentral's REST lock API on syncguard's backends, with fencing tokens",
    // Without it, `--help` would print this type's doc comment, example included.
    long_about = None,
    after_help = "Each setting is a flag or the environment variable shown; a flag wins. Values \
                  from the environment are never shown here (some hold passwords or keys)."
)]
#[non_exhaustive]
pub struct ServerConfig {
    /// The port to listen on.
    #[arg(long, hide_env_values = true, env = "SERVER_PORT", default_value_t = DEFAULT_PORT)]
    pub port: u16,

    /// The address to listen on (all interfaces by default, as LSC).
    #[arg(
        long,
        hide_env_values = true,
        env = "SERVER_ADDRESS",
        default_value = "0.0.0.0"
    )]
    pub address: IpAddr,

    /// The lock backend: `memory:` (the default), `postgres://...`, `redis://...`,
    /// `rediss://...` or `firestore://<project>` (each needs the server's feature of that name).
    #[arg(
        long,
        hide_env_values = true,
        env = "SYNCGUARD_BACKEND_URL",
        default_value = "memory:"
    )]
    pub backend_url: String,

    /// On PostgreSQL, create the lock tables at startup if they are missing (needs the
    /// `CREATE` privilege; idempotent).
    #[arg(long, hide_env_values = true, env = "SYNCGUARD_SETUP_SCHEMA", default_value_t = true,
          value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub setup_schema: bool,

    /// On PostgreSQL, run on LockServiceCentral's own lock table of this name (LSC's
    /// `locker.postgres.tableName`, usually `locks`) instead of syncguard's tables, so that
    /// LSC processes and this server share the locks during a migration.
    #[arg(long, hide_env_values = true, env = "SYNCGUARD_LSC_TABLE")]
    pub lsc_table: Option<String>,

    /// With `SYNCGUARD_LSC_TABLE`: a trigger on LSC's table makes LSC's own acquisitions
    /// advance the fencing tokens too (installed at startup with the schema; needs the table's
    /// owner). `false` leaves LSC's table untouched, and fences then order this server's
    /// acquisitions only.
    #[arg(long, hide_env_values = true, env = "SYNCGUARD_LSC_FENCE_TRIGGER", default_value_t = true,
          value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub lsc_fence_trigger: bool,

    /// Accept every caller as owner `anonymous` (ignored when `JWT_JWKS` or `JWT_ISSUER` is
    /// set, as in LSC).
    #[arg(long, hide_env_values = true, env = "AUTHENTICATION_DISABLED", default_value_t = false,
          value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub authentication_disabled: bool,

    /// The issuer JWTs must carry in `iss`; alone, also where the keys are discovered
    /// (`<issuer>/.well-known/openid-configuration`).
    #[arg(long, hide_env_values = true, env = "JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// The URL of the JSON Web Key Set that signs the JWTs.
    #[arg(long, hide_env_values = true, env = "JWT_JWKS")]
    pub jwt_jwks: Option<String>,

    /// A value the JWTs' `aud` must contain.
    #[arg(long, hide_env_values = true, env = "JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// How long a fetched JWKS is used before it is fetched again, in seconds.
    #[arg(long, hide_env_values = true, env = "JWT_JWKS_CACHE_SECONDS", default_value_t = DEFAULT_JWKS_CACHE.as_secs())]
    pub jwt_jwks_cache_seconds: u64,

    /// The least time between two JWKS fetches prompted by an unknown key id, in seconds.
    #[arg(long, hide_env_values = true, env = "JWT_JWKS_MIN_REFRESH_SECONDS", default_value_t = DEFAULT_JWKS_MIN_REFRESH.as_secs())]
    pub jwt_jwks_min_refresh_seconds: u64,

    /// How long a graceful shutdown waits for requests in progress, in seconds (idle
    /// connections, and requests whose head has not all arrived, are closed at once).
    #[arg(long, hide_env_values = true, env = "SERVER_SHUTDOWN_TIMEOUT_SECONDS",
          default_value_t = DEFAULT_SHUTDOWN_TIMEOUT.as_secs())]
    pub shutdown_timeout_seconds: u64,

    /// How long a client may take to send a request's head (request line and headers), in
    /// seconds: from when its connection opened, or from the head's first byte on a
    /// kept-alive connection. Then the connection is closed.
    #[arg(long, hide_env_values = true, env = "SERVER_HEADER_READ_TIMEOUT_SECONDS",
          default_value_t = DEFAULT_HEADER_READ_TIMEOUT.as_secs(), value_parser = seconds())]
    pub header_read_timeout_seconds: u64,

    /// How long a client may take to send a request's body after its head, in seconds; then
    /// it is answered 408 and the connection closed.
    #[arg(long, hide_env_values = true, env = "SERVER_BODY_READ_TIMEOUT_SECONDS",
          default_value_t = DEFAULT_BODY_READ_TIMEOUT.as_secs(), value_parser = seconds())]
    pub body_read_timeout_seconds: u64,

    /// How long a kept-alive connection may wait for its next request (and a client may take
    /// to read an answer), in seconds; then it is closed.
    #[arg(long, hide_env_values = true, env = "SERVER_IDLE_TIMEOUT_SECONDS",
          default_value_t = DEFAULT_IDLE_TIMEOUT.as_secs(), value_parser = seconds())]
    pub idle_timeout_seconds: u64,

    /// The most connections served at once; more are answered 503 and closed. Default: the
    /// open-file limit less 128, at most 10000. A value the open-file limit cannot hold stops
    /// the start.
    #[arg(long, hide_env_values = true, env = "SERVER_MAX_CONNECTIONS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: Option<u64>,

    /// The level of the log line written per request (and of the request's span): `error`,
    /// `warn`, `info`, `debug`, `trace` or `off`. The filter (`RUST_LOG`) still decides what
    /// is written.
    #[arg(
        long,
        hide_env_values = true,
        env = "SERVER_REQUEST_LOG_LEVEL",
        default_value = "info"
    )]
    pub request_log_level: RequestLogLevel,

    /// Log lines as JSON objects (one per line) instead of text.
    #[arg(long, hide_env_values = true, env = "LOG_JSON", default_value_t = false,
          value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub log_json: bool,
}

impl ServerConfig {
    /// The configuration from the environment alone (no flags), as the binary sees it when
    /// started without arguments.
    ///
    /// # Errors
    /// A variable that does not parse (`SERVER_PORT=x`, `AUTHENTICATION_DISABLED=maybe`).
    pub fn from_env() -> Result<Self, clap::Error> {
        Self::try_parse_from(["syncguard-server"])
    }

    /// The backend part.
    pub fn backend_settings(&self) -> BackendSettings {
        BackendSettings {
            url: self.backend_url.clone(),
            setup_schema: self.setup_schema,
            lsc_table: non_blank(self.lsc_table.as_deref()),
            lsc_fence_trigger: self.lsc_fence_trigger,
        }
    }

    /// The connection part: timeouts, the connection limit and the shutdown drain.
    pub fn serve_settings(&self) -> ServeSettings {
        ServeSettings::new()
            .with_header_read_timeout(Duration::from_secs(self.header_read_timeout_seconds))
            .with_body_read_timeout(Duration::from_secs(self.body_read_timeout_seconds))
            .with_idle_timeout(Duration::from_secs(self.idle_timeout_seconds))
            .with_max_connections(
                self.max_connections
                    .map(|limit| usize::try_from(limit).unwrap_or(usize::MAX)),
            )
            .with_shutdown_timeout(Duration::from_secs(self.shutdown_timeout_seconds))
    }

    /// The authentication part.
    pub fn auth_settings(&self) -> AuthSettings {
        let jwt = JwtSettings {
            jwks: non_blank(self.jwt_jwks.as_deref()),
            issuer: non_blank(self.jwt_issuer.as_deref()),
            audience: non_blank(self.jwt_audience.as_deref()),
            cache_ttl: Duration::from_secs(self.jwt_jwks_cache_seconds),
            min_refresh: Duration::from_secs(self.jwt_jwks_min_refresh_seconds),
        };
        AuthSettings {
            disabled: self.authentication_disabled,
            jwt: (jwt.jwks.is_some() || jwt.issuer.is_some()).then_some(jwt),
        }
    }
}

/// Whole seconds, at least one: a timeout of zero would close every connection at once.
fn seconds() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..)
}

/// A configured value; blank counts as unset.
fn non_blank(value: Option<&str>) -> Option<String> {
    value
        .map(str::trim)
        .filter(|value| !value.is_empty())
        .map(str::to_owned)
}

/// Which backend the server runs on, and how it is prepared, before it is opened: see
/// [`open_backend`](crate::open_backend).
///
/// ```
/// use syncguard_server::BackendSettings;
///
/// let settings = BackendSettings::new("postgres://lock@db/locks").lsc_table("locks");
/// assert!(settings.setup_schema && settings.lsc_fence_trigger);
/// assert_eq!(settings.lsc_table.as_deref(), Some("locks"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendSettings {
    /// `SYNCGUARD_BACKEND_URL`.
    pub url: String,
    /// `SYNCGUARD_SETUP_SCHEMA`: on PostgreSQL, create what is missing at startup.
    pub setup_schema: bool,
    /// `SYNCGUARD_LSC_TABLE`: run on LockServiceCentral's own table of this name.
    pub lsc_table: Option<String>,
    /// `SYNCGUARD_LSC_FENCE_TRIGGER`: with `lsc_table`, LSC's acquisitions advance the fences.
    pub lsc_fence_trigger: bool,
}

impl BackendSettings {
    /// The backend `url` names, with the defaults: schema set up, no LSC table (and, with one,
    /// the fence trigger).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            setup_schema: true,
            lsc_table: None,
            lsc_fence_trigger: true,
        }
    }

    /// Whether to create what is missing at startup.
    #[must_use]
    pub fn setup_schema(mut self, setup_schema: bool) -> Self {
        self.setup_schema = setup_schema;
        self
    }

    /// Runs on LSC's own table `table`.
    #[must_use]
    pub fn lsc_table(mut self, table: impl Into<String>) -> Self {
        self.lsc_table = Some(table.into());
        self
    }

    /// Whether LSC's acquisitions advance the fences (a trigger on LSC's table).
    #[must_use]
    pub fn lsc_fence_trigger(mut self, lsc_fence_trigger: bool) -> Self {
        self.lsc_fence_trigger = lsc_fence_trigger;
        self
    }
}

/// How callers are authenticated, before it is acted on: see [`Auth`](crate::Auth).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuthSettings {
    /// `AUTHENTICATION_DISABLED`: every caller is `anonymous` (unless `jwt` is set).
    pub disabled: bool,
    /// JWT verification, when `JWT_JWKS` or `JWT_ISSUER` is set; it wins over `disabled`.
    pub jwt: Option<JwtSettings>,
}

impl AuthSettings {
    /// Authentication disabled: every caller is `anonymous`.
    pub fn disabled() -> Self {
        Self {
            disabled: true,
            jwt: None,
        }
    }

    /// JWTs verified as `jwt` says.
    pub fn jwt(jwt: JwtSettings) -> Self {
        Self {
            disabled: false,
            jwt: Some(jwt),
        }
    }
}

/// How JWTs are verified.
///
/// ```
/// use syncguard_server::JwtSettings;
///
/// let jwt = JwtSettings::from_jwks("https://idp.example/.well-known/jwks.json")
///     .issuer("https://idp.example/")
///     .audience("locks");
/// assert_eq!(jwt.audience.as_deref(), Some("locks"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JwtSettings {
    /// The JWKS URL (`JWT_JWKS`). Without it, the keys are found through the issuer's OpenID
    /// discovery document.
    pub jwks: Option<String>,
    /// The required `iss` (`JWT_ISSUER`).
    pub issuer: Option<String>,
    /// A value `aud` must contain (`JWT_AUDIENCE`).
    pub audience: Option<String>,
    /// How long fetched keys are used before they are fetched again.
    pub cache_ttl: Duration,
    /// The least time between two fetches prompted by an unknown key id.
    pub min_refresh: Duration,
}

impl JwtSettings {
    /// Keys from the JWKS at `url`.
    pub fn from_jwks(url: impl Into<String>) -> Self {
        Self {
            jwks: Some(url.into()),
            issuer: None,
            audience: None,
            cache_ttl: DEFAULT_JWKS_CACHE,
            min_refresh: DEFAULT_JWKS_MIN_REFRESH,
        }
    }

    /// Tokens of `issuer`, whose keys are found through its OpenID discovery document.
    pub fn from_issuer(issuer: impl Into<String>) -> Self {
        Self {
            jwks: None,
            issuer: Some(issuer.into()),
            audience: None,
            cache_ttl: DEFAULT_JWKS_CACHE,
            min_refresh: DEFAULT_JWKS_MIN_REFRESH,
        }
    }

    /// Requires `iss` to equal `issuer`.
    #[must_use]
    pub fn issuer(mut self, issuer: impl Into<String>) -> Self {
        self.issuer = Some(issuer.into());
        self
    }

    /// Requires `aud` to contain `audience`.
    #[must_use]
    pub fn audience(mut self, audience: impl Into<String>) -> Self {
        self.audience = Some(audience.into());
        self
    }

    /// Uses fetched keys for `ttl` before fetching them again.
    #[must_use]
    pub fn cache_ttl(mut self, ttl: Duration) -> Self {
        self.cache_ttl = ttl;
        self
    }

    /// Fetches the keys again for an unknown key id at most once per `interval`.
    #[must_use]
    pub fn min_refresh(mut self, interval: Duration) -> Self {
        self.min_refresh = interval;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> ServerConfig {
        let mut all = vec!["syncguard-server"];
        all.extend_from_slice(args);
        ServerConfig::try_parse_from(all).expect("the flags parse")
    }

    #[test]
    fn defaults() {
        let config = parse(&["--backend-url", "memory:"]);
        assert_eq!(config.port, DEFAULT_PORT);
        assert_eq!(config.backend_url, "memory:");
        assert!(config.setup_schema);
    }

    #[test]
    fn jwt_wins_over_disabled() {
        let config = parse(&[
            "--authentication-disabled",
            "true",
            "--jwt-jwks",
            "http://127.0.0.1:1/jwks",
        ]);
        let auth = config.auth_settings();
        assert!(auth.disabled);
        assert_eq!(
            auth.jwt.and_then(|jwt| jwt.jwks).as_deref(),
            Some("http://127.0.0.1:1/jwks")
        );
    }

    #[test]
    fn connection_settings_have_defaults_and_refuse_zero() {
        let serving = parse(&[]).serve_settings();
        assert_eq!(serving, ServeSettings::new());
        let serving =
            parse(&["--idle-timeout-seconds", "5", "--max-connections", "50"]).serve_settings();
        assert_eq!(serving.idle_timeout(), Duration::from_secs(5));
        assert_eq!(serving.max_connections(), Some(50));
        for flag in [
            "--header-read-timeout-seconds",
            "--body-read-timeout-seconds",
            "--idle-timeout-seconds",
            "--max-connections",
        ] {
            let error = ServerConfig::try_parse_from(["syncguard-server", flag, "0"]).unwrap_err();
            assert!(
                error.to_string().contains("0 is not in 1.."),
                "{flag}: {error}"
            );
        }
        let error =
            ServerConfig::try_parse_from(["syncguard-server", "--request-log-level", "loud"])
                .unwrap_err();
        assert!(
            error.to_string().contains("use error, warn, info"),
            "{error}"
        );
    }

    #[test]
    fn blank_jwt_settings_are_unset() {
        let config = parse(&["--jwt-issuer", "  ", "--authentication-disabled", "yes"]);
        assert_eq!(config.auth_settings(), AuthSettings::disabled());
    }
}
