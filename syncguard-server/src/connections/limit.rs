//! The connection limit: at most so many connections at once, below the process's open-file
//! limit, so that a flood of connections is refused (a 503 at once) rather than left
//! unanswered once no file descriptor is left to accept with.

use std::sync::{Arc, LazyLock};

use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Open files kept for what is not a client connection: the listener, the backend's
/// connections, JWKS and OTLP requests, the standard streams, and connections being refused.
const RESERVED_FILES: u64 = 128;

/// The most connections allowed by default, however high the open-file limit: each costs
/// some memory even idle.
const DEFAULT_CEILING: usize = 10_000;

/// The open-file limit (the soft one, which the process is held to), when it can be read.
fn open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rlimit::getrlimit(rlimit::Resource::NOFILE)
            .ok()
            .map(|(soft, _hard)| soft)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The most connections `file_limit` open files can hold beside what the process needs.
fn allowed_by(file_limit: u64) -> usize {
    let allowed = if file_limit > 2 * RESERVED_FILES {
        file_limit - RESERVED_FILES
    } else {
        file_limit / 2
    };
    usize::try_from(allowed.max(1)).unwrap_or(usize::MAX)
}

/// The connection limit for `requested` (`None`: from the open-file limit), or why it cannot
/// be used.
pub(crate) fn connection_limit(requested: Option<usize>) -> Result<usize, String> {
    resolve(requested, open_file_limit())
}

fn resolve(requested: Option<usize>, file_limit: Option<u64>) -> Result<usize, String> {
    let allowed = file_limit.map(allowed_by);
    match (requested, allowed) {
        (Some(0), _) => Err("the connection limit must be at least 1".to_owned()),
        (Some(requested), Some(allowed)) if requested > allowed => Err(format!(
            "a limit of {requested} connections needs more open files than the limit of {} allows \
             (at most {allowed} connections, keeping {RESERVED_FILES} files for the rest); raise the \
             open-file limit (`ulimit -n`, systemd's LimitNOFILE=) or lower SERVER_MAX_CONNECTIONS",
            file_limit.unwrap_or_default()
        )),
        (Some(requested), _) => Ok(requested),
        (None, Some(allowed)) => Ok(allowed.min(DEFAULT_CEILING)),
        (None, None) => Ok(DEFAULT_CEILING),
    }
}

/// How many connections are open against the limit; `/ready` reads it (a request extension
/// [`serve`](crate::serve) adds).
#[derive(Debug)]
pub(crate) struct ConnectionLoad {
    limit: usize,
    permits: Arc<Semaphore>,
}

impl ConnectionLoad {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            permits: Arc::new(Semaphore::new(limit.min(Semaphore::MAX_PERMITS))),
        }
    }

    /// A place for one more connection, held as long as it is open; `None` at the limit.
    pub(crate) fn try_admit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.permits).try_acquire_owned().ok()
    }

    /// The connection limit.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// The connections open now.
    pub(crate) fn open(&self) -> usize {
        self.limit - self.permits.available_permits()
    }

    /// Whether the next connection would be refused.
    pub(crate) fn is_full(&self) -> bool {
        self.permits.available_permits() == 0
    }
}

/// What a connection over the limit is answered, before it is closed.
static REFUSAL: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let body = r#"{"message":"Too many connections; try again shortly"}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
});

/// Answers a connection over the limit with a 503 and closes it, without waiting: what the
/// client sent so far is read first (so that closing sends a FIN, not a reset that could
/// discard the answer), and the answer fits in the socket's buffer.
pub(crate) fn refuse(stream: TcpStream) {
    let mut sent = [0; 4096];
    for _ in 0..16 {
        match stream.try_read(&mut sent) {
            Ok(read) if read == sent.len() => {}
            _ => break,
        }
    }
    let _ = stream.try_write(&REFUSAL);
}

/// The accept loop's account of refusals, for its log lines: one when the limit is reached,
/// one when connections are accepted again.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    /// Refused since the limit was last reached.
    count: u64,
}

impl Refusals {
    /// A connection was refused.
    pub(crate) fn refused(&mut self, load: &ConnectionLoad) {
        if self.count == 0 {
            tracing::warn!(
                limit = load.limit(),
                "connection limit reached: new connections are answered 503 until some close \
                 (SERVER_MAX_CONNECTIONS; /ready answers 503 meanwhile)"
            );
        }
        self.count += 1;
    }

    /// A connection was accepted.
    pub(crate) fn accepted(&mut self) {
        if self.count > 0 {
            tracing::info!(
                refused = self.count,
                "below the connection limit again: accepting connections"
            );
            self.count = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_limit_keeps_files_for_the_rest_of_the_process() {
        assert_eq!(resolve(None, Some(1024)), Ok(896));
        assert_eq!(resolve(None, Some(100)), Ok(50));
        assert_eq!(resolve(None, Some(1 << 20)), Ok(DEFAULT_CEILING));
        assert_eq!(resolve(None, None), Ok(DEFAULT_CEILING));
    }

    #[test]
    fn a_limit_the_open_files_cannot_hold_is_refused_with_what_to_do() {
        let error = resolve(Some(1000), Some(1024)).unwrap_err();
        assert!(
            error.contains("at most 896") && error.contains("LimitNOFILE"),
            "{error}"
        );
        assert_eq!(resolve(Some(896), Some(1024)), Ok(896));
        assert!(resolve(Some(0), Some(1024)).is_err());
    }

    #[test]
    fn the_refusal_is_a_complete_answer() {
        let text = String::from_utf8(REFUSAL.clone()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        serde_json::from_str::<serde_json::Value>(body).unwrap();
    }
}
