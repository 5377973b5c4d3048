# Sourced by test-all.sh and with-services.sh: installs what is missing and starts the servers
# the tests need, on loopback on free ports, each registered for shutdown in CLEANUPS.
# Exports:
#   SYNCGUARD_TEST_POSTGRES_URL   postgres://postgres@127.0.0.1:<port>/postgres
#   SYNCGUARD_TEST_REDIS_URL      redis://127.0.0.1:<port>
#   SYNCGUARD_REDIS_SERVER_BIN    the redis-server binary (for tests that restart their own)
#   SYNCGUARD_REDIS_CLI_BIN       the redis-cli binary (for tests that create clusters of their own)
#   SYNCGUARD_TEST_REDIS_CLUSTER_URL    redis-cluster://127.0.0.1:<port>,127.0.0.1:<port>,127.0.0.1:<port>
#                                 a Redis Cluster (7+) of 3 primaries, each with 1 replica; the
#                                 URL lists the primaries as seeds. Tests must not stop its nodes.
#   SYNCGUARD_TEST_REDIS_CLUSTER_NODES  127.0.0.1:<port>,... all six nodes, primaries and replicas
#   SYNCGUARD_TEST_REDIS_SENTINEL_URL   redis+sentinel://127.0.0.1:<port>,...,.../syncguard
#                                 3 Sentinels watching a primary (name `syncguard`) with 1
#                                 replica. Tests must not fail it over (tests/support/sentinels.rs
#                                 starts groups of their own for that).
#   SYNCGUARD_POSTGRES_BIN        PostgreSQL's bin directory (for tests that run their own)
#   FIRESTORE_EMULATOR_HOST       127.0.0.1:<port> of the Cloud Firestore emulator
#   SYNCGUARD_TEST_FIRESTORE_PROJECT  base project id; Firestore tests derive one per test
# TLS (tests/tls.rs): PostgreSQL also accepts TLS on its one port (ssl=on; plain connections
# still work, though sqlx's default sslmode=prefer picks TLS in builds with postgres-tls), and
# Redis listens for TLS on a second port; both present a certificate for 127.0.0.1 and
# localhost signed by a CA made for this run.
#   SYNCGUARD_TEST_TLS_CA         PEM file of that CA
#   SYNCGUARD_TEST_TLS_OTHER_CA   PEM file of another CA, which signed nothing the servers present
#   SYNCGUARD_TEST_TLS_CERT       PEM file of that certificate for 127.0.0.1 (signed by the CA)
#   SYNCGUARD_TEST_TLS_KEY        PEM file of its private key (for servers a test starts itself,
#                                 such as the TLS Redis Cluster of tests/support/cluster.rs)
#   SYNCGUARD_TEST_REDIS_TLS_URL  rediss://127.0.0.1:<tls port>

