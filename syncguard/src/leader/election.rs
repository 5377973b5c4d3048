//! An election: its settings (name, candidate, ttl, how a campaign waits) and the campaign.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::acquire::{acquire_as, share};
use crate::backend::LockBackend;
use crate::backend::key::normalize_key;
use crate::error::LockError;
use crate::far_future::FAR_FUTURE;
use crate::lock_id::LockId;
use crate::options::{LockOptions, OnLost};
use crate::retry::{Backoff, RetryPolicy};

use super::Leadership;
use super::holder;
use super::identity::{check_identity, default_identity};

/// The default ttl of a leader's lock: 15 seconds. A leader that crashes without resigning is
/// replaced about this long (plus the stores' 1 s clock tolerance) after its last heartbeat;
/// the heartbeat extends the lock every third of it.
pub const DEFAULT_LEADER_TTL: Duration = Duration::from_secs(15);

/// What the lock key of an election starts with: the election `name` locks `leader:{name}`.
///
/// ```
/// use syncguard::MemoryBackend;
/// use syncguard::leader::{Election, KEY_PREFIX};
///
/// let election = Election::new(&MemoryBackend::new(), "billing")?;
/// assert_eq!(election.key(), format!("{KEY_PREFIX}billing"));
/// # Ok::<(), syncguard::LockError>(())
/// ```
pub const KEY_PREFIX: &str = "leader:";

/// Leader election among the processes that share a backend: one candidate at a time leads an
/// election, identified by its name.
///
/// Each process makes an `Election` (the name, its candidate's identity, the ttl), then
/// [`campaign`](Self::campaign)s for leadership, or hands its work to
/// [`run_while_leader`](Self::run_while_leader); anyone can
/// [`observe`](Self::observe) who leads, or ask [`leader`](Self::leader) once. Cloning it is
/// cheap: clones are the same candidate's settings, and every campaign is a candidate of its
/// own.
///
/// The election locks the key `leader:{name}` ([`KEY_PREFIX`]) with
/// [`LockBackend::acquire_as`](crate::backend::LockBackend::acquire_as), so it needs a backend
/// that stores holders (every built-in backend does). See the [module
/// documentation](super) for the guarantees and what is stored.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use std::time::Duration;
/// use syncguard::MemoryBackend;
/// use syncguard::leader::Election;
///
/// let backend = MemoryBackend::new();
/// let election = Election::builder(&backend, "billing-cron")
///     .identity("web-1")
///     .ttl(Duration::from_secs(10))
///     .build()?;
/// assert_eq!(election.key(), "leader:billing-cron");
///
/// let leadership = election.campaign().await?;
/// assert_eq!(leadership.identity(), "web-1");
/// assert_eq!(election.leader().await?.map(|leader| leader.term), Some(leadership.term()));
/// leadership.resign().await?;
/// assert_eq!(election.leader().await?, None);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    settings: Arc<Settings>,
}

struct Settings {
    backend: Arc<dyn LockBackend>,
    name: String,
    key: String,
    identity: Arc<str>,
    options: LockOptions,
    observe_every: Duration,
}

/// Builds an [`Election`]; made with [`Election::builder`]. The values are checked once, in
/// [`build`](Self::build).
///
/// # Default
/// | setting | default |
/// |---|---|
/// | [`identity`](Self::identity) | `host:pid`: the host name from `HOSTNAME`, else the kernel's (`/proc/sys/kernel/hostname`, `/etc/hostname`), else `COMPUTERNAME`, else `localhost`; and the process id |
/// | [`ttl`](Self::ttl) | 15 s ([`DEFAULT_LEADER_TTL`]) |
/// | [`retry`](Self::retry) | a campaign waits for ever: woken when the leader resigns (on backends that announce releases) or its lease ends, and polling every eighth to quarter of the ttl (a fixed quarter, equal jitter) |
/// | [`on_lost`](Self::on_lost) | [`OnLost::Cancel`]: a lost leadership cancels the work of [`Leadership::run`] and [`Election::run_while_leader`] |
/// | [`observe_every`](Self::observe_every) | a quarter of the ttl |
/// | [`show_key`](Self::show_key) | off: errors, logs and spans show the key's hash only |
///
/// ```
/// use std::time::Duration;
/// use syncguard::leader::Election;
/// use syncguard::{MemoryBackend, RetryPolicy};
///
/// let backend = MemoryBackend::new();
/// let election = Election::builder(&backend, "indexer")
///     .identity("indexer-7f9c")
///     .ttl(Duration::from_secs(5))
///     .retry(RetryPolicy::wait_for(Duration::from_secs(60))) // give up campaigning after a minute
///     .observe_every(Duration::from_millis(500))
///     .build()?;
/// assert_eq!(election.ttl(), Duration::from_secs(5));
///
/// // Names make keys: an empty one is refused, as is a candidate without identity.
/// assert!(Election::builder(&backend, "").build().is_err());
/// assert!(Election::builder(&backend, "indexer").identity("").build().is_err());
/// # Ok::<(), syncguard::LockError>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct ElectionBuilder {
    backend: Arc<dyn LockBackend>,
    name: String,
    identity: Option<String>,
    ttl: Duration,
    retry: Option<RetryPolicy>,
    on_lost: OnLost,
    observe_every: Option<Duration>,
    show_key: bool,
}

