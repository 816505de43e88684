#!/usr/bin/env bash
# make bench, second half: start idemgate on a throwaway PostgreSQL database and run
# ../shared/bench/compare.sh against it, for new keys and for duplicates (DUP_EVERY=4: every
# key is acquired four times), at 16 and 64 connections. Prints the ratio to the floor server.
# Env passed through to compare.sh: CONNS, SECONDS_EACH, REPEATS.
set -euo pipefail
cd "$(dirname "$0")/.."
compare=${COMPARE:-../shared/bench/compare.sh}
[ -x "$compare" ] || [ -f "$compare" ] || { echo "bench.sh: $compare not found" >&2; exit 2; }
command -v wrk >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -qq wrk >/dev/null; } || { echo "bench.sh: install wrk" >&2; exit 2; }
db=idemgate_bench
psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
tmp=$(mktemp -d); pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS '$db' WITH (FORCE)" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
go build -o "$tmp/idemgate" .
key=idg_bench_$(head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 32)
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db?sslmode=disable" IDEMGATE_ADDR=127.0.0.1:$port \
  IDEMGATE_BOOTSTRAP_API_KEY=$key IDEMGATE_ADMIN_PASSWORD=bench-password-123 IDEMGATE_LOG_FORMAT=json \
  "$tmp/idemgate" serve >"$tmp/server.log" 2>&1 & pid=$!
for _ in $(seq 100); do curl -sf "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
echo "== new keys (every request a fresh key)"
IDEMGATE_API_KEY=$key bash "$compare" "http://127.0.0.1:$port"
echo "== duplicates (DUP_EVERY=4: one admission, three duplicates per key)"
DUP_EVERY=4 IDEMGATE_API_KEY=$key bash "$compare" "http://127.0.0.1:$port"
