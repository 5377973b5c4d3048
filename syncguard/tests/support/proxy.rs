//! A TCP proxy on loopback that a test can stall (a network partition: bytes are held, not
//! delivered, and new connections hang), strand (the connections open now hold their bytes for
//! good and never close, as half-open connections to a vanished peer do, while new ones go
//! through) or cut (every open connection closed at once, as a server restart or a dropped
//! link would, or after an HTTP/2 GOAWAY), or hold only the answers once a given request was
//! forwarded (so that it is processed, its answer held).

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

pub struct Proxy {
    addr: SocketAddr,
    stalled: watch::Sender<Hold>,
    /// What [`go_away`](Proxy::go_away) sends every connection open before closing it.
    farewells: watch::Sender<Vec<u8>>,
    /// What [`hold_answers_after`](Proxy::hold_answers_after) waits for.
    trigger: Arc<Mutex<Option<Vec<u8>>>>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    /// A flag per connection opened so far: set, the connection is stranded.
    strands: Arc<Mutex<Vec<watch::Sender<bool>>>>,
    accepted: Arc<AtomicUsize>,
    accepting: AbortHandle,
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`), listening on a free loopback port.
    pub async fn start(upstream: &str) -> Self {
        let upstream: SocketAddr = tokio::net::lookup_host(upstream)
            .await
            .expect("resolve the upstream")
            .next()
            .expect("an upstream address");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let (stalled, watching) = watch::channel(Hold::Nothing);
        let farewells = watch::Sender::new(Vec::new());
        let trigger = Arc::new(Mutex::new(None));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let strands = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let accepting = {
            let connections = Arc::clone(&connections);
            let strands = Arc::clone(&strands);
            let accepted = Arc::clone(&accepted);
            let stall = stalled.clone();
            let farewell = farewells.clone();
            let trigger = Arc::clone(&trigger);
            tokio::spawn(async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let (strand, stranded) = watch::channel(false);
                    strands.lock().unwrap().push(strand);
                    let task = tokio::spawn(forward(
                        client,
                        upstream,
                        stall.clone(),
                        stranded,
                        farewell.subscribe(),
                        Arc::clone(&trigger),
                    ));
                    connections.lock().unwrap().push(task.abort_handle());
                }
            })
            .abort_handle()
        };
        drop(watching);
        Self {
            addr,
            stalled,
            farewells,
            trigger,
            connections,
            strands,
            accepted,
            accepting,
        }
    }

    /// `host:port` to dial instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds every byte in both directions, and every new connection, until [`resume`].
    pub fn stall(&self) {
        self.stalled.send_replace(Hold::Everything);
    }

    /// Delivers again what was held.
    pub fn resume(&self) {
        self.stalled.send_replace(Hold::Nothing);
    }

    /// Holds every answer (requests still go through, and the rest of the one seen, as an
    /// HTTP/2 end of stream sent apart) once a chunk from a client containing `pattern` has
    /// been forwarded, until [`resume`](Self::resume): the request is processed, its answer
    /// held. Once.
    pub fn hold_answers_after(&self, pattern: &[u8]) {
        *self.trigger.lock().unwrap() = Some(pattern.to_vec());
    }

    /// Cancels the [`hold_answers_after`](Self::hold_answers_after) pending, returning
    /// whether it already holds the answers (the pattern was forwarded).
    pub fn cancel_hold_answers_after(&self) -> bool {
        self.trigger.lock().unwrap().take().is_none()
    }

    /// Sends every connection open now an HTTP/2 GOAWAY frame (no stream processed, error
    /// code `reason`) in place of what is held, then closes it; returns once they are all
    /// gone. New connections go through.
    pub async fn go_away(&self, reason: u32) {
        let open: Vec<_> = self.connections.lock().unwrap().drain(..).collect();
        // Length 8, type GOAWAY, no flags, stream 0; last stream id 0, then the error code.
        let mut frame = vec![0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        frame.extend_from_slice(&reason.to_be_bytes());
        self.farewells.send_replace(frame);
        for connection in open {
            for _ in 0..500 {
                if connection.is_finished() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(connection.is_finished(), "a connection outlived its GOAWAY");
        }
    }

    /// Holds every byte of the connections open now for good, in both directions, without
    /// closing them: their peers wait for an answer that never comes. New connections go
    /// through.
    pub fn strand(&self) {
        for strand in self.strands.lock().unwrap().iter() {
            strand.send_replace(true);
        }
    }

    /// Closes every connection open now (new ones go through).
    pub fn cut(&self) {
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    /// How many connections the proxy accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
        self.cut();
    }
}

async fn forward(
    client: TcpStream,
    upstream: SocketAddr,
    stall: watch::Sender<Hold>,
    stranded: watch::Receiver<bool>,
    mut farewell: watch::Receiver<Vec<u8>>,
    trigger: Arc<Mutex<Option<Vec<u8>>>>,
) {
    let stalled = stall.subscribe();
    let mut waiting = stalled.clone();
    if waiting
        .wait_for(|hold| *hold != Hold::Everything)
        .await
        .is_err()
    {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = Tap {
        stall: &stall,
        trigger: &trigger,
    };
    let going_away = tokio::select! {
        () = pipe(&mut client_read, &mut server_write, stalled.clone(), stranded.clone(), Some(requests)) => false,
        () = pipe(&mut server_read, &mut client_write, stalled, stranded, None) => false,
        Ok(()) = farewell.changed() => true,
    };
    if going_away {
        let frame = farewell.borrow_and_update().clone();
        client_write.write_all(&frame).await.ok();
    }
}

/// What the proxy holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    Nothing,
    /// What servers send.
    Answers,
    /// Both directions, and new connections.
    Everything,
}

/// Watches the requests a pipe forwards for the pattern of [`Proxy::hold_answers_after`].
struct Tap<'a> {
    stall: &'a watch::Sender<Hold>,
    trigger: &'a Mutex<Option<Vec<u8>>>,
}

impl Tap<'_> {
    /// Holds the answers if `forwarded` (with the end of the chunk before it, `tail`) holds the
    /// pattern.
    fn forwarded(&self, tail: &[u8], forwarded: &[u8]) {
        let mut trigger = self.trigger.lock().unwrap();
        let Some(pattern) = trigger.as_deref() else {
            return;
        };
        let seen = [tail, forwarded].concat();
        if seen.windows(pattern.len()).any(|window| window == pattern) {
            *trigger = None;
            self.stall.send_if_modified(|hold| {
                let holding = *hold == Hold::Nothing;
                if holding {
                    *hold = Hold::Answers;
                }
                holding
            });
        }
    }
}

/// Copies `from` to `to`, holding each chunk while the proxy holds its direction (requests,
/// with a `tap` that it shows what was forwarded; answers without), and for good once the
/// connection is stranded.
async fn pipe(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    mut stalled: watch::Receiver<Hold>,
    mut stranded: watch::Receiver<bool>,
    tap: Option<Tap<'_>>,
) {
    let mut buffer = vec![0; 16 * 1024];
    // The end of the last chunk, so that a pattern split between two chunks is seen.
    let mut tail = Vec::new();
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let held = |hold: &Hold| match hold {
            Hold::Nothing => false,
            Hold::Answers => tap.is_none(),
            Hold::Everything => true,
        };
        if stalled.wait_for(|hold| !held(hold)).await.is_err()
            || stranded.wait_for(|stranded| !stranded).await.is_err()
        {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
        if let Some(tap) = &tap {
            tap.forwarded(&tail, &buffer[..read]);
            tail = buffer[read.saturating_sub(64)..read].to_vec();
        }
    }
}
