#!/usr/bin/env bash
# Experiment only: the Redis bench's cluster-layout row (`multi-cl/64/distinct`, one server)
# with the batch function swapped for the floor of scripts/experiments/lua_cycle_floor.lua,
# beside the real function and the raw ceiling (`raw/64`) in the same round. Behind the
# "floor" table of BENCHMARKS.md (issue 33's target for the cluster layout on one server).
#
# The backend calls its library by a name derived from its code; a library loaded under that
# name first (FUNCTION LOAD REPLACE) is the one it calls. Each round: the real function (its
# library deleted, so that the backend loads it again), then `floor5` (three commands per
# acquire, two per release), then `floor4` (SET ... NX GET: two per free acquire).
#
#   cargo bench -p syncguard --features redis-cluster --bench redis --no-run
#   SYNCGUARD_TEST_REDIS_URL=redis://127.0.0.1:6379 ROUNDS=5 \
#     bash scripts/experiments/bench_floor.sh target/release/deps/redis-<hash>
#
# It deletes and replaces function libraries: never point it at a server you need.
set -euo pipefail

bench=${1:?usage: bench_floor.sh <redis bench binary>}
url=${SYNCGUARD_TEST_REDIS_URL:?set SYNCGUARD_TEST_REDIS_URL to a Redis 7 server of your own}
hostport=${url#redis://}
host=${hostport%:*}
port=${hostport##*:}
rounds=${ROUNDS:-5}
floor=$(dirname "$0")/lua_cycle_floor.lua
cli() { redis-cli -h "$host" -p "$port" "$@"; }

# One bench run: the rows named, then the function's µs per cycle (INFO commandstats: the
# FCALL time divided by the acquires, one SET each).
run() {
  local variant=$1 only=$2
  cli config resetstat >/dev/null
  SYNCGUARD_BENCH_ONLY=$only SYNCGUARD_BENCH_SECS=${SECS:-5} "$bench" --bench 2>&1 |
    grep -E '^\| (raw|multi-cl)/64[^|]*\| [a-z]' |
    awk -F'|' -v v="$variant" '{printf "%-7s %-22s cycles/s %7d  server µs %5.1f  client µs %5.1f\n", v, $2, $6, $10, $12}'
  cli info commandstats | awk -F'[=,]' -v v="$variant" '
    /^cmdstat_fcall:/ {usec = $4} /^cmdstat_set:/ {sets = $2}
    END {if (sets) printf "%-7s function µs per cycle %.2f\n", v, usec / sets}'
}

load_floor() {
  local library=$1 set_nx_get=$2
  { printf '#!lua name=%s\n' "$library"
    sed "s/^local SET_NX_GET = false/local SET_NX_GET = $set_nx_get/" "$floor"
    printf "redis.register_function{function_name='%s', callback=batch, flags={'allow-cross-slot-keys'}}\n" "$library"
  } | cli -x function load replace >/dev/null
}

libraries() { cli function list | grep -o '^syncguard_[0-9a-f]*' || true; }
delete_libraries() { for l in $(libraries); do cli function delete "$l" >/dev/null; done; }

for round in $(seq "$rounds"); do
  echo "== round $round"
  delete_libraries
  run real raw/64,multi-cl/64/distinct
  library=$(libraries | head -1)
  [ -n "$library" ] || { echo "the backend loaded no syncguard library on $url" >&2; exit 1; }
  load_floor "$library" false
  run floor5 multi-cl/64/distinct
  load_floor "$library" true
  run floor4 multi-cl/64/distinct
done
delete_libraries