impl Election {
    /// An election with the default settings (see [`ElectionBuilder`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::MemoryBackend;
    /// use syncguard::leader::Election;
    ///
    /// let election = Election::new(&MemoryBackend::new(), "reports")?;
    /// assert!(election.identity().ends_with(&format!(":{}", std::process::id())));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`ElectionBuilder::build`].
    pub fn new<B>(backend: &B, name: &str) -> Result<Self, LockError>
    where
        B: LockBackend + Clone + 'static,
    {
        Self::builder(backend, name).build()
    }

    /// A builder for the election `name` on `backend`, with the defaults.
    pub fn builder<B>(backend: &B, name: &str) -> ElectionBuilder
    where
        B: LockBackend + Clone + 'static,
    {
        ElectionBuilder {
            backend: share(backend),
            name: name.to_owned(),
            identity: None,
            ttl: DEFAULT_LEADER_TTL,
            retry: None,
            on_lost: OnLost::Cancel,
            observe_every: None,
            show_key: false,
        }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// The lock key: `leader:{name}` (NFC-normalized).
    pub fn key(&self) -> &str {
        &self.settings.key
    }

    /// The identity this election's campaigns show observers.
    pub fn identity(&self) -> &str {
        &self.settings.identity
    }

    /// The ttl of the leader's lock.
    pub fn ttl(&self) -> Duration {
        self.settings.options.ttl()
    }

    /// The options a campaign takes the lock with (ttl, waiting, what a loss does).
    pub fn options(&self) -> &LockOptions {
        &self.settings.options
    }

    /// How often observers read who leads, besides when a release is announced.
    pub fn observe_every(&self) -> Duration {
        self.settings.observe_every
    }

    pub(super) fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.settings.backend
    }

    /// Waits until this candidate leads, and returns its [`Leadership`]: the lock on
    /// [`key`](Self::key), kept by the heartbeat until it is resigned, dropped or lost.
    ///
    /// The wait is that of the election's [`retry`](ElectionBuilder::retry) policy: by
    /// default for ever, woken at once when the leader resigns (on backends that announce
    /// releases, as every built-in one but Firestore does), when its lease ends (it crashed),
    /// and at least every quarter of the ttl. Candidates that share a backend instance take
    /// turns in the order they began to wait. Each call is a campaign of its own (a fresh
    /// nonce in the holder), so two campaigns never lead at once, even with the same
    /// identity.
    ///
    /// Dropping the future gives the campaign up. Must be called within a tokio runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::MemoryBackend;
    /// use syncguard::leader::Election;
    ///
    /// let backend = MemoryBackend::new();
    /// let first = Election::builder(&backend, "cron").identity("a").build()?;
    /// let second = Election::builder(&backend, "cron").identity("b").build()?;
    ///
    /// let leading = first.campaign().await?;
    /// let waiting = tokio::spawn(async move { second.campaign().await });
    /// tokio::task::yield_now().await;
    /// let term = leading.term();
    /// leading.resign().await?; // the waiting candidate is woken at once
    /// let next = waiting.await.unwrap()?;
    /// assert_eq!(next.identity(), "b");
    /// assert!(next.term() > term);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ErrorCode::AcquisitionTimeout`](crate::ErrorCode::AcquisitionTimeout) when a
    /// [`retry`](ElectionBuilder::retry) policy with
    /// a timeout gave up; backend errors as they come (they are not retried here:
    /// [`run_while_leader`](Self::run_while_leader) retries them).
    pub async fn campaign(&self) -> Result<Leadership, LockError> {
        match self.campaign_until(None).await? {
            Some(leadership) => Ok(leadership),
            None => unreachable!("a campaign without a stop token ends leading or failed"),
        }
    }

