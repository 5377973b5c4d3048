//! The signing keys of JWTs: a JSON Web Key Set fetched from `JWT_JWKS` (or from the
//! `jwks_uri` of the issuer's OpenID discovery document) and cached.
//!
//! A slow or failing key server must not hold up tokens the cached keys verify, so:
//!
//! - the cache's lock is only taken to read or swap the set, never across a fetch;
//! - at most one fetch runs at a time, in a task of its own, and requests that need its
//!   result (no set yet, or a key id the set lacks) join it rather than start another;
//! - a set older than the cache time is refreshed in the background: tokens are verified
//!   with it meanwhile, and after a failed refresh too;
//! - a fetch starts only when the minimum refresh interval has passed since the previous one
//!   *ended*, so made-up key ids cannot make the server hammer the key server, however slow
//!   it answers: a token naming a key id the set lacks then waits for no fetch and is
//!   refused at once (a fetch within the interval would find the same set).
//!
//! So a token the cached set verifies never waits for the key server; a token naming a key id
//! the set lacks (a rotated key, or a made-up one) waits alone, and only for a fetch the
//! interval allows; and every token waits for the first set.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use tokio::sync::watch;

use super::candidates::candidates;
use super::fetch::{FETCH_TIMEOUT, JsonFetcher};

/// The longest a request waits for a fetch: the discovery document and the set, each within
/// [`FETCH_TIMEOUT`], and a margin. A backstop: the fetch ends by itself before.
const LONGEST_WAIT: Duration = FETCH_TIMEOUT
    .saturating_mul(2)
    .saturating_add(Duration::from_secs(1));

/// Where the keys come from.
#[derive(Debug, Clone)]
pub(crate) enum KeySource {
    /// A JWKS URL.
    Jwks(String),
    /// An issuer whose discovery document names the JWKS.
    Issuer(String),
}

/// Why no key could verify a token.
#[derive(Debug)]
pub(crate) enum KeyError {
    /// The key set has no usable key for the token (unknown key id, unsupported algorithm).
    NoKey(String),
    /// The key set could not be fetched and none is cached.
    Unavailable(String),
}

/// What the cache knows; behind a lock that is never held across an `await`.
#[derive(Default)]
struct State {
    keys: Option<Arc<JwkSet>>,
    /// When `keys` were fetched.
    fetched_at: Option<Instant>,
    /// Whether a fetch is running.
    fetching: bool,
    /// When the last fetch ended, whatever its outcome: the start of the refresh interval.
    last_ended: Option<Instant>,
    /// Why the last fetch failed, while no later one succeeded.
    last_error: Option<String>,
    /// How many fetches have ended; published to waiters through [`Shared::ended`].
    ended_count: u64,
    /// The JWKS URL, once discovered (or as configured).
    jwks_uri: Option<String>,
}

/// What the cache and its fetch task share.
struct Shared {
    source: KeySource,
    fetcher: JsonFetcher,
    cache_ttl: Duration,
    min_refresh: Duration,
    state: Mutex<State>,
    /// The number of ended fetches, for requests waiting for one.
    ended: watch::Sender<u64>,
}

/// The cached key set.
pub(crate) struct Jwks {
    shared: Arc<Shared>,
}

#[derive(Deserialize)]
struct Discovery {
    issuer: Option<String>,
    jwks_uri: String,
}

impl Jwks {
    pub(crate) fn new(
        source: KeySource,
        fetcher: JsonFetcher,
        cache_ttl: Duration,
        min_refresh: Duration,
    ) -> Self {
        let jwks_uri = match &source {
            KeySource::Jwks(url) => Some(url.clone()),
            KeySource::Issuer(_) => None,
        };
        Self {
            shared: Arc::new(Shared {
                source,
                fetcher,
                cache_ttl,
                min_refresh,
                state: Mutex::new(State {
                    jwks_uri,
                    ..State::default()
                }),
                ended: watch::Sender::new(0),
            }),
        }
    }

