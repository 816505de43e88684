#!/usr/bin/env bash
# A real high-availability PostgreSQL cluster on loopback, for the failover proof (issue 31;
# docs/operations.md "High availability"): one etcd member and three Patroni nodes running
# Debian's PostgreSQL (the newest major installed under /usr/lib/postgresql; 15 on Debian 12)
# with synchronous replication. Everything lives under $HA_DIR (default /tmp/idemgate-ha) and
# listens on 127.0.0.1 only, on fixed ports (so one cluster per machine at a time):
#
#   etcd        client 23790, peer 23800
#   node1..3    PostgreSQL 25431..25433, Patroni REST API 28001..28003
#
#   .ci/ha.sh start            install patroni/etcd-server if missing, start the cluster, wait
#                              for a leader and a synchronous standby, create database idemgate
#   .ci/ha.sh url              the DATABASE_URL of the cluster (all three hosts, read-write)
#   .ci/ha.sh leader           the name of the current leader (node1..3)
#   .ci/ha.sh status           what Patroni says of each member (role, state, lag)
#   .ci/ha.sh kill NODE        SIGKILL of the node's Patroni and every process of its PostgreSQL:
#                              the machine dies; a standby takes over once the leader key's TTL ends
#   .ci/ha.sh crash NODE       SIGKILL of the node's PostgreSQL only (postmaster and backends):
#                              its Patroni keeps the leader key and restarts it in place
#   .ci/ha.sh revive NODE      start the killed node's Patroni again; it rejoins as a standby
#                              (pg_rewind, or a new base backup if the rewind fails)
#   .ci/ha.sh switchover       a planned switchover to the synchronous standby (Patroni REST API)
#   .ci/ha.sh wait-healthy     until a leader and 2 running standbys, one synchronous (60 s bound)
#   .ci/ha.sh stop             kill everything and remove $HA_DIR
#
# Why these settings (the cluster must fit a 2-core machine beside the tests):
#  - synchronous_mode: true, synchronous_commit: on. A commit is acknowledged to idemgate only
#    once the synchronous standby has flushed its WAL to disk, and Patroni promotes only a
#    standby that was synchronous, so no acknowledged admission, outcome or release is lost
#    when the primary dies. remote_write would acknowledge before the standby's fsync (a
#    standby's OS crash could lose it); remote_apply is only needed to read your writes on a
#    standby, and idemgate reads only from the primary. synchronous_mode_strict stays off: with
#    both standbys gone the primary goes on alone (availability), and Patroni then refuses to
#    promote a node that was not synchronous, so it still loses nothing.
#  - ttl 10 s, loop_wait 1 s, retry_timeout 3 s (Patroni needs loop_wait + 2 × retry_timeout
#    <= ttl): an unplanned failover takes about ttl; the defaults (30/10/10) take ~30 s.
#  - shared_buffers 16MB, max_connections 60: three servers beside the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
HA_DIR=${HA_DIR:-/tmp/idemgate-ha}
ETCD_CLIENT=23790
ETCD_PEER=23800
NODES=(node1 node2 node3)
log() { printf 'ha.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

pg_port() { echo $((25430 + ${1#node})); }
api_port() { echo $((28000 + ${1#node})); }

install() {
  command -v patroni >/dev/null && command -v etcd >/dev/null && return
  [ "$(id -u)" = 0 ] || die "patroni and etcd-server are not installed and we are not root: apt-get install patroni etcd-server python3-etcd"
  log "installing Debian's patroni and etcd-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends patroni etcd-server python3-etcd >/dev/null
  # The packages' own services are not used (and cannot start under policy-rc.d anyway).
}

# as_postgres runs a command as the postgres user when we are root: PostgreSQL refuses to run
# as root, and Patroni starts it as its own user.
as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

cluster_json() { curl -sf --max-time 2 "http://127.0.0.1:$(api_port "${1:-node1}")/cluster" 2>/dev/null; }

# any_cluster_json asks each live node's REST API for the cluster view.
any_cluster_json() {
  local n
  for n in "${NODES[@]}"; do cluster_json "$n" && return 0; done
  return 1
}

members() {
  local json
  json=$(any_cluster_json) || return 0 # no node answers: no members
  python3 -c '
import json, sys
for m in json.load(sys.stdin).get("members", []):
    print(m["name"], m["role"], m["state"], m.get("lag", ""), m.get("timeline", ""))' <<<"$json"
}

leader() { members | awk '$2 == "leader" && $3 == "running" { print $1 }'; }

healthy() {
  members | awk '$2 == "leader" && $3 == "running" { l++ } $2 == "sync_standby" && ($3 == "running" || $3 == "streaming") { s++ }
    $2 == "replica" && ($3 == "running" || $3 == "streaming") { r++ } END { exit !(l == 1 && s == 1 && s + r == 2) }'
}

wait_healthy() {
  local deadline=$((SECONDS + ${1:-60}))
  until healthy; do
    [ $SECONDS -lt $deadline ] || { members >&2 || true; die "cluster not healthy after ${1:-60} s"; }
    sleep 0.5
  done
}

write_config() {
  local n=$1 d="$HA_DIR/$1"
  mkdir -p "$d"
  cat >"$d/patroni.yml" <<EOF
scope: idemgate-ha
name: $n
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:$(api_port "$n")
  connect_address: 127.0.0.1:$(api_port "$n")
etcd3:
  hosts: 127.0.0.1:$ETCD_CLIENT
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      remove_data_directory_on_rewind_failure: true
      remove_data_directory_on_diverged_timelines: true
      parameters:
        synchronous_commit: "on"
        wal_log_hints: "on"
        shared_buffers: 16MB
        max_connections: 60
        max_wal_senders: 6
        max_replication_slots: 6
        wal_keep_size: 128MB
        fsync: "on"
        log_min_messages: warning
  initdb:
    - encoding: UTF8
    - locale: C.UTF-8
  pg_hba:
    - local all all trust
    - host replication replicator 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$(pg_port "$n")
  connect_address: 127.0.0.1:$(pg_port "$n")
  data_dir: $d/data
  bin_dir: $PGBIN
  pgpass: $d/pgpass
  authentication:
    replication: {username: replicator, password: replicator}
    superuser: {username: postgres, password: postgres}
    rewind: {username: postgres, password: postgres}
  parameters:
    unix_socket_directories: $d
EOF
}

start_node() {
  local n=$1 d="$HA_DIR/$1"
  chown -R postgres: "$d" 2>/dev/null || true
  as_postgres setsid patroni "$d/patroni.yml" >>"$d/patroni.log" 2>&1 </dev/null &
  echo $! >"$d/patroni.pid"
}

start() {
  install
  PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
  [ -n "$PGBIN" ] && [ -x "$PGBIN/postgres" ] || die "no PostgreSQL binaries under /usr/lib/postgresql"
  if healthy 2>/dev/null; then log "already running"; return; fi
  stop_all
  mkdir -p "$HA_DIR"
  chmod 755 "$HA_DIR"
  log "starting etcd on 127.0.0.1:$ETCD_CLIENT"
  etcd --name ha --data-dir "$HA_DIR/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT" --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-cluster "ha=http://127.0.0.1:$ETCD_PEER" \
    --log-level warn >"$HA_DIR/etcd.log" 2>&1 </dev/null &
  echo $! >"$HA_DIR/etcd.pid"
  for _ in $(seq 100); do
    curl -sf --max-time 1 "http://127.0.0.1:$ETCD_CLIENT/health" >/dev/null && break
    sleep 0.1
  done
  curl -sf --max-time 1 "http://127.0.0.1:$ETCD_CLIENT/health" >/dev/null || die "etcd did not start: $(tail -5 "$HA_DIR/etcd.log")"
  log "starting Patroni nodes ${NODES[*]} (PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'))"
  for n in "${NODES[@]}"; do write_config "$n"; done
  start_node node1 # the first to start bootstraps the cluster (initdb); the others clone it
  local deadline=$((SECONDS + 60))
  until [ -n "$(leader 2>/dev/null)" ]; do
    [ $SECONDS -lt $deadline ] || die "no leader after 60 s: $(tail -20 "$HA_DIR/node1/patroni.log")"
    sleep 0.5
  done
  start_node node2
  start_node node3
  wait_healthy 90
  as_postgres psql "$(url postgres)" -qc 'CREATE DATABASE idemgate' >/dev/null
  log "healthy: $(members | tr '\n' ';')"
}

# url is the cluster's DATABASE_URL: every node, and only a read-write session is accepted,
# so a connection always lands on the current primary (pgx and libpq try the hosts in order).
url() {
  local hosts="" n
  for n in "${NODES[@]}"; do hosts+="${hosts:+,}127.0.0.1:$(pg_port "$n")"; done
  echo "postgres://postgres@$hosts/${1:-idemgate}?sslmode=disable&target_session_attrs=read-write&connect_timeout=2"
}

crash_node() {
  local d="$HA_DIR/$1" pid
  [ -f "$d/data/postmaster.pid" ] || die "$1: PostgreSQL is not running"
  pid=$(head -1 "$d/data/postmaster.pid")
  kill -9 "$pid" $(pgrep -P "$pid" || true)
}

kill_node() {
  local d="$HA_DIR/$1" pid
  # Patroni first, so it cannot restart its PostgreSQL in between. (As root, patroni.pid is
  # runuser's pid, not Patroni's: match Patroni by its command line.)
  pkill -9 -f -- "patroni $d/patroni.yml" 2>/dev/null || true
  [ -f "$d/patroni.pid" ] && kill -9 "$(cat "$d/patroni.pid")" 2>/dev/null || true
  if [ -f "$d/data/postmaster.pid" ]; then
    pid=$(head -1 "$d/data/postmaster.pid")
    # The postmaster and all its children at once, so no orphaned backend keeps answering.
    kill -9 "$pid" $(pgrep -P "$pid" || true) 2>/dev/null || true
  fi
  # Anything of this node's PostgreSQL left (a process started meanwhile).
  pkill -9 -f -- "postgres -D $d/data" 2>/dev/null || true
}

switchover() {
  local l
  l=$(leader)
  [ -n "$l" ] || die "no leader to switch over from"
  curl -sSf --max-time 30 -XPOST "http://127.0.0.1:$(api_port "$l")/switchover" -d "{\"leader\":\"$l\"}"
  echo
}

stop_all() {
  local n
  for n in "${NODES[@]}"; do kill_node "$n"; done
  [ -f "$HA_DIR/etcd.pid" ] && kill -9 "$(cat "$HA_DIR/etcd.pid")" 2>/dev/null || true
  pkill -9 -f -- "--data-dir $HA_DIR/etcd" 2>/dev/null || true
  rm -rf "$HA_DIR"
}

case "${1:-}" in
start) start ;;
url) url "${2:-}" ;;
leader) leader ;;
status) members ;;
kill) kill_node "${2:?node}" ;;
crash) crash_node "${2:?node}" ;;
revive) start_node "${2:?node}" ;;
switchover) switchover ;;
wait-healthy) wait_healthy "${2:-60}" ;;
stop) stop_all ;;
*) die "usage: $0 start|url|leader|status|kill NODE|crash NODE|revive NODE|switchover|wait-healthy [SECONDS]|stop" ;;
esac