    /// [`campaign`](Self::campaign), which also ends (with `None`) once `stop` is cancelled:
    /// an attempt under way is finished first, and the leadership it won is returned, for the
    /// caller to resign.
    pub(crate) async fn campaign_until(
        &self,
        stop: Option<&CancellationToken>,
    ) -> Result<Option<Leadership>, LockError> {
        let settings = &self.settings;
        let nonce = LockId::generate();
        let holder = holder::encode(&settings.identity, nonce.as_str());
        let guard = acquire_as(
            Arc::clone(&settings.backend),
            &settings.key,
            &holder,
            &settings.options,
            stop,
        )
        .await?;
        Ok(guard.map(|guard| Leadership::new(guard, Arc::clone(&settings.identity))))
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.settings.name)
            .field("identity", &self.settings.identity)
            .field("ttl", &self.ttl())
            .field("backend", &self.settings.backend.capabilities().backend)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for ElectionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElectionBuilder")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl ElectionBuilder {
    /// What observers are shown as the leader while this candidate leads: 1 to
    /// [`MAX_IDENTITY_BYTES`](super::MAX_IDENTITY_BYTES) bytes of printable text (no control
    /// characters), such as a pod name or `host:port`. It need not be unique: each campaign
    /// adds a nonce of its own to what it stores.
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// The ttl of the leader's lock (1 ms to 365 days): how long after its last heartbeat a
    /// crashed leader is replaced (plus the stores' 1 s clock tolerance). The heartbeat
    /// extends the lock every third of it, so each leader costs the backend one write per
    /// third of the ttl.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How a [`campaign`](Election::campaign) waits, for example
    /// [`RetryPolicy::wait_for`] to give up after a while
    /// ([`ErrorCode::AcquisitionTimeout`](crate::ErrorCode::AcquisitionTimeout)), or
    /// [`RetryPolicy::single_attempt`] to lead only if
    /// nobody does ([`ErrorCode::Contended`](crate::ErrorCode::Contended)). By default it waits for
    /// ever (see the table).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = Some(retry);
        self
    }

    /// What a lost leadership does to the work run with [`Leadership::run`] and
    /// [`Election::run_while_leader`]: cancel it at once (the default), or let it run on and
    /// watch [`lost`](crate::LockHandle::lost) itself (`run_while_leader` then campaigns again
    /// only once the work has returned).
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }

    /// How often an [`observe`](Election::observe)r reads who leads, besides when a release
    /// is announced: the longest it takes to notice a leader that crashed and its successor
    /// (by default a quarter of the ttl). Each observer reads the lock once per interval.
    pub fn observe_every(mut self, every: Duration) -> Self {
        self.observe_every = Some(every);
        self
    }

    /// Show the raw key in errors, log lines and the leader's `syncguard.hold` span.
    pub fn show_key(mut self, show_key: bool) -> Self {
        self.show_key = show_key;
        self
    }

    /// The election, once its values are checked.
    ///
    /// # Errors
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for an empty name or one
    /// whose key (`leader:{name}`)
    /// is not a valid lock key (over 512 bytes, a NUL character), an invalid identity, a ttl
    /// out of range, a zero `observe_every`, or a backend that does not store holders.
    pub fn build(self) -> Result<Election, LockError> {
        if self.name.is_empty() {
            return Err(LockError::invalid_argument(
                "the election name is empty; give a name such as \"billing-cron\", which locks `leader:billing-cron`",
            ));
        }
        let key = format!("{KEY_PREFIX}{}", self.name);
        let key = match normalize_key(&key) {
            Ok(key) => key.into_owned(),
            Err(error) => {
                return Err(LockError::invalid_argument(format!(
                    "the election name does not make a valid lock key (`{KEY_PREFIX}<name>`): {error}"
                )));
            }
        };
        let identity = self.identity.unwrap_or_else(default_identity);
        check_identity(&identity)?;
        let capabilities = self.backend.capabilities();
        if !capabilities.holders {
            return Err(LockError::invalid_argument(format!(
                "the {} backend does not store lock holders, which leader election needs to show who leads; use a backend whose capabilities().holders is true",
                capabilities.backend
            )));
        }
        let ttl = self.ttl;
        let retry = self.retry.unwrap_or_else(|| {
            RetryPolicy::wait_for(FAR_FUTURE)
                .with_backoff(Backoff::Fixed)
                .with_base_delay(ttl / 4)
        });
        let options = LockOptions::builder()
            .ttl(ttl)
            .retry(retry)
            .on_lost(self.on_lost)
            .show_key(self.show_key)
            .build()?;
        let observe_every = self.observe_every.unwrap_or(ttl / 4);
        if observe_every.is_zero() {
            return Err(LockError::invalid_argument(
                "observe_every is zero; give how often observers read who leads, such as a quarter of the ttl",
            ));
        }
        Ok(Election {
            settings: Arc::new(Settings {
                backend: self.backend,
                name: self.name,
                key,
                identity: identity.into(),
                options,
                observe_every,
            }),
        })
    }
}
