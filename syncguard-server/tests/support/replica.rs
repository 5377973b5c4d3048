//! `syncguard-server` processes on a shared backend: the built binary on a free loopback port,
//! stopped with SIGTERM or SIGKILL (killed anyway when a test fails), with its output kept and
//! printed when a test fails. And where the test PostgreSQL and Redis are.

#![allow(dead_code, unreachable_pub)] // Each test binary uses a part.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// How many lines of a server's output are kept for failure messages.
const KEPT_LINES: usize = 400;

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

type Log = Arc<Mutex<VecDeque<String>>>;

/// A running `syncguard-server` process.
pub struct ServerProcess {
    pub name: String,
    pub address: SocketAddr,
    child: Child,
    log: Log,
}

/// A process spawned, not yet listening.
struct Starting {
    name: String,
    backend: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    log: Log,
}

fn keep(log: &Log, line: String) {
    let mut log = log.lock().unwrap();
    if log.len() == KEPT_LINES {
        log.pop_front();
    }
    log.push_back(line);
}

fn read_lines(
    stream: impl Read + Send + 'static,
    log: Log,
    prefix: &'static str,
    sender: Option<mpsc::Sender<String>>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            keep(&log, format!("{prefix}{line}"));
            if let Some(sender) = &sender {
                let _ = sender.send(line);
            }
        }
    });
}

fn spawn(name: &str, backend_url: &str) -> Starting {
    let mut child = Command::new(env!("CARGO_BIN_EXE_syncguard-server"))
        .env_clear()
        // The startup line and anything that goes wrong; not a line per request.
        .env("RUST_LOG", "warn,syncguard_server::server=info")
        .env("AUTHENTICATION_DISABLED", "true")
        .env("SYNCGUARD_BACKEND_URL", backend_url)
        .args(["--address", "127.0.0.1", "--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("could not start server {name}: {error}"));
    let log = Log::default();
    let (sender, lines) = mpsc::channel();
    read_lines(child.stdout.take().unwrap(), log.clone(), "", Some(sender));
    read_lines(child.stderr.take().unwrap(), log.clone(), "stderr: ", None);
    Starting {
        name: name.to_owned(),
        backend: backend_url.split(':').next().unwrap_or_default().to_owned(),
        child,
        lines,
        log,
    }
}

fn dump(name: &str, log: &Log) -> String {
    let log = log.lock().unwrap();
    let mut text = format!(
        "--- output of server {name} (last {} lines) ---\n",
        log.len()
    );
    for line in log.iter() {
        text.push_str(line);
        text.push('\n');
    }
    text
}

impl Starting {
    /// Waits for the "listening" line and reads the port from it.
    fn listening(mut self) -> ServerProcess {
        let deadline = Instant::now() + Duration::from_secs(30);
        let line = loop {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) if line.contains("syncguard-server listening") => break line,
                Ok(_) => {}
                Err(_) => {
                    if let Some(status) = self.child.try_wait().unwrap() {
                        // Let the readers catch up with the last lines.
                        std::thread::sleep(Duration::from_millis(100));
                        panic!(
                            "server {} exited ({status}) before listening\n{}",
                            self.name,
                            dump(&self.name, &self.log)
                        );
                    }
                    if Instant::now() > deadline {
                        let _ = self.child.kill();
                        panic!(
                            "server {} did not listen within 30 s\n{}",
                            self.name,
                            dump(&self.name, &self.log)
                        );
                    }
                }
            }
        };
        let expected = match self.backend.as_str() {
            "postgres" | "postgresql" => "postgres",
            "redis" | "rediss" => "redis",
            other => other,
        };
        assert!(
            line.contains(&format!("backend=\"{expected}\"")),
            "server {} runs on {expected}: {line}",
            self.name
        );
        let port: u16 = line
            .split("127.0.0.1:")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("a port in {line}"));
        ServerProcess {
            name: self.name,
            address: ([127, 0, 0, 1], port).into(),
            child: self.child,
            log: self.log,
        }
    }
}

impl ServerProcess {
    /// A server named `name` (for messages) on `backend_url`, authentication disabled, once it
    /// listens.
    pub fn start(name: &str, backend_url: &str) -> Self {
        spawn(name, backend_url).listening()
    }

    /// Several servers, started side by side.
    pub fn start_all(servers: &[(&str, &str)]) -> Vec<Self> {
        let starting: Vec<Starting> = servers.iter().map(|(name, url)| spawn(name, url)).collect();
        starting.into_iter().map(Starting::listening).collect()
    }

    /// SIGTERM, as an orchestrator stops a replica: the server must exit cleanly.
    pub fn stop(mut self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM {}", self.child.id());
        let status = self.wait(Duration::from_secs(15));
        assert!(
            status.success(),
            "server {} exits cleanly on SIGTERM: {status}\n{}",
            self.name,
            dump(&self.name, &self.log)
        );
    }

    /// SIGKILL: a crash, with no shutdown at all.
    pub fn crash(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "server {} did not exit within {timeout:?}\n{}",
                    self.name,
                    dump(&self.name, &self.log)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's output so far (for messages).
    pub fn output(&self) -> String {
        dump(&self.name, &self.log)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.output());
        }
    }
}
