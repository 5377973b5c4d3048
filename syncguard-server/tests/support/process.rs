//! `syncguard-server` processes: the built binary on a free loopback port with only the
//! environment a test gives it (the test's own never leaks in), stopped with SIGTERM or
//! SIGKILL (killed anyway when a test fails), with its output kept and printed when a test
//! fails; and starts that must fail.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The slow machine's margin for a start, a line or a failed start; nothing is timed by it.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How long [`ServerProcess::stop`] gives the server to exit after SIGTERM.
const STOP_LIMIT: Duration = Duration::from_secs(15);

/// How many lines of a server's output are kept for failure messages.
const KEPT_LINES: usize = 400;

/// The built binary on 127.0.0.1, a free port, authentication disabled, logging its startup
/// line and anything that goes wrong (not a line per request), with `env` on top (which may
/// override those) and `args` after, and no other variable.
fn command(env: &[(&str, &str)], args: &[&str]) -> Command {
    with_binary(
        Command::new(env!("CARGO_BIN_EXE_syncguard-server")),
        env,
        args,
    )
}

/// As [`command`], with the process's open-file limit set to `open_files` (through the shell's
/// `ulimit`, then `exec`, so the server is still the child).
fn command_with_file_limit(env: &[(&str, &str)], args: &[&str], open_files: u64) -> Command {
    let mut shell = Command::new("/bin/sh");
    shell.args([
        "-c",
        &format!("ulimit -n {open_files} && exec \"$0\" \"$@\""),
        env!("CARGO_BIN_EXE_syncguard-server"),
    ]);
    with_binary(shell, env, args)
}

fn with_binary(mut command: Command, env: &[(&str, &str)], args: &[&str]) -> Command {
    command
        .env_clear()
        .env("RUST_LOG", "warn,syncguard_server::server=info")
        .env("AUTHENTICATION_DISABLED", "true")
        .envs(env.iter().copied())
        .args(["--address", "127.0.0.1", "--port", "0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A start that must fail: the binary with `env` and `args` (as [`ServerProcess`] starts
/// it), which must exit unsuccessfully within [`PATIENCE`]. Returns what it printed.
pub fn failed_start(env: &[(&str, &str)], args: &[&str]) -> Output {
    failed(command(env, args), env, args)
}

/// As [`failed_start`], with the open-file limit set to `open_files`.
pub fn failed_start_with_file_limit(
    env: &[(&str, &str)],
    args: &[&str],
    open_files: u64,
) -> Output {
    failed(command_with_file_limit(env, args, open_files), env, args)
}

fn failed(mut command: Command, env: &[(&str, &str)], args: &[&str]) -> Output {
    let child = command.spawn().expect("the server binary starts");
    let pid = child.id();
    let (sender, exited) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    let Ok(output) = exited.recv_timeout(PATIENCE) else {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        panic!("{env:?} {args:?}: the server did not stop within {PATIENCE:?}");
    };
    let output = output.unwrap();
    assert!(
        !output.status.success(),
        "{env:?} {args:?} stops the start: {output:?}"
    );
    output
}

type Log = Arc<Mutex<VecDeque<String>>>;

/// A running `syncguard-server` process.
pub struct ServerProcess {
    pub name: String,
    pub address: SocketAddr,
    child: Child,
    log: Log,
    /// The stdout lines up to the "listening" one, which is the last.
    startup: Vec<String>,
    /// The stdout lines after it, as they come.
    lines: mpsc::Receiver<String>,
    readers: Vec<JoinHandle<()>>,
}

/// A process spawned, not yet listening.
struct Starting {
    name: String,
    backend: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    log: Log,
    readers: Vec<JoinHandle<()>>,
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
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            keep(&log, format!("{prefix}{line}"));
            if let Some(sender) = &sender {
                let _ = sender.send(line);
            }
        }
    })
}

/// The backend the "listening" line names for `SYNCGUARD_BACKEND_URL` in `env` (memory
/// without it).
fn expected_backend(env: &[(&str, &str)]) -> String {
    let url = env
        .iter()
        .rev()
        .find(|(variable, _)| *variable == "SYNCGUARD_BACKEND_URL")
        .map_or("memory", |(_, url)| url);
    match url.split(':').next().unwrap_or_default() {
        "postgres" | "postgresql" => "postgres",
        "redis" | "rediss" => "redis",
        other => other,
    }
    .to_owned()
}

fn spawn(name: &str, env: &[(&str, &str)]) -> Starting {
    spawn_command(name, env, command(env, &[]))
}

