//! Every accepted form compiles and runs.

use std::fmt::Display;
use std::sync::LazyLock;

use syncguard::{LockBackend, LockError, MemoryBackend, locked};

static LOCKS: LazyLock<MemoryBackend> = LazyLock::new(MemoryBackend::new);

#[locked(key = "plain")]
async fn minimal() -> Result<(), LockError> {
    Ok(())
}

#[locked(
    key = "all:{id}:{{x}}",
    ttl = "1h 30m",
    backend = LOCKS,
    wait = "5s",
    retries = 3,
    retry_delay = "10ms",
    backoff = fixed,
    jitter = none,
    heartbeat = true,
    max_hold = "10m",
    on_lost = notify,
    show_key = true,
    guard = lock,
)]
async fn every_option(id: u32) -> Result<String, LockError> {
    Ok(format!("{} {}", lock.key(), lock.fence()))
}

#[locked(key = "once", backend = *LOCKS, wait = false, heartbeat = false, on_lost = cancel, show_key = false)]
async fn single_attempt() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    Ok(())
}

#[locked(key = "generic:{value}", backend = backend)]
async fn generic<B, T>(backend: &B, value: T) -> Result<T, LockError>
where
    B: LockBackend + Clone + 'static,
    T: Display + Send,
{
    Ok(value)
}

type AppResult<T> = Result<T, LockError>;

#[locked(key = "alias", backend = LOCKS)]
async fn aliased() -> AppResult<u8> {
    Ok(1)
}

struct Service {
    name: String,
    locks: MemoryBackend,
    runs: u32,
}

impl Service {
    #[locked(key = "{self.name}:read", backend = self.locks)]
    async fn read(&self) -> Result<usize, LockError> {
        Ok(self.name.len())
    }

    #[locked(key = "{self.name}:write", backend = self.locks)]
    async fn write(&mut self) -> Result<u32, LockError> {
        self.runs += 1;
        Ok(self.runs)
    }
}

trait Handler {
    async fn handle(&self, id: u64) -> Result<u64, LockError>;
}

impl Handler for Service {
    #[locked(key = "handle:{id}", backend = self.locks)]
    async fn handle(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

mod renamed {
    pub use syncguard as sg;
}

#[locked(crate = renamed::sg, key = "renamed", backend = syncguard::MemoryBackend::new())]
async fn with_renamed_crate() -> Result<(), LockError> {
    Ok(())
}

// Every argument, through the renamed crate.
#[locked(
    crate = renamed::sg,
    key = "renamed:{id}",
    ttl = "10s",
    wait = "1s",
    retries = 2,
    retry_delay = "5ms",
    backoff = exponential,
    jitter = full,
    max_hold = "1m",
    on_lost = cancel,
    show_key = true,
    guard = lock,
)]
async fn renamed_every_option(id: u8) -> Result<u64, LockError> {
    Ok(lock.fence().get() + u64::from(id))
}

#[locked(key = "shared", backend = backend)]
async fn shared(backend: std::sync::Arc<dyn LockBackend>) -> Result<(), LockError> {
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    syncguard::set_default_backend(MemoryBackend::new()).unwrap();
    minimal().await.unwrap();
    assert_eq!(every_option(7).await.unwrap(), "all:7:{x} 000000000000001");
    single_attempt().await.unwrap();
    assert_eq!(generic(&MemoryBackend::new(), "v").await.unwrap(), "v");
    assert_eq!(aliased().await.unwrap(), 1);
    let mut service = Service {
        name: "svc".into(),
        locks: MemoryBackend::new(),
        runs: 0,
    };
    assert_eq!(service.read().await.unwrap(), 3);
    assert_eq!(service.write().await.unwrap(), 1);
    assert_eq!(service.handle(5).await.unwrap(), 5);
    with_renamed_crate().await.unwrap();
    assert_eq!(renamed_every_option(1).await.unwrap(), 2);
    shared(std::sync::Arc::new(MemoryBackend::new()))
        .await
        .unwrap();
    // Spawnable: the generated futures are Send.
    tokio::spawn(async { every_option(8).await })
        .await
        .unwrap()
        .unwrap();
}
