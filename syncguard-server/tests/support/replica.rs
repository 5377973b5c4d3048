//! Where the test PostgreSQL and Redis are, and names no earlier run used (for the tests on
//! those servers: `replicas`, `lsc_table`).

#![allow(dead_code, unreachable_pub)] // Each test binary that includes it uses a part.

fn exported(name: &str, install: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run `bash scripts/test-all.sh`, which installs {install} and \
             starts it, or `bash scripts/with-services.sh cargo test -p syncguard-server \
             --all-features ...`"
        )
    })
}

/// The test PostgreSQL `scripts/services.sh` starts.
pub fn postgres_url() -> String {
    exported(
        "SYNCGUARD_TEST_POSTGRES_URL",
        "PostgreSQL (apt-get install postgresql)",
    )
}

/// The test redis-server `scripts/services.sh` starts.
pub fn redis_url() -> String {
    exported(
        "SYNCGUARD_TEST_REDIS_URL",
        "redis-server (apt-get install redis-server)",
    )
}

/// A name no earlier run used (a namespace or lock name: `[a-zA-Z0-9_-]`, at most 64).
pub fn unique_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = format!(
        "{prefix}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000_000
    );
    assert!(name.len() <= 64, "{name}");
    name
}
