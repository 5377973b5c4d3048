//! Waking this process's waiters when a lock is released: one listening connection per
//! backend, opened the first time something waits, hands the release channel's notifications
//! (the release statement sends one per live lock it deletes that an acquire was refused
//! during, the normalized key as payload) to the backend's [`ReleaseNotifier`]. The releases
//! this process makes without a notification wake its waiters directly
//! ([`ReleaseListener::released_here`]).
//!
//! The connection is a hint, never a condition: while it is down, or before its `LISTEN` took
//! effect, releases go unheard and waiters poll. So every time it starts listening (the first
//! time, and after each reconnect) the first waiter of every key tries its lock once, in case
//! the release it waits for went by meanwhile. A connection that fails is opened again, at
//! growing intervals while the server stays out of reach; a connection that stays silent is
//! checked with a query, so that one a partition or a NAT cut silently is noticed within
//! [`CHECK_AFTER_SILENCE`] and the operation timeout, not when TCP gives up.

use std::convert::Infallible;
use std::io;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, timeout};

use super::PostgresConfig;
use crate::backend::ReleaseNotifier;

/// How long the listening connection may stay silent before a query checks that it is alive.
const CHECK_AFTER_SILENCE: Duration = Duration::from_secs(30);

/// The pause before opening the listening connection again; it doubles (up to
/// [`LONGEST_PAUSE`]) while connections keep failing.
const FIRST_PAUSE: Duration = Duration::from_millis(250);

/// The longest pause between attempts to open the listening connection; a connection that
/// lasted this long resets the pause.
const LONGEST_PAUSE: Duration = Duration::from_secs(30);

/// The release listening of one backend (shared by its clones): the notifier its waiters
/// queue on, and the task that feeds it. Dropped with the last clone of the backend, it stops
/// the task, which closes its connection.
pub(super) struct ReleaseListener {
    notifier: ReleaseNotifier,
    /// The running task's stop signal: the task ends when this is dropped, and this is closed
    /// when the task is gone (its runtime shut down), so that another one is started.
    running: Mutex<Option<oneshot::Sender<Infallible>>>,
}

/// What the listening task needs; nothing of it keeps the backend (or its pool) alive.
#[derive(Clone)]
struct Setup {
    channel: String,
    /// The backend pool's connect options (URL, TLS, credentials), under an application name
    /// of the listener's own.
    options: PgConnectOptions,
    connect_timeout: Duration,
    operation_timeout: Duration,
}

impl ReleaseListener {
    pub(super) fn new() -> Self {
        Self {
            notifier: ReleaseNotifier::new(),
            running: Mutex::new(None),
        }
    }

    /// The notifier, with the listening task started on the current runtime unless it runs
    /// already; `None` outside a tokio runtime (waiters then poll).
    pub(super) fn notifier(
        &self,
        pool: &PgPool,
        config: &PostgresConfig,
    ) -> Option<ReleaseNotifier> {
        // Every critical section is a check and an assignment: nothing can poison it midway.
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if running.as_ref().is_none_or(oneshot::Sender::is_closed) {
            let runtime = tokio::runtime::Handle::try_current().ok()?;
            let setup = Setup {
                channel: config.release_channel(),
                options: listener_options(pool),
                connect_timeout: config.connect_timeout(),
                operation_timeout: config.operation_timeout(),
            };
            let (stop, stopped) = oneshot::channel();
            runtime.spawn(listen(setup, self.notifier.clone(), stopped));
            *running = Some(stop);
        }
        Some(self.notifier.clone())
    }

    /// Wakes this process's waiters of `key`, released by this process without an
    /// announcement (nothing starts listening for it).
    pub(super) fn released_here(&self, key: &str) {
        self.notifier.released(key);
    }
}

/// The pool's connect options, named for `pg_stat_activity`: `syncguard listener`, after the
/// pool's own application name if it has one.
fn listener_options(pool: &PgPool) -> PgConnectOptions {
    let options = (*pool.connect_options()).clone();
    let name = match options.get_application_name() {
        Some(application) => format!("{application} (syncguard listener)"),
        None => "syncguard listener".to_owned(),
    };
    options.application_name(&name)
}