RUN_DIR=$(mktemp -d /tmp/syncguard-services.XXXXXX)
chmod 755 "$RUN_DIR"
CLEANUPS=()
cleanup() {
  local status=$?
  for ((i = ${#CLEANUPS[@]} - 1; i >= 0; i--)); do eval "${CLEANUPS[$i]}" >/dev/null 2>&1 || true; done
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
  # Package scripts must not start system-wide servers: we run our own on free ports.
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  $SUDO rm -f /usr/sbin/policy-rc.d
}

free_ports() { # free_ports <n>: n distinct free loopback ports, space-separated
  # All bound at once, so that no port comes twice.
  python3 -c 'import socket, sys
sockets = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in sockets: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in sockets))' "$1"
}

free_port() { free_ports 1; }

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

quietly() { # quietly <command...>: its output only if it fails (openssl chats on stderr)
  local out
  out=$("$@" 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
}

command -v python3 >/dev/null || apt_install python3

TLS_DIR="$RUN_DIR/tls"
# A throwaway CA, a server certificate it signs for 127.0.0.1 and localhost, and a second CA
# that signs nothing (for the untrusted-certificate tests). Made once, on first use.
make_test_certs() {
  [ -f "$TLS_DIR/server.crt" ] && return 0
  command -v openssl >/dev/null || { log "installing OpenSSL"; apt_install openssl; }
  mkdir -p "$TLS_DIR"
  chmod 755 "$TLS_DIR"
  # Our own config, so that the system's openssl.cnf adds nothing rustls would reject.
  cat >"$TLS_DIR/openssl.cnf" <<'CNF'
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
# clientAuth too: the nodes of a TLS Redis Cluster present it to each other on the cluster bus,
# which always asks for and checks a client certificate.
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
CNF
  local name
  for name in ca other-ca; do
    quietly openssl req -x509 -config "$TLS_DIR/openssl.cnf" -extensions ca -newkey ec \
      -pkeyopt ec_paramgen_curve:P-256 -noenc -days 7 -subj "/CN=syncguard test $name" \
      -keyout "$TLS_DIR/$name.key" -out "$TLS_DIR/$name.crt"
  done
  quietly openssl req -new -config "$TLS_DIR/openssl.cnf" -newkey ec \
    -pkeyopt ec_paramgen_curve:P-256 -noenc -subj "/CN=localhost" \
    -keyout "$TLS_DIR/server.key" -out "$TLS_DIR/server.csr"
  quietly openssl x509 -req -in "$TLS_DIR/server.csr" -CA "$TLS_DIR/ca.crt" \
    -CAkey "$TLS_DIR/ca.key" -set_serial "0x$(openssl rand -hex 8)" -days 7 \
    -extfile "$TLS_DIR/openssl.cnf" -extensions server -out "$TLS_DIR/server.crt"
  chmod 644 "$TLS_DIR"/*.crt
  chmod 600 "$TLS_DIR"/*.key
  export SYNCGUARD_TEST_TLS_CA="$TLS_DIR/ca.crt"
  export SYNCGUARD_TEST_TLS_OTHER_CA="$TLS_DIR/other-ca.crt"
  export SYNCGUARD_TEST_TLS_CERT="$TLS_DIR/server.crt"
  export SYNCGUARD_TEST_TLS_KEY="$TLS_DIR/server.key"
}

start_postgres() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$bin" ] || [ ! -x "$bin/postgres" ]; then
    log "installing PostgreSQL"
    apt_install postgresql postgresql-client
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  local port dir run_as=()
  port=$(free_port)
  dir="$RUN_DIR/postgres"
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then
    # PostgreSQL refuses to run as root.
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    chown postgres "$dir"
    run_as=(runuser -u postgres --)
  fi
  "${run_as[@]}" "$bin/initdb" -D "$dir/data" -U postgres -A trust --no-sync >"$dir/initdb.log"
  # TLS as well as plain connections (pg_hba's `host` lines match both). PostgreSQL wants its
  # key owned by the user it runs as, mode 0600.
  make_test_certs
  cp "$TLS_DIR/server.crt" "$TLS_DIR/server.key" "$dir/"
  if [ "$(id -u)" = 0 ]; then chown postgres "$dir/server.crt" "$dir/server.key"; fi
  "${run_as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300 -c ssl=on \
      -c ssl_cert_file=$dir/server.crt -c ssl_key_file=$dir/server.key" start >/dev/null
  CLEANUPS+=("${run_as[*]} $bin/pg_ctl -D $dir/data -m immediate stop")
  export SYNCGUARD_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/postgres"
  # For tests that run (and kill, and restart) PostgreSQL servers of their own.
  export SYNCGUARD_POSTGRES_BIN="$bin"
  log "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port"
}

start_redis() {
  if ! command -v redis-server >/dev/null; then
    log "installing Redis"
    apt_install redis-server
  fi
  local port dir tls=() tls_port=""
  port=$(free_port)
  dir="$RUN_DIR/redis"
  mkdir -p "$dir"
  # A second, TLS port (clients need not present certificates), if this build has TLS: an
  # unknown --tls-port would stop the server from starting at all.
  # Not `grep -q`: it exits at the first match, ldd then dies of SIGPIPE, and under pipefail
  # the check would fail at random.
  if ldd "$(command -v redis-server)" 2>/dev/null | grep libssl >/dev/null; then
    make_test_certs
    tls_port=$(free_port)
    tls=(--tls-port "$tls_port" --tls-cert-file "$TLS_DIR/server.crt"
      --tls-key-file "$TLS_DIR/server.key" --tls-ca-cert-file "$TLS_DIR/ca.crt"
      --tls-auth-clients no)
  else
    echo "warning: $(command -v redis-server) is built without TLS; the rediss:// tests will" \
      "fail (install Debian's redis-server 6+, which is built with TLS)" >&2
  fi
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" "${tls[@]}"
  wait_for "redis-server" 30 redis-cli -p "$port" ping
  CLEANUPS+=("redis-cli -p $port shutdown nosave")
  export SYNCGUARD_TEST_REDIS_URL="redis://127.0.0.1:$port"
  if [ -n "$tls_port" ]; then export SYNCGUARD_TEST_REDIS_TLS_URL="rediss://127.0.0.1:$tls_port"; fi
  SYNCGUARD_REDIS_SERVER_BIN=$(command -v redis-server)
  export SYNCGUARD_REDIS_SERVER_BIN
  log "$(redis-server --version | awk '{print $1, $3}') on 127.0.0.1:$port${tls_port:+, TLS on 127.0.0.1:$tls_port}"
}

# Whether the Redis Cluster node on port $1 is ready: it serves all 16384 slots
# (cluster_state:ok), sees $2 primaries holding slots and $3 replicas, each connected and none
# suspected of failing, and, if it is a replica, its link to its primary is up.
redis_cluster_node_ready() {
  local port=$1 primaries=$2 replicas=$3 info
  info=$(redis-cli -p "$port" cluster info | tr -d '\r') || return 1
  [[ $info == *cluster_state:ok* && $info == *cluster_slots_ok:16384* ]] || return 1
  redis-cli -p "$port" cluster nodes | awk -v primaries="$primaries" -v replicas="$replicas" '
    $3 ~ /fail|handshake|noaddr/ || $8 != "connected" { bad = 1 }
    $3 ~ /master/ && NF > 8 { serving++ }
    $3 ~ /slave/ { following++ }
    END { exit !(!bad && serving == primaries && following == replicas) }' || return 1
  info=$(redis-cli -p "$port" info replication | tr -d '\r') || return 1
  [[ $info == *role:master* || $info == *master_link_status:up* ]]
}

# The nodes the cluster node on port $1 sees in role $2 (master, slave), as sorted
# host:port,host:port,...
redis_cluster_nodes_in_role() {
  redis-cli -p "$1" cluster nodes | awk -v role="$2" '$3 ~ role { sub(/@.*/, "", $2); print $2 }' |
    sort | paste -sd, -
}

