//! Kill-the-primary trials through Sentinel with replication lag injected, with
//! `with_wait_for_replicas` on and off, on a Sentinel group of the bench's own (issue 34): per
//! setting, how many trials saw two holders at once or fences out of order, and the time from
//! the kill to both clients acquiring again.
//!
//! ```text
//! SYNCGUARD_BENCH_ROUNDS=200 bash scripts/with-services.sh \
//!   cargo bench -p syncguard --features redis-sentinel,conformance --bench redis_sentinel_failover
//! ```
//!
//! Each trial (`tests/support/sentinel_trial.rs`): two backend instances with eight workers each
//! on three keys, ttl 6 s, some holds spanning the failover; the replica's link (through a
//! proxy) held 300 ms before the primary is killed, the held bytes dropped, the replica promoted; the killed server restarted as the new replica. The settings
//! alternate, `SYNCGUARD_BENCH_ROUNDS` trials of each (default 5). Needs
//! `SYNCGUARD_REDIS_SERVER_BIN`.

// The tests' own Sentinel group, proxy and trial; helpers the bench does not use go unused.
#[path = "../tests/support/proxy.rs"]
#[allow(unused_imports)]
mod proxy;
#[path = "../tests/support/sentinel_trial.rs"]
#[allow(unused_imports)]
mod sentinel_trial;
#[path = "../tests/support/sentinels.rs"]
#[allow(unused_imports)]
mod sentinels;
mod support;

use std::time::Duration;

use sentinel_trial::{Outcome, kill_with_lag};
use sentinels::SentinelGroup;
use support::settings::number_or;

fn main() {
    let rounds: usize = number_or("SYNCGUARD_BENCH_ROUNDS", 5);
    support::settings::runtime(2).block_on(async {
        let mut group = SentinelGroup::start().await;
        let mut outcomes: [Vec<Outcome>; 2] = [Vec::new(), Vec::new()];
        println!("| trial | wait for replica | holds | lost | two holders at once | fence violations | every client back | grant during the lag |");
        println!("|---:|---|---:|---:|---:|---:|---:|---|");
        for trial in 1..=rounds {
            for (side, safe) in [(0, false), (1, true)] {
                let outcome = kill_with_lag(&mut group, safe).await;
                println!(
                    "| {trial} | {} | {} | {} | {} | {} | {} | {} |",
                    if safe { "on" } else { "off" },
                    outcome.holds,
                    outcome.lost,
                    outcome.double_grants,
                    outcome.fence_violations,
                    outcome
                        .every_client_back
                        .map_or("never".to_owned(), |back| format!("{:.2} s", back.as_secs_f64())),
                    if outcome.probe_granted { "granted" } else { "refused" }
                );
                outcomes[side].push(outcome);
            }
        }
        println!("\n| wait for replica | trials | trials with two holders | two holders, in all | trials with fence violations | every client back, p50 | p99 |");
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for (side, outcomes) in outcomes.iter().enumerate() {
            let mut back: Vec<Duration> =
                outcomes.iter().filter_map(|o| o.every_client_back).collect();
            back.sort();
            let percentile = |p: f64| {
                back.get(((back.len().max(1) - 1) as f64 * p).round() as usize)
                    .map_or("-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
            };
            println!(
                "| {} | {} | {} | {} | {} | {} | {} |",
                ["off", "on"][side],
                outcomes.len(),
                outcomes.iter().filter(|o| o.double_grants > 0).count(),
                outcomes.iter().map(|o| o.double_grants).sum::<usize>(),
                outcomes.iter().filter(|o| o.fence_violations > 0).count(),
                percentile(0.5),
                percentile(0.99),
            );
        }
    });
}
