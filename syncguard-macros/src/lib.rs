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
/// It is `syncguard::with_lock` for a whole function: the arguments map onto a
/// `syncguard::LockOptions`, and the key template is formatted from the parameters on each
/// call.
///
/// The function must return `Result<T, E>` with `E: From<syncguard::LockError>`: lock
/// failures reach the caller through `E`. Their `code()` is `ErrorCode::Contended` (the lock
/// is held and `wait = false`), `ErrorCode::AcquisitionTimeout` (it stayed held past the
/// wait), `ErrorCode::LockLost` (lost while the body ran), `ErrorCode::NoDefaultBackend`, or a
/// backend error's. Anything else is a compile error that says so, as are a non-`async` or `const fn`,
/// an unknown or repeated argument, a bad duration, a bad key template and a `guard` name
/// that hides a parameter; each points at the offending token.
///
/// # Arguments
///
/// | argument | meaning | default |
/// |---|---|---|
/// | `key = "..."` | the lock's key, a template (below); it may also come first without a name: `#[locked("job:{id}")]` | required |
/// | `ttl = "30s"` | the lease: how quickly a crashed holder's lock frees up | `"30s"` |
/// | `backend = expr` | the backend: an expression whose type is, or derefs to, a `LockBackend + Clone + 'static` (a backend, a reference to one, an `Arc<dyn LockBackend>`, a `LazyLock` static) | the process-wide default (`syncguard::set_default_backend`) |
/// | `wait = "5s"` | keep retrying for this long while the lock is held elsewhere (`RetryPolicy::wait_for`) | the default `RetryPolicy`: up to 10 retries within 5 s |
/// | `wait = false` | a single attempt: a held lock fails at once with `ErrorCode::Contended` (`RetryPolicy::single_attempt`) | |
/// | `retries = 3` | cap on retries after the first attempt | 10, or unlimited within `wait = "..."` |
/// | `retry_delay = "100ms"` | delay before the first retry | `"100ms"` |
/// | `backoff = exponential \| fixed` | how delays grow | `exponential` |
/// | `jitter = equal \| full \| none` | randomness mixed into delays | `equal` |
/// | `wake_on_release = false` | poll at the delays alone, instead of also waking when the lock is released (`RetryPolicy::with_wake_on_release`) | on |
/// | `heartbeat = false` | do not extend the lock while the body runs | on |
/// | `skip_if_held = true` | one attempt; a held lock skips the run, which returns `Ok(())` (for `Result<(), E>`) or `Ok(None)` (for `Result<Option<T>, E>`): for schedulers | off: wait |
/// | `min_hold = "5m"` | keep the lock at least this long after taking it, even if the body finishes sooner (`LockOptionsBuilder::min_hold`) | none |
/// | `max_hold = "10m"` | stop extending after this long (the lock then lapses and counts as lost) | none |
/// | `on_lost = cancel \| notify` | on loss, drop the body and return the lost-lock error, or let it run on | `cancel` |
/// | `show_key = true` | errors, logs and the hold's span show the raw key, not only its hash | off |
/// | `guard = name` | binds `name: &syncguard::LockGuard` in the body (fence, lock id, loss) | none |
/// | `crate = path` | where `syncguard` is, if renamed in `Cargo.toml` | `::syncguard` |
///
/// Durations are text checked at compile time: numbers with units (`ns`, `us`, `ms`, `s`,
/// `m`, `h`, `d`, `w`), e.g. `"500ms"`, `"30s"`, `"5m"`, `"1h 30m"`. Flags are written
/// without quotes (`wait = false`, `heartbeat = false`, `show_key = true`).
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
/// # Naming the lock in errors, logs and spans
///
/// Errors about a lock (`Contended`, `AcquisitionTimeout`, `LockLost`), the log lines about it
/// and its `syncguard.hold` span name it by the hash of its key (`syncguard::LockName`), since
/// keys may carry personal data. With `show_key = true` they show the raw key as well:
///
/// ```
/// use syncguard::{locked, LockError, LockOptions, MemoryBackend};
///
/// #[locked(key = "export:{user}", backend = backend, wait = false, show_key = true)]
/// async fn export(backend: &MemoryBackend, user: &str) -> Result<(), LockError> {
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let backend = MemoryBackend::new();
/// let _busy = syncguard::acquire(&backend, "export:ada", &LockOptions::default()).await?;
/// let error = export(&backend, "ada").await.unwrap_err();
/// assert_eq!(error.code(), syncguard::ErrorCode::Contended);
/// assert!(error.to_string().contains("\"export:ada\""), "{error}");
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
///     backend = LOCKS,
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
/// itself (its result is still replaced by an `ErrorCode::LockLost` error); with
/// `heartbeat = false` the lock simply expires after `ttl` (`LostReason::TtlElapsed`).
///
/// # What it expands to
///
/// Public API only, as you would write it by hand (`__` names are the macro's locals; the
/// two traits of `syncguard::macro_support` turn a `LockError` into the function's error type
/// and find the backend behind the `backend` expression):
///
/// ```ignore
/// async fn build_report(day: &str) -> Result<String, LockError> {
///     let __key: String = format!("report:{}", &day);
///     let __options = match syncguard::LockOptions::builder()
///         .ttl(Duration::new(0, 500_000_000))
///         .retry(syncguard::RetryPolicy::wait_for(Duration::new(10, 0)) /* .with_...(..) */)
///         .max_hold(Duration::new(3600, 0))
///         .on_lost(syncguard::OnLost::Cancel)
///         .build()
///     {
///         Ok(options) => options,
///         Err(error) => return Err(error.into()),
///     };
///     let __backend = &*LOCKS; // or `&syncguard::default_backend()?`
///     let __guard = match syncguard::acquire(__backend, &__key, &__options).await {
///         Ok(guard) => guard,
///         Err(error) => return Err(error.into()),
///     };
///     let __result = {
///         let lock = &__guard;
///         // The body, in the hold's `syncguard.hold` span, cancelled on loss
///         // (`LockGuard::run`); a lost lock is an `ErrorCode::LockLost` error.
///         match __guard.run(async move { /* the body */ }).await {
///             Ok(result) => result,
///             Err(lost) => Err(lost.into()),
///         }
///     };
///     // Waited for up to a second, then left to the background; failures are logged, not
///     // returned (the lock expires).
///     __guard.release_in_background().await;
///     __result
/// }
/// ```
///
/// The key is formatted and the lock acquired before the body runs; the body's future is
/// not created before then. Dropping the returned future mid-way drops the guard, which
/// releases the lock (in the background if the backend cannot answer at once).
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
