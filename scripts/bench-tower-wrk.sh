#!/usr/bin/env bash
# The Tower layer's overhead on the server alone, with the load from another process (wrk).
#
# Each measurement runs two fresh server processes at once on CPU 1, the plain router and one
# layered router, each loaded by its own wrk (16 connections, fresh Idempotency-Key per request)
# from CPU 0. Both are saturated, so the scheduler gives each half of CPU 1, and the ratio of
# their requests is the ratio of their CPU cost per request: the machine's drifts in speed hit
# both alike, which sequential runs on this shared VM could not ensure. The kinds:
#
#   plain    the router again: the method's own noise (an A/A test)
#   locked   Router::layer(LockLayer::for_axum(..))
#   wrapped  Router::layer(LockLayer::new(..))
#   around   LockLayer::for_axum(..) around the whole router
#
# Each kind is measured `pairs` times (fresh processes each time, so that no one process's
# memory layout decides); the table gives the median overhead and its quartiles.
#
#   [KINDS="plain locked wrapped around"] scripts/bench-tower-wrk.sh [pairs=8] [seconds=5] [connections=16]
#
# Needs wrk (Debian: apt-get install wrk) and taskset (util-linux).
set -euo pipefail
pairs=${1:-8}
seconds=${2:-5}
connections=${3:-16}
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
cd "$(dirname "$0")/.."
cargo bench -p syncguard-tower --bench overhead --no-run >/dev/null 2>&1
bin=$(ls -t target/release/deps/overhead-* | grep -v '\.d$' | head -1)
script=syncguard-tower/benches/wrk-idempotency.lua
read -r -a kinds <<<"${KINDS:-plain locked wrapped around}"
servers=()
trap 'kill "${servers[@]}" 2>/dev/null || true' EXIT
# CPU time of all of a server's threads, in microseconds (the scheduler's own count, not ticks).
cpu() { cat /proc/"$1"/task/*/schedstat | awk '{ns += $1} END {printf "%d\n", ns / 1000}'; }
load() { taskset -c 0 wrk -t1 -c"$connections" -d"$2" -s "$script" "http://127.0.0.1:$1/jobs"; }
results=$(mktemp)
for pair in $(seq "$pairs"); do
  for j in "${!kinds[@]}"; do
    kind=${kinds[$(( (j + pair) % ${#kinds[@]} ))]}
    taskset -c 1 "$bin" serve plain 18101 1 >/dev/null &
    servers=($!)
    taskset -c 1 "$bin" serve "$kind" 18102 1 >/dev/null &
    servers+=($!)
    for port in 18101 18102; do
      for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
    done
    load 18101 1s >/dev/null & warm=$!; load 18102 1s >/dev/null; wait "$warm" # warm up, together
    before=("$(cpu "${servers[0]}")" "$(cpu "${servers[1]}")")
    load 18101 "${seconds}s" >"$results.plain" & first=$!
    load 18102 "${seconds}s" >"$results.kind"; wait "$first"
    after=("$(cpu "${servers[0]}")" "$(cpu "${servers[1]}")")
    kill "${servers[@]}"; wait "${servers[@]}" 2>/dev/null || true
    plain=$(awk '/requests in/ {print $1}' "$results.plain")
    layered=$(awk '/requests in/ {print $1}' "$results.kind")
    line="$kind $plain $layered $(( after[0] - before[0] )) $(( after[1] - before[1] ))"
    echo "$pair $line" >&2
    echo "$line" >>"$results"
  done
done
python3 - "$results" "$seconds" "$connections" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
seconds, connections = float(sys.argv[2]), sys.argv[3]
names = {"plain": "plain router (A/A: the method's noise)",
         "locked": "router + `LockLayer::for_axum`",
         "wrapped": "router + `LockLayer::new`",
         "around": "`LockLayer::for_axum` around the router"}
def spread(values):
    values = sorted(values)
    q = len(values) // 4
    return f"**{statistics.median(values):+.1f} %** ({values[q]:+.1f} %, {values[-1 - q]:+.1f} %)"
print(f"| router, against the plain router at once | pairs | its req/s | overhead, req/s (quartiles) | overhead, CPU/request (quartiles) |")
print("|---|---:|---:|---:|---:|")
for kind, name in names.items():
    mine = [list(map(int, r[1:])) for r in rows if r[0] == kind]
    if not mine:
        continue
    rps = statistics.median(r[1] / seconds for r in mine)
    by_rps = spread((p / l - 1) * 100 for p, l, _, _ in mine)
    by_cpu = spread(((cl / l) / (cp / p) - 1) * 100 for p, l, cp, cl in mine)
    print(f"| {name} | {len(mine)} | {rps:.0f} | {by_rps} | {by_cpu} |")
PY
rm -f "$results" "$results.plain" "$results.kind"
