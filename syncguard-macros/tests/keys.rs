//! Key templates: parameters (destructured ones too), field paths, tuple indexes, `self`
//! fields, escaped braces, and methods taking `&self`, `&mut self` and trait impls, generic
//! fns.

use std::fmt::Display;

use syncguard::{LockBackend, LockError, LockGuard, MemoryBackend, locked};

struct Order {
    id: u64,
    customer: Customer,
}

struct Customer {
    name: String,
}

#[locked(key = "order:{order.id}:{order.customer.name}:{pair.1}:{{literal}}", backend = backend, guard = g)]
async fn by_fields(
    backend: MemoryBackend,
    order: &Order,
    pair: (u8, &str),
) -> Result<String, LockError> {
    Ok(g.key().to_owned())
}

#[locked(key = "generic:{item}", backend = backend, guard = g)]
async fn generic<T: Display + Send + Sync>(
    backend: &MemoryBackend,
    item: T,
) -> Result<String, LockError> {
    Ok(g.key().to_owned())
}

#[locked(key = "pair:{left}:{right}:{id}", backend = backend, guard = g)]
async fn destructured(
    backend: &MemoryBackend,
    (left, right): (u8, &str),
    Order { id, .. }: &Order,
) -> Result<String, LockError> {
    Ok(g.key().to_owned())
}

struct Tenant {
    name: String,
    locks: MemoryBackend,
    calls: u32,
}

impl Tenant {
    #[locked(key = "{self.name}:invoice:{n}", backend = self.locks, guard = g)]
    async fn shared(&self, n: u32) -> Result<String, LockError> {
        Ok(g.key().to_owned())
    }

    #[locked(key = "{self.name}:count", backend = self.locks, guard = g)]
    async fn exclusive(&mut self) -> Result<(u32, String), LockError> {
        self.calls += 1;
        Ok((self.calls, g.key().to_owned()))
    }
}

trait Job {
    async fn run(&self, id: u64) -> Result<String, LockError>;
}

impl Job for Tenant {
    #[locked(key = "job:{self.name}:{id}", backend = self.locks, guard = g)]
    async fn run(&self, id: u64) -> Result<String, LockError> {
        Ok(g.key().to_owned())
    }
}

// The key first and unnamed, as `#[instrument]` users write their span's name.
#[locked("invoice:{id}", backend = backend, guard = g)]
async fn positional(backend: &MemoryBackend, id: u32) -> Result<String, LockError> {
    assert!(
        backend.is_locked(g.key()).await?,
        "held while the body runs"
    );
    Ok(g.key().to_owned())
}

async fn check_released(backend: &MemoryBackend, key: &str) {
    assert!(!backend.is_locked(key).await.unwrap(), "{key} still held");
}

#[tokio::test]
async fn templates_interpolate_parameters_and_fields() {
    let backend = MemoryBackend::new();
    let order = Order {
        id: 42,
        customer: Customer { name: "ada".into() },
    };
    let key = by_fields(backend.clone(), &order, (1, "x")).await.unwrap();
    assert_eq!(key, "order:42:ada:x:{literal}");
    check_released(&backend, &key).await;
    assert_eq!(generic(&backend, 3.5).await.unwrap(), "generic:3.5");
    assert_eq!(generic(&backend, "s").await.unwrap(), "generic:s");
    let key = destructured(&backend, (1, "x"), &order).await.unwrap();
    assert_eq!(key, "pair:1:x:42");
    let key = positional(&backend, 9).await.unwrap();
    assert_eq!(key, "invoice:9");
    check_released(&backend, &key).await;
}

#[tokio::test]
async fn methods_use_self_fields() {
    let mut tenant = Tenant {
        name: "acme".into(),
        locks: MemoryBackend::new(),
        calls: 0,
    };
    assert_eq!(tenant.shared(7).await.unwrap(), "acme:invoice:7");
    assert_eq!(
        tenant.exclusive().await.unwrap(),
        (1, "acme:count".to_owned())
    );
    assert_eq!(tenant.exclusive().await.unwrap().0, 2);
    assert_eq!(tenant.run(9).await.unwrap(), "job:acme:9");
    check_released(&tenant.locks, "job:acme:9").await;
}

#[locked(key = "fence", backend = backend, guard = lock)]
async fn fence_of(backend: &MemoryBackend) -> Result<(u64, bool), LockError> {
    let guard: &LockGuard = lock;
    Ok((guard.fence().get(), guard.is_lost()))
}

#[tokio::test]
async fn guard_gives_the_fence() {
    let backend = MemoryBackend::new();
    for expected in 1..=3 {
        assert_eq!(fence_of(&backend).await.unwrap(), (expected, false));
    }
}