# A Redis Cluster of 3 primaries with 1 replica each, on loopback (see the header). Its node
# timeout is short (2 s), so that a failover takes seconds; tests that kill or pause nodes
# start clusters of their own (tests/support/cluster.rs) and leave this one alone.
start_redis_cluster() {
  if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    log "installing Redis"
    apt_install redis-server
  fi
  local version
  version=$(redis-server --version | sed -n 's/.* v=\([0-9]*\)\..*/\1/p')
  if [ "${version:-0}" -lt 7 ]; then
    echo "error: the Redis Cluster tests need redis-server 7 or later (for --cluster-port);" \
      "$(command -v redis-server) is $(redis-server --version | awk '{print $3}')" >&2
    return 1
  fi
  local dir="$RUN_DIR/redis-cluster" started ports=() buses=() addrs=() port i
  started=$(date +%s.%N)
  read -r -a ports <<<"$(free_ports 12)"
  # Each node's cluster bus gets a free port of its own: the default, port + 10000, can lie
  # past 65535 for the high ports free_ports hands out.
  buses=("${ports[@]:6}")
  ports=("${ports[@]:0:6}")
  for i in "${!ports[@]}"; do
    port=${ports[$i]}
    mkdir -p "$dir/$port"
    # No persistence, and replicas sync at once (diskless, without the default 5 s delay).
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$port" --cluster-enabled yes \
      --cluster-port "${buses[$i]}" --cluster-config-file nodes.conf \
      --cluster-node-timeout 2000 --appendonly no --save "" --repl-diskless-sync-delay 0 \
      --daemonize yes --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log"
    # NOW: a primary does not wait for its replicas to catch up before it stops.
    CLEANUPS+=("redis-cli -p $port shutdown nosave now")
    addrs+=("127.0.0.1:$port")
  done
  for port in "${ports[@]}"; do
    wait_for "Redis Cluster node 127.0.0.1:$port (log: $dir/$port/redis.log)" 30 \
      redis-cli -p "$port" ping
  done
  # redis-cli waits for the nodes to meet without a deadline of its own.
  if ! quietly timeout 60 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 \
    --cluster-yes; then
    echo "error: redis-cli --cluster create failed (logs: $dir/*/redis.log)" >&2
    return 1
  fi
  local ready="cluster_state:ok with 16384 slots, 3 primaries and 3 replicas connected, a replica's link up"
  for port in "${ports[@]}"; do
    if ! wait_for "Redis Cluster node 127.0.0.1:$port ($ready; log: $dir/$port/redis.log)" 60 \
      redis_cluster_node_ready "$port" 3 3; then
      redis-cli -p "$port" cluster info >&2 || true
      redis-cli -p "$port" cluster nodes >&2 || true
      tail -n 20 "$dir/$port/redis.log" >&2
      return 1
    fi
  done
  local seeds replicas
  seeds=$(redis_cluster_nodes_in_role "${ports[0]}" master)
  replicas=$(redis_cluster_nodes_in_role "${ports[0]}" slave)
  export SYNCGUARD_TEST_REDIS_CLUSTER_URL="redis-cluster://$seeds"
  SYNCGUARD_TEST_REDIS_CLUSTER_NODES=$(IFS=,; echo "${addrs[*]}")
  export SYNCGUARD_TEST_REDIS_CLUSTER_NODES
  SYNCGUARD_REDIS_CLI_BIN=$(command -v redis-cli)
  export SYNCGUARD_REDIS_CLI_BIN
  log "Redis Cluster: primaries $seeds, replicas $replicas (up in $(python3 -c "import time; print(f'{time.time() - $started:.1f}')")s)"
}

