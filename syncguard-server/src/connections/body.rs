//! The body read timeout: a request body that has not all arrived within the timeout of its
//! head fails with [`BodyTimeout`], which the lock routes answer `408 Request Timeout`.

use std::error::Error;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn Error + Send + Sync>;

/// A request body did not arrive within the body read timeout.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {timeout:?}")]
pub(crate) struct BodyTimeout {
    timeout: Duration,
}

/// Whether `error`, or an error it was caused by, is a [`BodyTimeout`].
pub(crate) fn is_body_timeout(error: &(dyn Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.is::<BodyTimeout>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// `inner`, failing with [`BodyTimeout`] once `timeout` has passed since it was wrapped (when
/// the request's head was read).
#[derive(Debug)]
pub(crate) struct DeadlineBody<B> {
    inner: B,
    deadline: Instant,
    timeout: Duration,
    /// Made the first time the body waits: most bodies arrive with their head, and never do.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B> DeadlineBody<B> {
    pub(crate) fn new(inner: B, timeout: Duration) -> Self {
        Self {
            inner,
            deadline: Instant::now() + timeout,
            timeout,
            timer: None,
        }
    }
}

impl<B> Body for DeadlineBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|frame| frame.map_err(Into::into))),
            Poll::Pending => {
                let deadline = this.deadline;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout {
                        timeout: this.timeout,
                    })))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::BodyExt;

    use super::*;

    /// A body that sends part of itself and then nothing, as a client that stops mid-body.
    struct Stalled(Option<Bytes>);

    impl Body for Stalled {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            match self.0.take() {
                Some(part) => Poll::Ready(Some(Ok(Frame::data(part)))),
                None => Poll::Pending,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_fails_at_the_deadline_counted_from_its_head() {
        let started = Instant::now();
        let body = DeadlineBody::new(
            Stalled(Some(Bytes::from_static(b"{\"inst"))),
            Duration::from_secs(10),
        );
        let error = body.collect().await.unwrap_err();
        assert!(is_body_timeout(&*error), "{error}");
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_arrives_in_time_is_read_whole() {
        let body = DeadlineBody::new(
            http_body_util::Full::new(Bytes::from_static(b"{}")),
            Duration::from_secs(10),
        );
        assert_eq!(body.collect().await.unwrap().to_bytes(), "{}");
    }
}
