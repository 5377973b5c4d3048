//! `syncguard::shutdown` and what happens to releases when a runtime ends. Its own test
//! binary: shutdown releases every lock in the process, so it must not share one with other
//! tests. The tests in here run one at a time (they share the process's held locks and log).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use syncguard::backend::key::hash_key;
use syncguard::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockInfo, Lookup, ReleaseOutcome,
};
use syncguard::{LockBackend, LockError, LockId, LockOptions, LostReason, MemoryBackend, acquire};
use tokio::time::{Instant, sleep};

/// A memory backend reached through its futures only, whose releases can be made to hang.
#[derive(Clone, Default)]
struct Slow {
    inner: MemoryBackend,
    hang_releases: Arc<AtomicBool>,
}

impl LockBackend for Slow {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        self.inner.acquire(key, ttl)
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        let hang = self.hang_releases.load(Ordering::SeqCst);
        Box::pin(async move {
            if hang {
                std::future::pending::<()>().await;
            }
            self.inner.release(lock_id).await
        })
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        self.inner.extend(lock_id, ttl)
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        self.inner.is_locked(key)
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        self.inner.lookup(query)
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

/// Everything logged in this process, and a lock that keeps the tests apart.
struct Logs {
    text: Arc<Mutex<Vec<u8>>>,
    one_at_a_time: Mutex<()>,
}

#[derive(Clone)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs() -> &'static Logs {
    static LOGS: std::sync::OnceLock<Logs> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let text = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink(Arc::clone(&text));
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        Logs {
            text,
            one_at_a_time: Mutex::new(()),
        }
    })
}

fn exclusive() -> MutexGuard<'static, ()> {
    logs()
        .one_at_a_time
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn logged() -> String {
    String::from_utf8_lossy(&logs().text.lock().unwrap()).into_owned()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn shutdown_releases_held_locks_and_pending_background_releases() {
    let _serial = exclusive();
    runtime().block_on(async {
        let backend = Slow::default();
        let kept = acquire(&backend, "shutdown:kept", &LockOptions::default())
            .await
            .unwrap();
        let watcher = kept.lost_token();
        // A dropped guard whose background release cannot get through yet.
        backend.hang_releases.store(true, Ordering::SeqCst);
        let dropped = acquire(&backend, "shutdown:dropped", &LockOptions::default())
            .await
            .unwrap();
        drop(dropped);
        sleep(Duration::from_millis(50)).await;
        assert!(backend.inner.is_locked("shutdown:dropped").await.unwrap());
        backend.hang_releases.store(false, Ordering::SeqCst);

        let report = syncguard::shutdown(Duration::from_secs(5)).await;
        assert_eq!(report.released, 2, "{report:?}");
        assert!(report.all_free(), "{report:?}");
        for key in ["shutdown:kept", "shutdown:dropped"] {
            assert!(
                !backend.inner.is_locked(key).await.unwrap(),
                "{key} still held"
            );
        }
        // The guard still alive no longer believes it holds the lock.
        assert_eq!(kept.lost_reason(), Some(LostReason::Shutdown));
        assert!(watcher.is_cancelled());
        assert!(!kept.release().await.unwrap(), "already released");

        // Nothing is left for a second call.
        let again = syncguard::shutdown(Duration::from_secs(5)).await;
        assert_eq!(again.released, 0, "{again:?}");
    });
}

#[test]
fn shutdown_returns_at_its_timeout_and_names_what_it_could_not_release() {
    let _serial = exclusive();
    runtime().block_on(async {
        let backend = Slow::default();
        let guard = acquire(&backend, "shutdown:hangs", &LockOptions::default())
            .await
            .unwrap();
        backend.hang_releases.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let report = syncguard::shutdown(Duration::from_millis(300)).await;
        let waited = started.elapsed();
        assert_eq!(report.unanswered, 1, "{report:?}");
        assert!(!report.all_free());
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        assert!(guard.is_lost());
        assert!(
            logged().contains(&hash_key("shutdown:hangs")),
            "the unreleased lock is named by its key hash:\n{}",
            logged()
        );
        backend.hang_releases.store(false, Ordering::SeqCst);
        drop(guard);
    });
}

#[test]
fn a_release_cut_off_by_the_end_of_its_runtime_is_logged() {
    let _serial = exclusive();
    let backend = Slow::default();
    let key = "shutdown:runtime-ends";
    let runtime = runtime();
    runtime.block_on(async {
        let guard = acquire(&backend, key, &LockOptions::default())
            .await
            .unwrap();
        backend.hang_releases.store(true, Ordering::SeqCst);
        drop(guard); // its release waits in a task...
    });
    drop(runtime); // ...which the end of the runtime drops
    let logged = logged();
    let line = logged
        .lines()
        .find(|line| line.contains(&hash_key(key)))
        .unwrap_or_else(|| panic!("no warning names the lock:\n{logged}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("cut off"), "{line}");
}

#[test]
fn a_guard_dropped_outside_a_runtime_says_its_release_cannot_be_sent() {
    let _serial = exclusive();
    let backend = Slow::default();
    let key = "shutdown:no-runtime";
    let guard = runtime()
        .block_on(acquire(&backend, key, &LockOptions::default()))
        .unwrap();
    drop(guard); // no runtime here any more
    let logged = logged();
    let line = logged
        .lines()
        .find(|line| line.contains(&hash_key(key)))
        .unwrap_or_else(|| panic!("no warning names the lock:\n{logged}"));
    assert!(
        line.contains("WARN") && line.contains("outside a tokio runtime"),
        "{line}"
    );
}