FIRESTORE_EMULATOR=${FIRESTORE_EMULATOR:-/usr/lib/google-cloud-sdk/platform/cloud-firestore-emulator/cloud_firestore_emulator}

start_firestore() {
  if [ ! -x "$FIRESTORE_EMULATOR" ]; then
    echo "error: the Cloud Firestore emulator is missing ($FIRESTORE_EMULATOR): install the" \
      "Google Cloud SDK component cloud-firestore-emulator (apt-get install" \
      "google-cloud-cli-firestore-emulator from Google's apt repository, or" \
      "gcloud components install cloud-firestore-emulator), or set FIRESTORE_EMULATOR to its" \
      "launcher" >&2
    return 1
  fi
  command -v java >/dev/null || { log "installing Java for the Firestore emulator"; apt_install default-jre-headless; }
  command -v curl >/dev/null || apt_install curl
  command -v setsid >/dev/null || apt_install util-linux
  local port dir pid started
  port=$(free_port)
  dir="$RUN_DIR/firestore"
  mkdir -p "$dir"
  started=$(date +%s.%N)
  # setsid: the launcher and its java child get their own process group, stopped as a whole.
  setsid "$FIRESTORE_EMULATOR" start --host=127.0.0.1 --port="$port" >"$dir/emulator.log" 2>&1 &
  pid=$!
  CLEANUPS+=("kill -- -$pid; sleep 0.5; kill -9 -- -$pid")
  if ! wait_for "the Firestore emulator (log: $dir/emulator.log)" 120 curl -sf "http://127.0.0.1:$port/"; then
    tail -n 20 "$dir/emulator.log" >&2
    return 1
  fi
  export FIRESTORE_EMULATOR_HOST="127.0.0.1:$port"
  export SYNCGUARD_TEST_FIRESTORE_PROJECT="syncguard-test-$$"
  log "Firestore emulator on 127.0.0.1:$port (up in $(python3 -c "import time; print(f'{time.time() - $started:.1f}')")s)"
}

