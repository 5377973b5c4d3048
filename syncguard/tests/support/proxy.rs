//! A TCP proxy on loopback that a test can stall (a network partition: bytes are held, not
//! delivered, and new connections hang), strand (the connections open now hold their bytes for
//! good and never close, as half-open connections to a vanished peer do, while new ones go
//! through) or cut (every open connection closed at once, as a server restart or a dropped
//! link would).

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

pub struct Proxy {
    addr: SocketAddr,
    stalled: watch::Sender<bool>,
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
        let (stalled, watching) = watch::channel(false);
        let connections = Arc::new(Mutex::new(Vec::new()));
        let strands = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let accepting = {
            let connections = Arc::clone(&connections);
            let strands = Arc::clone(&strands);
            let accepted = Arc::clone(&accepted);
            tokio::spawn(async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let (strand, stranded) = watch::channel(false);
                    strands.lock().unwrap().push(strand);
                    let task = tokio::spawn(forward(client, upstream, watching.clone(), stranded));
                    connections.lock().unwrap().push(task.abort_handle());
                }
            })
            .abort_handle()
        };
        Self {
            addr,
            stalled,
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
        self.stalled.send_replace(true);
    }

    /// Delivers again what was held.
    pub fn resume(&self) {
        self.stalled.send_replace(false);
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
    stalled: watch::Receiver<bool>,
    stranded: watch::Receiver<bool>,
) {
    let mut waiting = stalled.clone();
    if waiting.wait_for(|stalled| !stalled).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = pipe(client_read, server_write, stalled.clone(), stranded.clone()) => {}
        () = pipe(server_read, client_write, stalled, stranded) => {}
    }
}

/// Copies `from` to `to`, holding each chunk while the proxy is stalled, and for good once
/// the connection is stranded.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: watch::Receiver<bool>,
    mut stranded: watch::Receiver<bool>,
) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if stalled.wait_for(|stalled| !stalled).await.is_err()
            || stranded.wait_for(|stranded| !stranded).await.is_err()
        {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