/// The listening task: listens until `stop` is dropped, then closes its connection.
async fn listen(setup: Setup, notifier: ReleaseNotifier, mut stop: oneshot::Receiver<Infallible>) {
    let mut current = None;
    tokio::select! {
        _ = &mut stop => {}
        never = keep_listening(&setup, &notifier, &mut current) => match never {},
    }
    if let Some(listening) = current {
        listening.close(setup.connect_timeout).await;
    }
}

/// Opens the listening connection, relays what it hears, and opens another when it fails.
async fn keep_listening(
    setup: &Setup,
    notifier: &ReleaseNotifier,
    current: &mut Option<Listening>,
) -> Infallible {
    let mut pause = FIRST_PAUSE;
    let mut failures: u32 = 0;
    loop {
        match Listening::open(setup).await {
            Ok(listening) => {
                if failures > 0 {
                    tracing::info!("syncguard: listening for PostgreSQL lock releases again");
                }
                failures = 0;
                let opened = Instant::now();
                let listening = current.insert(listening);
                // Releases before the LISTEN took effect went unheard.
                notifier.missed_releases();
                let error = relay(listening, notifier, setup.operation_timeout).await;
                tracing::debug!(%error, "syncguard: the PostgreSQL listening connection failed; opening another");
                if let Some(lost) = current.take() {
                    tokio::spawn(lost.close(setup.connect_timeout));
                }
                if opened.elapsed() >= LONGEST_PAUSE {
                    pause = FIRST_PAUSE;
                }
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(%error, "syncguard: cannot listen for PostgreSQL lock releases; waiters poll until it can");
                } else {
                    tracing::debug!(%error, failures, "syncguard: still cannot listen for PostgreSQL lock releases");
                }
            }
        }
        sleep(pause).await;
        pause = pause.saturating_mul(2).min(LONGEST_PAUSE);
    }
}

/// Hands every notification to `notifier` until the connection fails for good (sqlx's
/// listener opens a lost connection again by itself when it can: that costs nothing but the
/// releases announced meanwhile). Returns why it stopped.
async fn relay(
    listening: &mut Listening,
    notifier: &ReleaseNotifier,
    operation_timeout: Duration,
) -> sqlx::Error {
    let listener = &mut listening.listener;
    loop {
        // Both branches are cancel-safe: sqlx reads whole messages only.
        let received = tokio::select! {
            received = listener.try_recv() => received,
            () = sleep(CHECK_AFTER_SILENCE) => {
                let check = sqlx::query("SELECT 1").execute(&mut *listener);
                match timeout(operation_timeout, check).await {
                    Ok(Ok(_)) => continue,
                    Ok(Err(error)) => return error,
                    Err(_elapsed) => {
                        return sqlx::Error::Io(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the listening connection did not answer a check within the operation timeout",
                        ));
                    }
                }
            }
        };
        match received {
            Ok(Some(notification)) => notifier.released(notification.payload()),
            // Lost, opened again and listening: releases in between went unheard.
            Ok(None) => notifier.missed_releases(),
            Err(error) => return error,
        }
    }
}

/// A listening connection, in a pool of one of its own: the backend's pool keeps all its
/// connections for lock operations.
struct Listening {
    pool: PgPool,
    listener: PgListener,
}

impl Listening {
    /// Connects and listens on the channel, within the connect and operation timeouts.
    async fn open(setup: &Setup) -> Result<Self, sqlx::Error> {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .test_before_acquire(false)
            .acquire_timeout(setup.connect_timeout)
            .connect_lazy_with(setup.options.clone());
        let mut listener = PgListener::connect_with(&pool).await?;
        match timeout(setup.operation_timeout, listener.listen(&setup.channel)).await {
            Ok(Ok(())) => Ok(Self { pool, listener }),
            Ok(Err(error)) => Err(error),
            Err(_elapsed) => Err(sqlx::Error::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "LISTEN was not answered within the operation timeout",
            ))),
        }
    }

    /// Closes the connection politely (the server ends its session at once), waiting at most
    /// `within` for a server that does not answer.
    async fn close(self, within: Duration) {
        let Self { pool, listener } = self;
        // The listener hands its connection back to the pool, which closes it.
        drop(listener);
        let _ = timeout(within, pool.close()).await;
    }
}