fn spawn_command(name: &str, env: &[(&str, &str)], mut command: Command) -> Starting {
    let mut child = command
        .spawn()
        .unwrap_or_else(|error| panic!("could not start server {name}: {error}"));
    let log = Log::default();
    let (sender, lines) = mpsc::channel();
    let readers = vec![
        read_lines(child.stdout.take().unwrap(), log.clone(), "", Some(sender)),
        read_lines(child.stderr.take().unwrap(), log.clone(), "stderr: ", None),
    ];
    Starting {
        name: name.to_owned(),
        backend: expected_backend(env),
        child,
        lines,
        log,
        readers,
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

/// Waits for the readers, which end when the process has exited and its output is read.
fn join(readers: Vec<JoinHandle<()>>) {
    for reader in readers {
        reader.join().expect("an output reader panicked");
    }
}

impl Starting {
    /// Waits for the "listening" line, checks the backend it names and reads the port.
    fn listening(mut self) -> ServerProcess {
        let deadline = Instant::now() + PATIENCE;
        let mut startup = Vec::new();
        loop {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    let listening = line.contains("syncguard-server listening");
                    startup.push(line);
                    if listening {
                        break;
                    }
                }
                Err(_) => {
                    if let Some(status) = self.child.try_wait().unwrap() {
                        join(self.readers);
                        panic!(
                            "server {} exited ({status}) before listening\n{}",
                            self.name,
                            dump(&self.name, &self.log)
                        );
                    }
                    if Instant::now() > deadline {
                        let _ = self.child.kill();
                        panic!(
                            "server {} did not listen within {PATIENCE:?}\n{}",
                            self.name,
                            dump(&self.name, &self.log)
                        );
                    }
                }
            }
        }
        let line = startup.last().unwrap();
        assert!(
            line.contains(&format!("backend=\"{}\"", self.backend)),
            "server {} runs on {}: {line}",
            self.name,
            self.backend
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
            startup,
            lines: self.lines,
            readers: self.readers,
        }
    }
}

impl ServerProcess {
    /// A server named `name` (for messages) on `backend_url`, once it listens.
    pub fn start(name: &str, backend_url: &str) -> Self {
        Self::start_with_env(name, &[("SYNCGUARD_BACKEND_URL", backend_url)])
    }

    /// A server named `name` (for messages) with `env` (see [`command`]), once it listens
    /// on the backend `env` names (memory without `SYNCGUARD_BACKEND_URL`).
    pub fn start_with_env(name: &str, env: &[(&str, &str)]) -> Self {
        spawn(name, env).listening()
    }

    /// As [`Self::start_with_env`], with the process's open-file limit set to `open_files`.
    pub fn start_with_file_limit(name: &str, env: &[(&str, &str)], open_files: u64) -> Self {
        spawn_command(name, env, command_with_file_limit(env, &[], open_files)).listening()
    }

    /// Several servers, each a name and a backend URL, started side by side.
    pub fn start_all(servers: &[(&str, &str)]) -> Vec<Self> {
        let starting: Vec<Starting> = servers
            .iter()
            .map(|(name, url)| spawn(name, &[("SYNCGUARD_BACKEND_URL", url)]))
            .collect();
        starting.into_iter().map(Starting::listening).collect()
    }

    /// The first stdout line containing `needle` that the server printed up to its
    /// "listening" line (which is one of them).
    pub fn startup_line(&self, needle: &str) -> &str {
        self.startup
            .iter()
            .find(|line| line.contains(needle))
            .unwrap_or_else(|| {
                panic!(
                    "server {} printed no line with `{needle}` before listening\n{}",
                    self.name,
                    self.output()
                )
            })
    }

    /// The next stdout line containing `needle`, after the "listening" line and those
    /// waited for before.
    pub fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!(
                    "the output of server {} ended without `{needle}`\n{}",
                    self.name,
                    self.output()
                ),
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "server {} printed no line with `{needle}` within {PATIENCE:?}\n{}",
                    self.name,
                    self.output()
                ),
            }
        }
    }

    /// Sends SIGTERM, as an orchestrator stops a replica; see [`Self::exits_cleanly`].
    pub fn terminate(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM {}", self.child.id());
    }

    /// After [`Self::terminate`]: the server must exit cleanly within `limit`. Returns its
    /// output, all read (for messages).
    pub fn exits_cleanly(mut self, limit: Duration) -> String {
        let status = self.wait(limit);
        assert!(
            status.success(),
            "server {} exits cleanly on SIGTERM: {status}\n{}",
            self.name,
            self.output()
        );
        join(std::mem::take(&mut self.readers));
        self.output()
    }

    /// SIGTERM: the server must exit cleanly within 15 s. Returns its output.
    pub fn stop(self) -> String {
        self.stop_within(STOP_LIMIT)
    }

    /// SIGTERM: the server must exit cleanly within `limit`. Returns its output.
    pub fn stop_within(self, limit: Duration) -> String {
        self.terminate();
        self.exits_cleanly(limit)
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
                    self.output()
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
