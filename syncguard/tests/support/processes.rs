//! What the servers of a test's own share: free loopback ports, a scratch directory, signals,
//! and the binaries `bash scripts/test-all.sh` exports.

#![allow(dead_code, unreachable_pub)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};

pub const HOW_TO_RUN: &str = "run `bash scripts/test-all.sh` (or `bash scripts/with-services.sh \
    cargo test ...`), which installs redis-server and PostgreSQL if missing and exports where \
    they are";

pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `count` distinct free loopback ports: all bound at once, so that none comes twice.
pub fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|listener| listener.local_addr().unwrap().port())
        .collect()
}

/// An exported variable, or a failure that says how to get it.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: {HOW_TO_RUN}"))
}

/// A fresh directory under the system's temporary directory, named after `label`.
pub fn scratch_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "syncguard-{label}-{}-{}",
        std::process::id(),
        syncguard::LockId::generate()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Sends `signal` (`STOP`, `CONT`, ...) to a process.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// [`signal`] for cleanups: a process that is already gone is no failure.
pub fn signal_quietly(pid: u32, signal: &str) -> std::io::Result<ExitStatus> {
    Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .stderr(Stdio::null())
        .status()
}