    /// The keys that may have signed a token with `kid` and `alg`. Answers from the cached
    /// set when it has them (starting a refresh in the background when the set is old);
    /// otherwise waits for a fetch, when one runs or may start.
    pub(crate) async fn keys_for(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<Vec<DecodingKey>, KeyError> {
        let awaited = {
            let mut state = self.shared.lock();
            if let Some(keys) = state.keys.as_deref().map(|set| candidates(set, kid, alg))
                && !keys.is_empty()
            {
                let stale = state
                    .fetched_at
                    .is_none_or(|at| at.elapsed() >= self.shared.cache_ttl);
                if stale {
                    Shared::join_or_start_fetch(&self.shared, &mut state);
                }
                return Ok(keys);
            }
            match Shared::join_or_start_fetch(&self.shared, &mut state) {
                Some(awaited) => awaited,
                None => return Err(no_keys(&state, kid, alg)),
            }
        };
        self.shared.wait_for_fetch(awaited).await;
        let state = self.shared.lock();
        match state.keys.as_deref().map(|set| candidates(set, kid, alg)) {
            Some(keys) if !keys.is_empty() => Ok(keys),
            _ => Err(no_keys(&state, kid, alg)),
        }
    }
}

/// Why a token has no key: the set lacks it, or there is no set.
fn no_keys(state: &State, kid: Option<&str>, alg: Algorithm) -> KeyError {
    if state.keys.is_none() {
        return KeyError::Unavailable(state.last_error.clone().unwrap_or_else(|| {
            "the token signing keys have not been fetched yet, and the last fetch was too recent to try again".to_owned()
        }));
    }
    KeyError::NoKey(match kid {
        Some(kid) => format!("no {alg:?} key with id '{kid}' in the key set"),
        None => format!("no {alg:?} key in the key set"),
    })
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent after every statement: a panic elsewhere cannot break it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The fetch count to wait for: the running fetch's, or a new one's when the refresh
    /// interval allows one (spawned here); `None` when neither.
    fn join_or_start_fetch(shared: &Arc<Self>, state: &mut State) -> Option<u64> {
        let awaited = state.ended_count + 1;
        if state.fetching {
            return Some(awaited);
        }
        if state
            .last_ended
            .is_some_and(|at| at.elapsed() < shared.min_refresh)
        {
            tracing::debug!(
                min_refresh = ?shared.min_refresh,
                "not fetching the JWKS: the last fetch ended within the minimum refresh interval"
            );
            return None;
        }
        state.fetching = true;
        let fetch = FetchTask {
            shared: Arc::clone(shared),
            outcome: None,
        };
        let jwks_uri = state.jwks_uri.clone();
        tokio::spawn(fetch.run(jwks_uri));
        Some(awaited)
    }

    /// Waits until `awaited` fetches have ended (bounded by [`LONGEST_WAIT`]).
    async fn wait_for_fetch(&self, awaited: u64) {
        let mut ended = self.ended.subscribe();
        let wait = ended.wait_for(|&count| count >= awaited);
        if tokio::time::timeout(LONGEST_WAIT, wait).await.is_err() {
            tracing::warn!(
                ?LONGEST_WAIT,
                "a JWKS fetch took longer than it may; answering without it"
            );
        }
    }

    /// Records the outcome of a fetch and wakes the requests waiting for it.
    fn end_fetch(&self, outcome: Result<(JwkSet, String), String>) {
        let mut state = self.lock();
        match outcome {
            Ok((set, jwks_uri)) => {
                tracing::debug!(keys = set.keys.len(), jwks_uri, "fetched the JWKS");
                state.keys = Some(Arc::new(set));
                state.fetched_at = Some(Instant::now());
                state.jwks_uri = Some(jwks_uri);
                state.last_error = None;
            }
            Err(error) => {
                if state.keys.is_some() {
                    tracing::warn!(
                        error,
                        "fetching the JWKS failed; using the keys fetched before"
                    );
                } else {
                    tracing::warn!(error, "fetching the JWKS failed");
                }
                state.last_error = Some(error);
            }
        }
        state.fetching = false;
        state.last_ended = Some(Instant::now());
        state.ended_count += 1;
        // Under the state lock, so that a request that saw `fetching` waits for this count.
        self.ended.send_replace(state.ended_count);
    }

    /// The key set and the URL it came from.
    async fn fetch(&self, jwks_uri: Option<String>) -> Result<(JwkSet, String), String> {
        let jwks_uri = match (jwks_uri, &self.source) {
            (Some(uri), _) => uri,
            (None, KeySource::Issuer(issuer)) => self.discover(issuer).await?,
            (None, KeySource::Jwks(url)) => url.clone(),
        };
        let set: JwkSet = self.fetcher.get(&jwks_uri).await?;
        Ok((set, jwks_uri))
    }

    /// The `jwks_uri` of `issuer`'s OpenID discovery document, whose `issuer` must be the
    /// configured one (as Spring Security checks).
    async fn discover(&self, issuer: &str) -> Result<String, String> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        let discovery: Discovery = self.fetcher.get(&url).await?;
        if let Some(found) = &discovery.issuer
            && found != issuer
        {
            return Err(format!(
                "the discovery document at {url} is for issuer `{found}`, not `{issuer}`"
            ));
        }
        Ok(discovery.jwks_uri)
    }
}

/// One fetch, in a task of its own so that no request's cancellation stops it. It ends the
/// fetch when dropped, so that a fetch abandoned half-way (its runtime shutting down) does
/// not leave the cache waiting for it forever.
struct FetchTask {
    shared: Arc<Shared>,
    outcome: Option<Result<(JwkSet, String), String>>,
}

impl FetchTask {
    async fn run(mut self, jwks_uri: Option<String>) {
        self.outcome = Some(self.shared.fetch(jwks_uri).await);
    }
}

impl Drop for FetchTask {
    fn drop(&mut self) {
        let outcome = self
            .outcome
            .take()
            .unwrap_or_else(|| Err("the JWKS fetch was abandoned".to_owned()));
        self.shared.end_fetch(outcome);
    }
}
