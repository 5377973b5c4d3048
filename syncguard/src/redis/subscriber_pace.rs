//! The pace of the release subscribers (one server's and a cluster's): how soon a lost
//! subscription is tried again, and how long a silent connection goes unchecked.

use std::time::Duration;

/// How long the subscriber connection may stay silent before a `PING` checks that it is alive.
pub(super) const CHECK_AFTER_SILENCE: Duration = Duration::from_secs(10);

/// The pause before subscribing again after a connection was lost or could not be opened; it
/// doubles (up to [`LONGEST_PAUSE`]) while that keeps happening.
pub(super) const FIRST_PAUSE: Duration = Duration::from_millis(100);

/// The longest pause between attempts to subscribe.
pub(super) const LONGEST_PAUSE: Duration = Duration::from_secs(10);
