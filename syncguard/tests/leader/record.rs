//! Recording terms into the fault suite's history, and small drivers the scenarios share.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use syncguard::backend::LockBackend;
use syncguard::conformance::history::{Checked, History, Hold};
use syncguard::leader::{Election, Leader, Leadership};
use syncguard::{Fence, LockError, LockHandle, LockId};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use crate::SCENARIO_LIMIT;

/// An election name no other test (or run) uses.
pub(crate) fn unique_name(label: &str) -> String {
    format!("test-{label}-{}", LockId::generate())
}

/// A candidate with `identity` on `backend`.
pub(crate) fn election(
    backend: &Arc<dyn LockBackend>,
    name: &str,
    identity: &str,
    ttl: Duration,
) -> Election {
    Election::builder(backend, name)
        .identity(identity)
        .ttl(ttl)
        .build()
        .expect("valid election")
}

/// One term, as its leader saw it: recorded into the history when dropped (when the work is
/// dropped on a loss, too).
pub(crate) struct Term {
    hold: Hold,
    handle: LockHandle,
    history: Arc<History>,
}

impl Term {
    pub(crate) fn begin(leadership: &Leadership, history: &Arc<History>) -> Self {
        Self {
            hold: Hold {
                holder: leadership.identity().to_owned(),
                fence: leadership.term(),
                acquired: Instant::now(),
                actions: Vec::new(),
                lost: None,
            },
            handle: leadership.handle(),
            history: Arc::clone(history),
        }
    }

    /// Acts as the leader, if it still is: the instant is taken first, and counts only if
    /// leadership was not lost by then (a loss is final).
    pub(crate) fn act(&mut self) -> bool {
        let at = Instant::now();
        if self.handle.is_lost() {
            return false;
        }
        self.hold.actions.push(at);
        true
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        self.hold.lost = self.handle.lost_reason();
        self.history.record(self.hold.clone());
    }
}

/// A resource that refuses writes with a lower term than one it accepted: what a leader
/// should write to. Accepted writes are recorded in the writer's [`Term`].
#[derive(Default)]
pub(crate) struct FencedResource {
    highest: Mutex<Option<Fence>>,
    pub(crate) refused: AtomicUsize,
}

impl FencedResource {
    pub(crate) fn write(&self, term: &mut Term) -> bool {
        if term.handle.is_lost() {
            return false;
        }
        let mut highest = self.highest.lock().unwrap();
        if highest.is_some_and(|highest| highest > term.hold.fence) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return false;
        }
        *highest = Some(term.hold.fence);
        // Taken under the resource's lock: accepted writes are ordered as the resource saw
        // them.
        term.hold.actions.push(Instant::now());
        true
    }
}

pub(crate) fn checked(history: &History) -> Checked {
    history
        .check()
        .unwrap_or_else(|violations| panic!("{violations}"))
}

/// Waits until `election` has a leader other than `not`, and returns it.
pub(crate) async fn leader_other_than(election: &Election, not: Option<Fence>) -> Leader {
    let deadline = Instant::now() + SCENARIO_LIMIT;
    loop {
        if let Some(leader) = election.leader().await.expect("read the leader")
            && Some(leader.term) != not
        {
            return leader;
        }
        assert!(Instant::now() < deadline, "no new leader");
        sleep(Duration::from_millis(20)).await;
    }
}

/// A campaign in a task of its own.
pub(crate) fn spawn_campaign(election: &Election) -> JoinHandle<Result<Leadership, LockError>> {
    let election = election.clone();
    tokio::spawn(async move { election.campaign().await })
}
