//! Leader election: one process at a time leads, among the processes sharing a backend, for
//! the work that must run on exactly one replica (a scheduler, a queue consumer, a cache
//! warmer); the others stand by and take over when it resigns or crashes.
//!
//! It is a lock with a heartbeat, so it has a lock's guarantees:
//!
//! - **One leader at a time.** A candidate leads while it holds the election's lock, kept by
//!   the heartbeat; it knows it lost leadership as a [`LockGuard`](crate::LockGuard) knows it
//!   lost its lock (the backend said so, or the lease ran out unextended), before the store
//!   lets anyone else in, and its work is cancelled then.
//! - **Terms.** Each leadership's term is its lock's [fence](crate::Fence): it strictly
//!   increases from leader to leader. Pass it to what the leader writes to, so that a
//!   deposed leader that has not noticed yet is refused.
//! - **Failover.** A leader that [resigns](Leadership::resign) (or drops its leadership) is
//!   replaced at once: the waiting candidates are woken by the release. One that crashes is
//!   replaced when its lease ends: about one ttl ([`DEFAULT_LEADER_TTL`], 15 s) after its
//!   last heartbeat, plus the stores' 1 s clock tolerance.
//! - **Observers** see who leads ([`Election::observe`]: the term and the leader's chosen
//!   identity, and each change) without campaigning.
//!
//! # Use
//! | to | use |
//! |---|---|
//! | run a background task on one replica at a time | [`Election::run_while_leader`] |
//! | lead, and decide yourself what leading means | [`Election::campaign`], then [`Leadership`] |
//! | see who leads, and follow changes | [`Election::observe`] ([`LeaderWatch`]), [`Election::leader`] |
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
//! use std::time::Duration;
//! use syncguard::MemoryBackend; // or PostgresBackend, RedisBackend, FirestoreBackend
//! use syncguard::leader::Election;
//! use tokio_util::sync::CancellationToken;
//!
//! let backend = MemoryBackend::new();
//! let election = Election::builder(&backend, "nightly-report").identity("replica-a").build()?;
//! let shutdown = CancellationToken::new(); // cancel it on SIGTERM
//!
//! let mut watch = election.observe().await?;
//! let replica = tokio::spawn({
//!     let (election, shutdown) = (election.clone(), shutdown.clone());
//!     async move {
//!         election
//!             .run_while_leader(shutdown, async |leadership| loop {
//!                 // Runs only here, only while this replica leads; stopped if it stops leading.
//!                 println!("reporting with term {}", leadership.term());
//!                 tokio::time::sleep(Duration::from_secs(60)).await;
//!             })
//!             .await
//!     }
//! });
//!
//! let leader = watch.wait_for(|leader| leader.is_some()).await?.unwrap();
//! assert_eq!(leader.identity, "replica-a");
//! shutdown.cancel(); // the work stops, and the replica resigns
//! assert!(replica.await.unwrap()?.is_none());
//! assert_eq!(election.leader().await?, None);
//! # Ok(()) }
//! ```
//!
//! # What is stored
//! The election `name` locks the key `leader:{name}` ([`KEY_PREFIX`]) with
//! [`LockBackend::acquire_as`](crate::backend::LockBackend::acquire_as); it needs a backend
//! whose [capabilities](crate::backend::Capabilities) say it stores holders (every built-in
//! backend does). The holder stored with the lock is the JSON object
//! `{"leader":"<identity>","campaign":"<nonce>"}`: the candidate's identity, for anyone
//! reading the store, and a random nonce per campaign, so that two candidates with the same
//! identity never share the lock. The lock is an ordinary syncguard lock: the reference
//! design's layout, readable by `get_by_key` (and `LockInfo::reveal`) and by TypeScript services.
//!
//! Every campaign waits in its backend instance's queue of waiters; only the first one polls,
//! every eighth to quarter of the ttl by default. Each leader extends its lock every
//! third of the ttl, and each observer reads it every `observe_every` (a quarter of the ttl
//! by default).

mod election;
mod holder;
mod identity;
mod leadership;
mod run;
mod watch;

pub use election::{DEFAULT_LEADER_TTL, Election, ElectionBuilder, KEY_PREFIX};
pub use identity::MAX_IDENTITY_BYTES;
pub use leadership::Leadership;
pub use watch::{Leader, LeaderWatch};
