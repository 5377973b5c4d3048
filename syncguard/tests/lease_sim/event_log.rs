//! The event log: what happened in one schedule, stamped with virtual time.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;

use tokio::time::Instant;

use crate::util::lock;

/// Event log lines kept from the start of a schedule, and from its end.
const LOG_HEAD: usize = 150;
const LOG_TAIL: usize = 250;
/// Event log lines kept per virtual instant (a busy loop would fill the log).
const LOG_PER_INSTANT: usize = 100;

/// What happened in one schedule, stamped with virtual time, for replaying a failure: its
/// first and last lines.
pub(crate) struct EventLog {
    pub(crate) start: Instant,
    lines: Mutex<Lines>,
}

#[derive(Default)]
struct Lines {
    head: Vec<String>,
    tail: VecDeque<String>,
    left_out: usize,
    /// The virtual instant of the latest line, and how many lines were logged at it.
    instant: Option<(Instant, usize)>,
}

impl EventLog {
    /// Must be made inside the schedule's runtime (it reads the paused clock).
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
            lines: Mutex::new(Lines::default()),
        }
    }

    pub(crate) fn stamp(&self) -> String {
        format!("{:>12.3}ms", self.start.elapsed().as_secs_f64() * 1000.0)
    }

    pub(crate) fn push(&self, line: impl fmt::Display) {
        let now = Instant::now();
        let mut lines = lock(&self.lines);
        let at_instant = match lines.instant {
            Some((at, count)) if at == now => count + 1,
            _ => 1,
        };
        lines.instant = Some((now, at_instant));
        if at_instant == LOG_PER_INSTANT {
            let line = format!("{} (further lines at this instant left out)", self.stamp());
            lines.add(line);
        }
        if at_instant < LOG_PER_INSTANT {
            let line = format!("{} {line}", self.stamp());
            lines.add(line);
        }
    }

    /// The first and the last lines.
    pub(crate) fn excerpt(&self) -> Vec<String> {
        let lines = lock(&self.lines);
        let mut excerpt = lines.head.clone();
        if lines.left_out > 0 {
            excerpt.push(format!("({} lines left out)", lines.left_out));
        }
        excerpt.extend(lines.tail.iter().cloned());
        excerpt
    }
}

impl Lines {
    fn add(&mut self, line: String) {
        if self.head.len() < LOG_HEAD {
            self.head.push(line);
            return;
        }
        if self.tail.len() == LOG_TAIL {
            self.tail.pop_front();
            self.left_out += 1;
        }
        self.tail.push_back(line);
    }
}