# Whether the replica on port $1 has its link to the primary up.
redis_replica_linked() {
  redis-cli -p "$1" info replication | tr -d '\r' | grep -x master_link_status:up >/dev/null
}

# Whether the Sentinel on port $1 names the primary on port $2 and sees its replica.
redis_sentinel_ready() {
  redis-cli -p "$1" sentinel get-master-addr-by-name syncguard | grep -x "$2" >/dev/null &&
    [ "$(redis-cli -p "$1" sentinel replicas syncguard | grep -c '^name$')" -ge 1 ]
}

# Redis behind Sentinel: a primary, its replica and 3 Sentinels, on loopback (see the header).
start_redis_sentinel() {
  local dir="$RUN_DIR/redis-sentinel" primary replica sentinels=() port started
  started=$(date +%s.%N)
  primary=$(free_port)
  replica=$(free_port)
  for port in "$primary" "$replica"; do
    mkdir -p "$dir/$port"
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$port" --save "" --appendonly no \
      --daemonize yes --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log" \
      $([ "$port" = "$replica" ] && echo "--replicaof 127.0.0.1 $primary")
    CLEANUPS+=("redis-cli -p $port shutdown nosave")
  done
  wait_for "the Sentinel group's replica (log: $dir/$replica/redis.log)" 30 \
    redis_replica_linked "$replica" || return 1
  for _ in 1 2 3; do
    port=$(free_port)
    sentinels+=("$port")
    mkdir -p "$dir/s$port"
    # Sentinel rewrites its configuration file: one of its own, in its own directory.
    cat >"$dir/s$port/sentinel.conf" <<CONF
port $port
bind 127.0.0.1
dir $dir/s$port
pidfile $dir/s$port/sentinel.pid
logfile $dir/s$port/sentinel.log
daemonize yes
sentinel monitor syncguard 127.0.0.1 $primary 2
sentinel down-after-milliseconds syncguard 2000
sentinel failover-timeout syncguard 10000
CONF
    redis-server "$dir/s$port/sentinel.conf" --sentinel
    CLEANUPS+=("kill \$(cat $dir/s$port/sentinel.pid)")
  done
  for port in "${sentinels[@]}"; do
    wait_for "Sentinel 127.0.0.1:$port naming the primary and its replica (log: $dir/s$port/sentinel.log)" 30 \
      redis_sentinel_ready "$port" "$primary" || return 1
  done
  local addrs
  addrs=$(printf '127.0.0.1:%s,' "${sentinels[@]}")
  export SYNCGUARD_TEST_REDIS_SENTINEL_URL="redis+sentinel://${addrs%,}/syncguard"
  log "Redis Sentinel: primary 127.0.0.1:$primary, replica 127.0.0.1:$replica, Sentinels ${addrs%,} (up in $(python3 -c "import time; print(f'{time.time() - $started:.1f}')")s)"
}

start_services() {
  start_postgres
  start_redis
  start_redis_cluster
  start_redis_sentinel
  start_firestore
}
