//! Servers of a test's own, on free loopback ports, that the test may kill, pause and
//! restart: redis-server with AOF persistence, and a PostgreSQL cluster. The binaries come
//! from the variables `bash scripts/test-all.sh` exports (`SYNCGUARD_REDIS_SERVER_BIN`,
//! `SYNCGUARD_POSTGRES_BIN`).

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::{Instant, sleep};

#[path = "processes.rs"]
mod processes;

pub use processes::{HOW_TO_RUN, env, free_port, scratch_dir};
use processes::{signal, signal_quietly};

/// A redis-server of the test's own, persisting with AOF only (`appendfsync` as given).
pub struct RedisServer {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
    appendfsync: &'static str,
    /// `--replicaof` this port, for a replica.
    primary: Option<u16>,
}

impl RedisServer {
    pub async fn start(appendfsync: &'static str) -> Self {
        Self::start_as(appendfsync, None).await
    }

    /// A replica of `primary`, once its link to it is up.
    pub async fn start_replica_of(primary: &RedisServer) -> Self {
        let replica = Self::start_as("everysec", Some(primary.port)).await;
        let mut conn = redis::Client::open(replica.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the replica");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
                .expect("INFO replication of the replica");
            if info.contains("master_link_status:up") {
                return replica;
            }
            assert!(
                Instant::now() < deadline,
                "the replica's link did not come up: {info}"
            );
            sleep(Duration::from_millis(50)).await;
        }
    }

    async fn start_as(appendfsync: &'static str, primary: Option<u16>) -> Self {
        let mut server = Self {
            child: None,
            dir: scratch_dir("redis"),
            port: free_port(),
            appendfsync,
            primary,
        };
        server.launch().await;
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on the same port and directory: it replays its AOF.
    pub async fn launch(&mut self) {
        let child = Command::new(env("SYNCGUARD_REDIS_SERVER_BIN"))
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--appendonly", "yes", "--appendfsync", self.appendfsync])
            .args(["--save", "", "--daemonize", "no", "--logfile", "redis.log"])
            .args(
                self.primary
                    .map(|port| {
                        vec![
                            "--replicaof".to_owned(),
                            "127.0.0.1".to_owned(),
                            port.to_string(),
                        ]
                    })
                    .unwrap_or_default(),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server: {e}; {HOW_TO_RUN}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(client) = redis::Client::open(self.url())
                && let Ok(mut conn) = client.get_multiplexed_async_connection().await
            {
                let pong: Result<String, _> = redis::cmd("PING").query_async(&mut conn).await;
                if pong.is_ok() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// A clean SHUTDOWN (the AOF is flushed), then waits for the process to exit.
    pub async fn stop(&mut self) {
        let mut conn = redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to stop");
        let _ = redis::cmd("SHUTDOWN")
            .query_async::<redis::Value>(&mut conn)
            .await;
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "redis-server did not stop");
                sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// `kill -9`: no shutdown, no flush beyond what `appendfsync` already wrote.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill -9 redis-server");
            child.wait().expect("reap redis-server");
        }
    }

    /// SIGSTOP: the server holds every connection open and answers nothing.
    pub fn pause(&self) {
        signal(self.pid(), "STOP");
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("redis-server running").id()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = signal_quietly(child.id(), "CONT");
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A PostgreSQL cluster of the test's own (trust authentication, no fsync: only the server
/// process is ever killed here, never the machine), run as the `postgres` user when the test
/// runs as root, as PostgreSQL requires.
pub struct PostgresServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl PostgresServer {
    pub async fn start() -> Self {
        let server = Self {
            bin: PathBuf::from(env("SYNCGUARD_POSTGRES_BIN")),
            dir: scratch_dir("postgres"),
            port: free_port(),
        };
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&server.dir)
                .status()
                .expect("chown");
            assert!(status.success(), "chown the cluster directory to postgres");
        }
        let data = server.dir.join("data");
        server.run(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "-A".as_ref(),
                "trust".as_ref(),
                "--no-sync".as_ref(),
            ],
        );
        server.pg_ctl(&["start", "-w", "-t", "60"]);
        server
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `pg_ctl restart -m immediate`: every backend killed at once, as in a crash, then crash
    /// recovery on start.
    pub fn restart(&self) {
        self.pg_ctl(&["restart", "-m", "immediate", "-w", "-t", "60"]);
    }

    fn pg_ctl(&self, args: &[&str]) {
        let data = self.dir.join("data");
        let log = self.dir.join("server.log");
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100",
            self.port,
            self.dir.display()
        );
        let mut all: Vec<&std::ffi::OsStr> = vec![
            "-D".as_ref(),
            data.as_os_str(),
            "-l".as_ref(),
            log.as_os_str(),
            "-o".as_ref(),
            options.as_ref(),
        ];
        all.extend(args.iter().map(|arg| std::ffi::OsStr::new(*arg)));
        self.run("pg_ctl", &all);
    }

    fn run(&self, program: &str, args: &[&std::ffi::OsStr]) {
        let path = self.bin.join(program);
        let mut command = if is_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&path);
            command
        } else {
            Command::new(&path)
        };
        let output = command
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}; {HOW_TO_RUN}", path.display()));
        assert!(
            output.status.success(),
            "{program} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn data_dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let stop = [
            "stop".as_ref(),
            "-D".as_ref(),
            data.as_os_str(),
            "-m".as_ref(),
            "immediate".as_ref(),
        ];
        let path = self.bin.join("pg_ctl");
        let _ = if is_root() {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&path)
                .args(stop)
                .output()
        } else {
            Command::new(&path).args(stop).output()
        };
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| output.stdout.starts_with(b"0\n"))
}
