//! LockServiceCentral's REST lock service on syncguard's backends, with fencing tokens.
//!
//! `syncguard-server` answers [LockServiceCentral](https://github.com/UnitVectorY-Labs/LockServiceCentral)'s
//! HTTP API (LSC: acquire, renew, release and status of named locks, owners from JWTs, an
//! instance id per client, leases in seconds) on any syncguard backend that stores lock
//! holders, so that services in any language share locks with Rust services, and an LSC
//! deployment can be replaced without touching its clients. Every answer that shows a held
//! lock also carries the lock's **fencing token** in a `Fencing-Token` header.
//!
//! # Run it
//!
//! ```text
//! AUTHENTICATION_DISABLED=true cargo run -p syncguard-server
//! ```
//!
//! It listens on port 8080 with the in-memory backend. Without `AUTHENTICATION_DISABLED=true`
//! or a JWT configuration every `/v1` call is refused (403), as LSC does.
//!
//! ```text
//! $ curl -i -X POST localhost:8080/v1/billing/lock/nightly-export/acquire \
//!        -d '{"instanceId":"worker-1","leaseDuration":60}'
//! HTTP/1.1 200 OK
//! content-type: application/json
//! fencing-token: 000000000000001
//!
//! {"success":true,"namespace":"billing","lockName":"nightly-export","owner":"anonymous","instanceId":"worker-1","leaseDuration":60,"expiry":1767225660}
//!
//! $ curl -i localhost:8080/v1/billing/lock/nightly-export
//! HTTP/1.1 200 OK
//! fencing-token: 000000000000001
//!
//! {"namespace":"billing","lockName":"nightly-export","owner":"anonymous","expiry":1767225660}
//!
//! $ curl -i -X POST localhost:8080/v1/billing/lock/nightly-export/acquire \
//!        -d '{"instanceId":"worker-2","leaseDuration":60}'
//! HTTP/1.1 423 Locked
//!
//! {"success":false,"namespace":"billing","lockName":"nightly-export"}
//!
//! $ curl -X POST localhost:8080/v1/billing/lock/nightly-export/renew \
//!        -d '{"instanceId":"worker-1","leaseDuration":60}'
//! {"success":true,"namespace":"billing","lockName":"nightly-export","owner":"anonymous","instanceId":"worker-1","leaseDuration":120,"expiry":1767225720}
//!
//! $ curl -X POST localhost:8080/v1/billing/lock/nightly-export/release \
//!        -d '{"instanceId":"worker-1"}'
//! {"success":true,"namespace":"billing","lockName":"nightly-export"}
//! ```
//!
//! With JWTs, add `-H "Authorization: Bearer $TOKEN"`; the owner is then the token's `sub`.
//!
//! # The API
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/{namespace}/lock/{lockName}` | 200 `{"namespace","lockName"}` when free; with `owner` and `expiry` when held |
//! | `POST /v1/{namespace}/lock/{lockName}/acquire` `{"instanceId","leaseDuration"}` | 200 the lock (`success`, `owner`, `instanceId`, `leaseDuration`, `expiry`), or 423 `{"success":false,...}` |
//! | `POST .../renew` `{"instanceId","leaseDuration"}` | 200 the lock with `expiry` and `leaseDuration` increased by the duration, or 423 |
//! | `POST .../release` `{"instanceId"}` | 200 `{"success":true,"namespace","lockName"}`, or 423 |
//! | `GET /openapi.yaml` | the OpenAPI description ([`OPENAPI_YAML`]); `/` and `/index.html` show it in Swagger UI |
//! | `GET /health` | liveness: 200 `{"status":"UP"}` |
//! | `GET /ready`, `GET /actuator/health` | readiness: 200 `{"status":"UP"}` when the backend answers, else 503 `{"status":"DOWN"}`; also 503 (with a `reason`) while the connection limit is reached |
//!
//! As in LSC: `namespace` and `lockName` are 3 to 64 characters of `[a-zA-Z0-9_-]`; bodies
//! are read as JSON whatever their Content-Type, with no other properties allowed, an
//! `instanceId` like the names and a `leaseDuration` of 1 to 86400 whole seconds. Times are
//! epoch seconds; `expiry` is the last second the lock is held in (inclusive). The lock's
//! holder is the pair (owner, instanceId): the same pair may acquire its live lock again (the
//! lease restarts at now + D, `leaseDuration` is reset), renew adds D to the current expiry
//! and to the total, and releasing a missing or expired lock succeeds. Another pair's live
//! lock is a 423 for every mutation.
//!
//! Errors, as LSC words them: 400 `{"message":"Validation failed","details":["Parameter
//! 'lockName' failed validation: Lock name must be between 3 and 64 characters long"]}` for a
//! path parameter; 400 `{"message":"JSON validation failed","details":["$: required property
//! 'instanceId' not found"]}` for a body (networknt's wording, as LSC's validator gives it);
//! 404 `{"message":"Resource not found","errorId":"<uuid>"}`; 405 `{"message":"Method not
//! allowed","errorId":"<uuid>"}`; 500 `{"message":"Internal server error","errorId":"<uuid>"}`.
//! Checks run in LSC's order: authentication, route, method, body, path parameters, so a
//! request with a bad body and a bad path reports the body; bad input never touches a lock.
//!
//! # Fencing tokens
//!
//! Every answer that shows a held lock (acquire and renew 200, GET of a held lock) carries
//! `Fencing-Token: 000000000000042` ([`FENCING_TOKEN`]): 15 decimal digits, strictly increasing
//! per lock across holders, releases, expiry and restarts of persistent backends; the same
//! while one holder keeps the lock (re-acquires and renews). Refusals, releases and free
//! locks carry none. The JSON bodies are LSC's, so LSC clients keep working; a client that
//! passes the token to the resource the lock protects (which refuses tokens smaller than one
//! it has seen) is safe against a holder that stalled past its lease.
//!
//! # Configuration
//!
//! Each setting is a flag and an environment variable (LSC's names where LSC has the
//! setting); a flag wins over its variable. `syncguard-server --help` lists them (without the
//! values it found in the environment, which may hold passwords).
//!
//! | variable | flag | default | |
//! |---|---|---|---|
//! | `SERVER_PORT` | `--port` | 8080 | |
//! | `SERVER_ADDRESS` | `--address` | `0.0.0.0` | |
//! | `SYNCGUARD_BACKEND_URL` | `--backend-url` | `memory:` | the backend (below) |
//! | `SYNCGUARD_SETUP_SCHEMA` | `--setup-schema` | `true` | PostgreSQL: create the lock tables at startup |
//! | `SYNCGUARD_LSC_TABLE` | `--lsc-table` | | PostgreSQL: run on LSC's own table of this name (below) |
//! | `SYNCGUARD_LSC_FENCE_TRIGGER` | `--lsc-fence-trigger` | `true` | with `SYNCGUARD_LSC_TABLE`: LSC's own acquisitions advance the fencing tokens (a trigger on LSC's table, below) |
//! | `AUTHENTICATION_DISABLED` | `--authentication-disabled` | `false` | every caller is owner `anonymous` |
//! | `JWT_JWKS` | `--jwt-jwks` | | the JWKS URL of the token signing keys |
//! | `JWT_ISSUER` | `--jwt-issuer` | | required `iss`; alone, the keys come from `<issuer>/.well-known/openid-configuration` |
//! | `JWT_AUDIENCE` | `--jwt-audience` | | a value `aud` must contain |
//! | `JWT_JWKS_CACHE_SECONDS` | `--jwt-jwks-cache-seconds` | 300 | how long fetched keys are used |
//! | `JWT_JWKS_MIN_REFRESH_SECONDS` | `--jwt-jwks-min-refresh-seconds` | 30 | least time between fetches prompted by an unknown key id |
//! | `SERVER_HEADER_READ_TIMEOUT_SECONDS` | `--header-read-timeout-seconds` | 10 | a request's head must arrive within this, from the connection's start or the head's first byte; else the connection is closed |
//! | `SERVER_BODY_READ_TIMEOUT_SECONDS` | `--body-read-timeout-seconds` | 10 | a request's body must arrive within this of its head; else 408 and the connection is closed |
//! | `SERVER_IDLE_TIMEOUT_SECONDS` | `--idle-timeout-seconds` | 75 | how long a kept-alive connection waits for its next request (and a client may take to read an answer) |
//! | `SERVER_MAX_CONNECTIONS` | `--max-connections` | open-file limit − 128, at most 10000 | connections served at once; more are answered 503 and closed |
//! | `SERVER_SHUTDOWN_TIMEOUT_SECONDS` | `--shutdown-timeout-seconds` | 30 | how long a shutdown waits for requests in progress |
//! | `SERVER_REQUEST_LOG_LEVEL` | `--request-log-level` | `info` | the level of the request log line (`error` ... `trace`, `off`) |
//! | `LOG_JSON` | `--log-json` | `false` | JSON log lines; `RUST_LOG` sets the filter (default `info,opentelemetry=warn`) |
//!
//! Boolean values accept `true`/`false`, `yes`/`no`, `on`/`off`, `1`/`0`; blank JWT settings
//! count as unset. Timeouts are whole seconds, at least 1.
//!
//! ## Authentication
//!
//! As in LSC: when `JWT_JWKS` or `JWT_ISSUER` is set, `/v1` calls need a bearer JWT (this
//! wins even over `AUTHENTICATION_DISABLED=true`), signed by a key of the JWKS (fetched over
//! HTTP or HTTPS, cached, fetched again when stale or when a token names an unknown key id,
//! at most once per minimum refresh interval), with `exp` and `nbf` (when present) valid
//! within 60 s of clock skew, `iss` equal to `JWT_ISSUER` when set, `aud` containing
//! `JWT_AUDIENCE` when set; the owner is `sub`. A missing or invalid token is a 401 with
//! `WWW-Authenticate: Bearer ...` and no body. `AUTHENTICATION_DISABLED=true` alone makes
//! every caller `anonymous` (the instanceId is then the only credential). With neither, every
//! `/v1` call is refused with 403. Paths outside `/v1` are never authenticated.
//!
//! ## Backends
//!
//! | `SYNCGUARD_BACKEND_URL` | backend | server feature |
//! |---|---|---|
//! | unset, `memory:` | in-process memory (one process; lost on restart) | always |
//! | `postgres://...` | PostgreSQL | `postgres` (`postgres-tls` for TLS) |
//! | `redis://...`, `rediss://...` | Redis | `redis` (`redis-tls` for `rediss://`) |
//! | `firestore://<project>` | Firestore (Application Default Credentials, or the emulator of `FIRESTORE_EMULATOR_HOST`) | `firestore` |
//!
//! The server stores each lock's holder (owner and instanceId) with the lock, through
//! [`LockBackend::acquire_as`](syncguard::backend::LockBackend::acquire_as), so several server
//! processes on one PostgreSQL, Redis or Firestore serve the same locks. It refuses to start
//! on a backend whose `capabilities().holders` is false, saying so (all of syncguard's
//! backends store holders; a backend of your own may not). The feature `opentelemetry` adds
//! syncguard's OpenTelemetry spans and metrics of the backend calls, exported over OTLP as the
//! standard `OTEL_*` variables say (see `otel`, and the README's OpenTelemetry section).
//!
//! ## LSC's PostgreSQL table (migrations)
//!
//! `SYNCGUARD_LSC_TABLE=locks` with a `postgres://` `SYNCGUARD_BACKEND_URL` (feature
//! `postgres`) runs the server on LockServiceCentral's own table (`LscTableBackend`),
//! with LSC's schema and LSC's statement shapes, so that `syncguard-server` processes and LSC
//! processes serve the same locks while clients move over. The name must match
//! `^[a-zA-Z_][a-zA-Z0-9_]*$` and leave room for the two tables of ours beside it:
//! `<table>_fences` (the fence counters, never deleted from, since LSC deletes its rows) and
//! `<table>_syncguard` (lock id → row). At startup (unless `SYNCGUARD_SETUP_SCHEMA=false`)
//! those are created if missing, and LSC's table too, with LSC's documented DDL, if it is
//! missing; an existing LSC table keeps its columns. Every decision uses the database clock,
//! in whole seconds as LSC stores them. A lock LSC took shows its owner and is refused to
//! other holders; a lock the server took is refused by LSC's acquire to other holders and
//! released by LSC's release of its holder.
//!
//! Fencing tokens strictly increase across LSC's holders and the server's: the server
//! installs (with the schema) a trigger on LSC's table, `syncguard_fence`, that bumps the
//! counter whenever one of LSC's statements starts a new hold (a new row, a new
//! owner/instance id, or a holder retaking its expired row); the server's own acquire bumps
//! the counter in its statement and tells the trigger to leave it. Creating a trigger needs
//! the table's owner. `SYNCGUARD_LSC_FENCE_TRIGGER=false` leaves LSC's table untouched, and
//! tokens then order the server's acquisitions only (a server acquisition after an LSC
//! holder may repeat the token that holder was shown). With the trigger wanted and
//! `SYNCGUARD_SETUP_SCHEMA=false`, the server refuses to start on a table without it.
//!
//! # Operations
//!
//! **Protocol**: HTTP/1.1 (and 1.0) only, in every build, whatever features are on: an
//! HTTP/2 client (prior knowledge or an `h2c` upgrade) gets HTTP/1.1.
//!
//! **Connections** ([`ServeSettings`]): a request head is due within the header read timeout
//! (from the connection's start, or from the head's first byte), its body within the body
//! read timeout of the head (else `408 {"message":"Request body not received in time",...}`
//! and the connection closes), the next request on a kept-alive connection within the idle
//! timeout. At most `SERVER_MAX_CONNECTIONS` are open at once, below the process's open-file
//! limit: a connection over it is answered `503 {"message":"Too many connections; try again
//! shortly"}` with `Retry-After: 1` and closed at once, a warning is logged when the limit is
//! reached, and `/ready` answers `503 {"status":"DOWN","reason":"connection limit reached:
//! ..."}` meanwhile.
//!
//! **Logs**: each request runs in a `syncguard_server.request` span (`request_id`) and ends
//! with one log line of target `syncguard_server::request` at `SERVER_REQUEST_LOG_LEVEL`
//! (default `info`; `off` costs nothing per request), modelled on LSC's canonical log
//! (`request_id` from `X-Request-Id` or generated, `http_method`, `http_route`, or
//! `http_target` when no route matches, `http_status_code`, `outcome`, `duration_ms`,
//! `lock_operation`, `lock_namespace`, `lock_name`, `lock_service_outcome` such as `ACQUIRED`
//! or `RELEASE_CONFLICT`, `lock_result`, `instance_id_hash` (SHA-256; the instanceId itself is
//! never logged), `requested_lease_duration_sec`, `computed_expiry_epoch_sec`); values a
//! client chooses freely are cut to 128 characters.
//!
//! **Shutdown**: on SIGTERM or Ctrl-C the server stops accepting connections, closes those
//! with no request in progress (idle, or a head still arriving) at once, finishes the
//! requests in progress (up to the shutdown timeout), then calls `syncguard::shutdown`.
//!
//! The README's "Running it for real" has a container recipe, a systemd unit and the probes
//! for Kubernetes.
//!
//! # As a library
//!
//! [`router`] gives the whole application as an axum [`Router`](axum::Router) on a backend
//! of your choice; [`serve`] runs one with the connection timeouts and limit of
//! [`ServeSettings`] and a graceful shutdown; [`run`] is the binary.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use syncguard::MemoryBackend;
//! use syncguard_server::{Auth, ServeSettings, router, serve, shutdown_signal};
//!
//! # #[tokio::main] async fn main() -> Result<(), syncguard_server::StartupError> {
//! let app = router(Arc::new(MemoryBackend::new()), Auth::disabled())?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
//! let settings = ServeSettings::new().with_shutdown_timeout(Duration::from_secs(20));
//! serve(listener, app, shutdown_signal(), settings).await
//! # }
//! ```
//!
//! # Differences from LockServiceCentral
//!
//! Deliberate, each where LSC's behaviour is a bug or a gap (its specification's quirks):
//!
//! - **Malformed JSON is a 400**, not a 500 (LSC's Q10): a body that is not JSON, or empty,
//!   is answered `{"message":"JSON validation failed","details":["$: the request body is not
//!   valid JSON: ..."]}`.
//! - **A JWT without `sub` is refused** with 401 (LSC's Q7: a token without `sub` had a null
//!   owner that matched any owner's lock). So is an empty `sub`, and one too long to store
//!   (the stored holder is at most 1024 bytes: a `sub` of more than about 930 bytes).
//! - **Backend failures are 503** `{"message":"Lock backend unavailable","errorId":"<uuid>"}`
//!   (LSC's Q4: 423, indistinguishable from contention, for a failed mutation, and "free" for
//!   a failed GET). The `errorId` is logged with the error.
//! - **The `Fencing-Token` header** is new; bodies are unchanged.
//! - **Unconfigured authentication** is a 403 with this server's error shape
//!   `{"message":"Access denied: authentication is not configured ...","errorId":"<uuid>"}`
//!   (LSC: Spring Boot's default error JSON). A 401 carries an RFC 6750 `error_description`
//!   saying why the token was refused; its body is empty, as LSC's.
//! - **Unreachable token keys are a 503** `Token signing keys unavailable` (Spring: 401), since
//!   the token may well be valid. Keys fetched before keep serving while the key server fails.
//! - **Signature algorithms**: RS256 as LSC, and the other asymmetric algorithms (RS384, RS512,
//!   PS256-PS512, ES256, ES384, EdDSA) when the JWKS has a key for them; never HS* or `none`.
//! - **Bodies over 64 KiB are a 413** `Request body too large` (LSC reads any size).
//! - **A 405 carries `Allow`**, as HTTP requires (LSC's handler adds none).
//! - **`instanceId` is matched exactly**: LSC's JSON Schema validator (Java's regex `find`) lets
//!   `^[a-zA-Z0-9_-]+$` match `"abc\n"`; here a trailing newline fails the pattern.
//!   `"leaseDuration": 60.0` is accepted as 60 (JSON Schema draft-06 and later count it an
//!   integer; LSC's behaviour is not known).
//! - **Lease length**: `expiry` is LSC's (`floor(now) + D` on acquire, `+ D` per renew), but the
//!   lock is held until the backend's expiry (`now + D` in milliseconds) plus syncguard's 1 s
//!   liveness tolerance, i.e. up to 1 s longer than LSC's `floor(now) + D + 1`, never shorter.
//!   In that last part a GET still shows the lock, with an `expiry` of the second before. All
//!   times are the backend's (the server's clock on memory).
//! - **Locks taken by other syncguard clients** (without a holder) show as held with an `expiry`
//!   and no `owner`; every mutation through the API gets 423.
//! - **`/actuator/health` checks the backend**, as `/ready` does (503 `DOWN` when it fails);
//!   LSC's memory deployment always answered `UP`.
//! - **Path parameters are percent-decoded** before validation, so `my%20lock` fails the pattern
//!   with LSC's message (Spring's firewall answered some encoded characters, such as `%2F`,
//!   with its own 400).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod auth;
mod backend;
mod config;
mod connections;
mod error;
mod holder;
mod locks;
#[cfg(feature = "postgres")]
mod lsc_table;
mod openapi;
mod ops;
#[cfg(feature = "opentelemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
pub mod otel;
mod responses;
mod router;
mod routes;
mod server;
mod shutdown;
mod startup;
mod trace;
mod validation;

pub use auth::{ANONYMOUS, Auth};
pub use backend::{BackendUrl, open_backend, require_holders};
pub use config::{
    AuthSettings, BackendSettings, DEFAULT_JWKS_CACHE, DEFAULT_JWKS_MIN_REFRESH, DEFAULT_PORT,
    JwtSettings, ServerConfig,
};
pub use connections::{
    DEFAULT_BODY_READ_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_SHUTDOWN_TIMEOUT, ServeSettings,
};
#[cfg(feature = "postgres")]
pub use lsc_table::{LscTableBackend, validate_table_name};
pub use openapi::OPENAPI_YAML;
pub use responses::FENCING_TOKEN;
pub use router::{router, router_with_request_log};
pub use server::{run, serve};
pub use shutdown::shutdown_signal;
pub use startup::StartupError;
pub use trace::{InvalidRequestLogLevel, RequestLogLevel};
