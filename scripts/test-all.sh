#!/usr/bin/env bash
# The one test command: on a fresh Debian machine with Rust, installs what is missing, starts
# PostgreSQL, Redis and the Cloud Firestore emulator on loopback on free ports, runs formatting,
# lint, docs, per-feature builds, the MSRV check, packaging and every test, and stops what it
# started (also on failure or Ctrl-C).
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
  python3 scripts/check-module-cycles.py syncguard/src syncguard-tower/src syncguard-macros/src syncguard-server/src
  log "cargo clippy"
  cargo clippy --workspace --all-targets --all-features -- -D warnings
  log "cargo doc"
  RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features --workspace
  log "each feature of syncguard on its own"
  cargo check -p syncguard --no-default-features
  for feature in memory macros postgres postgres-tls redis redis-tls redis-cluster redis-sentinel firestore opentelemetry serde conformance; do
    cargo check -p syncguard --no-default-features --features "$feature"
  done
  # The tower crate as users pick it besides its default (axum): a plain tower/hyper stack, and
  # tonic alone. Its warnings are errors here too: code behind one feature must not leave the
  # others with unused imports.
  log "syncguard-tower without axum, and with grpc alone"
  cargo clippy -p syncguard-tower --no-default-features -- -D warnings
  cargo clippy -p syncguard-tower --no-default-features --features grpc -- -D warnings
  # Features are unified over the packages a command selects: a default member whose
  # dependencies (dev-dependencies included) turn on a backend makes every plain `cargo run`,
  # `cargo run --example quickstart` included, compile that backend's client.
  log "cargo run --example quickstart builds no backend client"
  tree=$(cargo tree --prefix none -e normal,build,dev)
  if grep -E '^(sqlx|redis|firestore) v' <<<"$tree" | sed 's/ (\*)$//' | sort -u; then
    echo "the workspace's default members pull in the backend clients above" >&2
    exit 1
  fi
  log "rust-version holds for every dependency of every feature"
  python3 scripts/check-msrv.py
  # Packaged in dependency order, each verified (built from its .crate with default features)
  # against the others' packages: about a minute and 260 MB on a fresh 2-core machine.
  log "cargo package"
  # Cargo verifies each package against the others' through a local registry, and takes
  # registry crates as immutable: it unpacks them under $CARGO_HOME/registry/src/-<hash>/ once
  # per checkout path and never rebuilds them. A second run here (same version, new code)
  # would verify against the first run's sources and builds, so both start afresh.
  rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/syncguard-* target/package-verify
  CARGO_TARGET_DIR=target/package-verify \
    cargo package --allow-dirty -p syncguard-macros -p syncguard -p syncguard-tower
  rm -rf target/package-verify
fi

start_services
log "cargo test"
cargo test --workspace --all-features
