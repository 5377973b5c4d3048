//! The deadlines of one connection between requests: its socket wrapped in [`DeadlineIo`],
//! which fails a read or write that waits past the deadline of the connection's [`Stage`], so
//! that hyper closes the connection.
//!
//! The stages, told by the service ([`ConnectionClock::request_started`],
//! [`ConnectionClock::request_answered`]) and by the bytes read:
//!
//! - [`Stage::Head`]: a request's head is due; the header read timeout runs from the
//!   connection's start, or from the first byte after an idle stage;
//! - [`Stage::Request`]: a request is being served; no deadline here (its body has its own,
//!   answered 408, see `body.rs`);
//! - [`Stage::Idle`]: answered, waiting for the next request; the idle timeout runs from the
//!   answer, and bounds writing the answer too (a client that does not read it).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Where a connection is in its request cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// A request's head is due (nothing sent yet on a new connection, or part of a head).
    Head,
    /// A request is being served.
    Request,
    /// Answered; waiting for the next request.
    Idle,
}

/// One connection's stage and when it began, shared by its socket and its service. Both run
/// in the connection's task, so the lock is never contended.
#[derive(Debug)]
pub(crate) struct ConnectionClock {
    stage: Mutex<(Stage, Instant)>,
    header_read_timeout: Duration,
    idle_timeout: Duration,
}

impl ConnectionClock {
    /// A new connection: its first head is due within `header_read_timeout`.
    pub(crate) fn new(header_read_timeout: Duration, idle_timeout: Duration) -> Self {
        Self {
            stage: Mutex::new((Stage::Head, Instant::now())),
            header_read_timeout,
            idle_timeout,
        }
    }

    fn set(&self, stage: Stage) {
        *self
            .stage
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = (stage, Instant::now());
    }

    fn get(&self) -> (Stage, Instant) {
        *self
            .stage
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// The stage now.
    pub(crate) fn stage(&self) -> Stage {
        self.get().0
    }

    /// A request's head was read: the request is being served.
    pub(crate) fn request_started(&self) {
        self.set(Stage::Request);
    }

    /// The request was answered: the connection waits for the next one.
    pub(crate) fn request_answered(&self) {
        self.set(Stage::Idle);
    }

    /// Bytes arrived: after an idle stage, they start the next request's head.
    fn bytes_arrived(&self) {
        let mut stage = self
            .stage
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if stage.0 == Stage::Idle {
            *stage = (Stage::Head, Instant::now());
        }
    }

    /// The deadline of the stage now, and what passing it means.
    fn deadline(&self) -> Option<(Instant, &'static str)> {
        match self.get() {
            (Stage::Head, since) => Some((
                since + self.header_read_timeout,
                "the request head did not arrive within the header read timeout",
            )),
            (Stage::Request, _) => None,
            (Stage::Idle, since) => Some((
                since + self.idle_timeout,
                "the connection was idle for the idle timeout",
            )),
        }
    }
}

/// A socket whose reads and writes fail with [`io::ErrorKind::TimedOut`] once they wait past
/// the deadline of the connection's stage.
#[derive(Debug)]
pub(crate) struct DeadlineIo<T> {
    io: T,
    clock: Arc<ConnectionClock>,
    timer: Pin<Box<Sleep>>,
    /// The deadline `timer` is set to.
    armed: Instant,
}

impl<T> DeadlineIo<T> {
    pub(crate) fn new(io: T, clock: Arc<ConnectionClock>) -> Self {
        let armed = Instant::now() + clock.header_read_timeout;
        Self {
            io,
            clock,
            timer: Box::pin(tokio::time::sleep_until(armed)),
            armed,
        }
    }

    /// For an operation that is waiting: ready with an error once the stage's deadline passed.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let Some((deadline, what)) = self.clock.deadline() else {
            return Poll::Pending;
        };
        if self.armed != deadline {
            self.timer.as_mut().reset(deadline);
            self.armed = deadline;
        }
        ready!(self.timer.as_mut().poll(cx));
        Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, what))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for DeadlineIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.clock.bytes_arrived();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => self.poll_expired(cx).map(Err),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for DeadlineIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Pending => self.poll_expired(cx).map(Err),
            written => written,
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.poll_expired(cx).map(Err),
            written => written,
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Pending => self.poll_expired(cx).map(Err),
            flushed => flushed,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn clock() -> Arc<ConnectionClock> {
        Arc::new(ConnectionClock::new(
            Duration::from_secs(10),
            Duration::from_secs(75),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_that_does_not_arrive_fails_the_read_at_the_header_timeout() {
        let (client, server) = tokio::io::duplex(64);
        let clock = clock();
        let mut io = DeadlineIo::new(server, clock.clone());
        let started = Instant::now();
        let error = io.read(&mut [0; 8]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        drop(client);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_progress_has_no_deadline_and_an_idle_one_the_idle_timeout() {
        let (mut client, server) = tokio::io::duplex(64);
        let clock = clock();
        let mut io = DeadlineIo::new(server, clock.clone());
        clock.request_started();
        let read = tokio::time::timeout(Duration::from_secs(3600), io.read(&mut [0; 8])).await;
        assert!(read.is_err(), "still waiting after an hour: {read:?}");

        clock.request_answered();
        let started = Instant::now();
        let error = io.read(&mut [0; 8]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(75));

        // A byte after the idle stage starts a head, due within the header read timeout.
        clock.request_answered();
        client.write_all(b"G").await.unwrap();
        assert_eq!(io.read(&mut [0; 8]).await.unwrap(), 1);
        assert_eq!(clock.stage(), Stage::Head);
        let started = Instant::now();
        assert!(io.read(&mut [0; 8]).await.is_err());
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }
}
