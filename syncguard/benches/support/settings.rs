//! The benches' settings, from the environment.

use std::str::FromStr;
use std::time::Duration;

/// Whether `SYNCGUARD_BENCH_ONLY` (names separated by commas) lets `name` run; unset, all run.
pub fn wanted(name: &str) -> bool {
    std::env::var("SYNCGUARD_BENCH_ONLY")
        .map(|only| only.split(',').any(|wanted| wanted.trim() == name))
        .unwrap_or(true)
}

/// The URL of a service the bench needs, from `variable` (`scripts/with-services.sh` sets it).
pub fn service_url(variable: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| {
        panic!("{variable} is not set: run through `bash scripts/with-services.sh cargo bench ...`")
    })
}

/// `variable` parsed, or `default` when it is unset or not a value of that type.
pub fn number_or<T: FromStr>(variable: &str, default: T) -> T {
    std::env::var(variable)
        .ok()
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(default)
}

/// `SYNCGUARD_BENCH_SECS` (seconds, fractions allowed), or `default_secs`.
pub fn measured_time(default_secs: f64) -> Duration {
    Duration::from_secs_f64(number_or("SYNCGUARD_BENCH_SECS", default_secs))
}

/// `SYNCGUARD_BENCH_THREADS` (at least 1), or `default`.
pub fn runtime_threads(default: usize) -> usize {
    number_or("SYNCGUARD_BENCH_THREADS", default).max(1)
}

/// The runtime the bench's clients run on, with `threads` worker threads (see
/// [`runtime_threads`]); one makes a current-thread runtime.
pub fn runtime(threads: usize) -> tokio::runtime::Runtime {
    if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .expect("runtime")
}
