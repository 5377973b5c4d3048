//! `#[locked]`: run an async fn under a [`syncguard`](https://docs.rs/syncguard) distributed
//! lock. Use it as `syncguard::locked` (feature `macros`, on by default).

mod attr;
mod expand;
mod template;

use proc_macro::TokenStream;

/// Runs an `async fn` under a distributed lock: acquires it (waiting as configured), keeps it
/// alive with a heartbeat while the body runs, releases it on every path, and by default
/// cancels the body if the lock is lost.
///
/// ```
/// use syncguard::{locked, LockError, MemoryBackend};
///
/// #[locked(key = "job:{id}", ttl = "30s")]
/// async fn run_job(id: u64) -> Result<String, LockError> {
///     // Exclusive per job id across every process sharing the default backend.
///     Ok(format!("ran job {id}"))
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// syncguard::set_default_backend(MemoryBackend::new())?;
/// assert_eq!(run_job(7).await?, "ran job 7");
/// # Ok(()) }
/// ```
///
/// The function must return `Result<T, E>` with `E: From<syncguard::LockError>`: contention
/// past the wait, backend errors and a lost lock reach the caller through `E`. Anything else
/// is a compile error that says so, as are a non-`async` or `const fn`, an unknown or
/// repeated argument, a bad duration and a bad key template; each points at the offending
/// token.
///
/// # Arguments
///
/// | argument | meaning | default |
/// |---|---|---|
/// | `key = "..."` | the lock's key, a template (below) | required |
/// | `ttl = "30s"` | the lease: how quickly a crashed holder's lock frees up | `"30s"` |
/// | `backend = expr` | the backend: any expression of a type that is `LockBackend + Clone` | the process-wide default (`syncguard::set_default_backend`) |
/// | `wait = "5s"` | keep retrying for this long while the lock is held elsewhere | the lock helper's policy: 10 retries, 5 s |
/// | `wait = false` | a single attempt: contention fails at once | |
/// | `retries = 3` | cap on retries after the first attempt | 10, or unlimited within `wait = "..."` |
/// | `retry_delay = "100ms"` | delay before the first retry | `"100ms"` |
/// | `backoff = exponential \| fixed` | how delays grow | `exponential` |
/// | `jitter = equal \| full \| none` | randomness mixed into delays | `equal` |
/// | `heartbeat = false` | do not extend the lock while the body runs | on |
/// | `max_hold = "10m"` | stop extending after this long (the lock then lapses and counts as lost) | none |
/// | `on_lost = cancel \| notify` | on loss, drop the body and return the lost-lock error, or let it run on | `cancel` |
/// | `guard = name` | binds `name: &syncguard::LockGuard` in the body (fence, lock id, loss) | none |
/// | `crate = path` | where `syncguard` is, if renamed in `Cargo.toml` | `::syncguard` |
///
/// Durations are text checked at compile time: numbers with units (`ns`, `us`, `ms`, `s`,
/// `m`, `h`, `d`, `w`), e.g. `"500ms"`, `"30s"`, `"5m"`, `"1h 30m"`.
///
/// # Key templates
///
/// `{name}` interpolates a parameter with `Display`, `{name.field}` a field path (tuple
/// indexes too: `{pair.0}`), `{self.field}` works in methods, and `{{` / `}}` are literal
/// braces. A placeholder that names no parameter is a compile error.
///
/// ```
/// use syncguard::{locked, LockError, MemoryBackend};
///
/// struct Order { id: u64 }
///
/// struct Billing { tenant: String, locks: MemoryBackend }
///
/// impl Billing {
///     // Methods work with `&self` and `&mut self`; the backend can come from `self`.
///     #[locked(key = "{self.tenant}:order:{order.id}", backend = self.locks, wait = false)]
///     async fn charge(&self, order: &Order) -> Result<u64, LockError> {
///         Ok(order.id)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let billing = Billing { tenant: "acme".into(), locks: MemoryBackend::new() };
/// assert_eq!(billing.charge(&Order { id: 9 }).await?, 9);
/// # Ok(()) }
/// ```
///
/// # Waiting, heartbeat and loss
///
/// ```
/// use std::time::Duration;
/// use syncguard::{locked, LockError, MemoryBackend};
///
/// static LOCKS: std::sync::LazyLock<MemoryBackend> = std::sync::LazyLock::new(MemoryBackend::new);
///
/// #[locked(
///     key = "report:{day}",
///     backend = *LOCKS,
///     ttl = "500ms",           // short lease, kept alive by the heartbeat
///     wait = "10s",            // wait up to 10 s for another holder
///     retry_delay = "50ms",
///     backoff = fixed,
///     jitter = full,
///     max_hold = "1h",         // never hold it longer than an hour
///     on_lost = cancel,        // the default: stop the body if the lock is lost
///     guard = lock,
/// )]
/// async fn build_report(day: &str) -> Result<String, LockError> {
///     tokio::time::sleep(Duration::from_millis(1200)).await; // outlives the ttl
///     assert!(!lock.is_lost());
///     // Pass the fence to the storage you write to, so it can refuse stale writers.
///     Ok(format!("{day} written with fence {}", lock.fence()))
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let report = build_report("2026-11-22").await?;
/// assert!(report.ends_with("fence 000000000000001"));
/// # Ok(()) }
/// ```
///
/// With `on_lost = notify` the body keeps running after a loss and can watch `guard.lost()`
/// itself; with `heartbeat = false` the lock simply expires after `ttl`.
///
/// # What it expands to
///
/// The key is formatted and the lock acquired before the body runs; then the body runs as an
/// `async move` block raced against the guard's loss signal; then the lock is released
/// (errors of that final release are logged, not returned, since the lock expires anyway).
/// Dropping the returned future mid-way drops the guard, which releases in the background.
#[proc_macro_attribute]
pub fn locked(args: TokenStream, item: TokenStream) -> TokenStream {
    let original = proc_macro2::TokenStream::from(item.clone());
    let result = syn::parse::<attr::Args>(args).and_then(|args| {
        let function = syn::parse::<syn::ItemFn>(item)?;
        expand::expand(args, function)
    });
    match result {
        Ok(tokens) => tokens.into(),
        // Emit the item unchanged next to the error, so the IDE keeps working on it.
        Err(error) => {
            let error = error.to_compile_error();
            quote::quote!(#error #original).into()
        }
    }
}
