#!/usr/bin/env bash
# The one test command: on a fresh Debian machine with Rust, installs what is missing, starts
# the services the tests need on loopback on free ports, runs formatting, lint, docs, per-feature
# builds and every test, and stops what it started (also on failure or Ctrl-C).
#
#   bash scripts/test-all.sh            # everything
#   bash scripts/test-all.sh --tests    # skip fmt/clippy/doc/feature checks
set -euo pipefail
cd "$(dirname "$0")/.."

ONLY_TESTS=0
[ "${1:-}" = "--tests" ] && ONLY_TESTS=1

RUN_DIR=$(mktemp -d /tmp/syncguard-test.XXXXXX)
chmod 755 "$RUN_DIR"
CLEANUPS=()
cleanup() {
  local status=$?
  for ((i = ${#CLEANUPS[@]} - 1; i >= 0; i--)); do eval "${CLEANUPS[$i]}" || true; done
  rm -rf "$RUN_DIR"
  exit "$status"
}
trap cleanup EXIT INT TERM

log() { printf '\n==> %s\n' "$*"; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
APT_UPDATED=0
apt_install() {
  if [ "$APT_UPDATED" = 0 ]; then
    $SUDO apt-get update -qq
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

wait_for() { # wait_for <what> <seconds> <command...>
  local what=$1 seconds=$2
  shift 2
  for ((i = 0; i < seconds * 10; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "error: $what did not come up within ${seconds}s" >&2
  return 1
}

command -v python3 >/dev/null || apt_install python3

# --- services -------------------------------------------------------------------------------
# Each start_* function installs its server if missing, starts it on a free loopback port,
# registers its shutdown in CLEANUPS and exports the variable the tests read.

# --- checks and tests ------------------------------------------------------------------------
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
if [ "$ONLY_TESTS" = 0 ]; then
  log "cargo fmt --check"
  cargo fmt --all --check
  log "cargo clippy"
  cargo clippy --workspace --all-targets --all-features -- -D warnings
  log "cargo doc"
  RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features --workspace
  log "each feature of syncguard on its own"
  cargo check -p syncguard --no-default-features
  for feature in memory conformance; do
    cargo check -p syncguard --no-default-features --features "$feature"
  done
fi

log "cargo test"
cargo test --workspace --all-features
