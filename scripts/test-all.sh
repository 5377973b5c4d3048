#!/usr/bin/env bash
# The one test command: on a fresh Debian machine with Rust, installs what is missing, starts
# PostgreSQL, Redis and the Cloud Firestore emulator on loopback on free ports, runs formatting,
# lint, docs, per-feature builds and every test, and stops what it started (also on failure or
# Ctrl-C).
#
#   bash scripts/test-all.sh            # everything
#   bash scripts/test-all.sh --tests    # only the tests
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# A fresh clone gains nothing from incremental compilation; its caches cost about 2 GB.
if [ -n "${CI:-}" ] || [ ! -d target/debug ]; then export CARGO_INCREMENTAL=0; fi
free_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ "${free_kb:-0}" -lt $((4 * 1024 * 1024)) ]; then
  echo "warning: only $((free_kb / 1024)) MB free here; a fresh build needs about 3 GB" >&2
fi
if [ "${1:-}" != "--tests" ]; then
  log "cargo fmt --check"
  cargo fmt --all --check
  log "no two modules import each other"
  python3 scripts/check-module-cycles.py syncguard/src syncguard-tower/src syncguard-macros/src
  log "cargo clippy"
  cargo clippy --workspace --all-targets --all-features -- -D warnings
  log "cargo doc"
  RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features --workspace
  log "each feature of syncguard on its own"
  cargo check -p syncguard --no-default-features
  for feature in memory macros postgres postgres-tls redis redis-tls firestore opentelemetry conformance; do
    cargo check -p syncguard --no-default-features --features "$feature"
  done
fi

start_services
log "cargo test"
cargo test --workspace --all-features
