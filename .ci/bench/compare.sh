#!/usr/bin/env bash
# compare.sh URL: loads idemgate's POST /v1/acquire at URL and the floor server (floor.go: the
# least work a durable acquire with an attempt row can do, one SQL statement through pgx) in
# turns, idemgate then floor, REPEATS times, in the same run; prints the median rate and p99 of
# each and their ratio. A ratio is what make bench reports: it holds across machines and noisy
# neighbours, an absolute rate does not.
#
# Needs wrk, Go and PostgreSQL on 127.0.0.1:5432 (user postgres, trust). Env: IDEMGATE_API_KEY
# (required: a key of the server under test), CONNS (default "16 64"), SECONDS_EACH (10),
# REPEATS (3), DUP_EVERY and HOT_KEYS (passed to acquire.lua: duplicates, a retry storm).
# Output rows: conns idemgate/s floor/s idem_p99 floor_p99 ratio non2xx (idemgate's).
set -euo pipefail
url=${1:?usage: compare.sh http://127.0.0.1:PORT}
: "${IDEMGATE_API_KEY:?set IDEMGATE_API_KEY to an API key of the idemgate under test}"
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
conns=${CONNS:-16 64}; secs=${SECONDS_EACH:-10}; reps=${REPEATS:-3}
command -v wrk >/dev/null || { echo "compare.sh: wrk is not installed (apt-get install wrk)" >&2; exit 2; }
db=idemgate_floor
psql() { PGOPTIONS=--client-min-messages=warning command psql -h 127.0.0.1 -U postgres -q "$@"; }
tmp=$(mktemp -d); floor=""
trap '[ -n "$floor" ] && kill "$floor" 2>/dev/null; wait 2>/dev/null; psql -c "DROP DATABASE IF EXISTS '$db' WITH (FORCE)" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
psql -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
# The floor is built inside the module (its dependencies are idemgate's own, pinned in go.mod).
(cd "$root" && go build -o "$tmp/floor" .ci/bench/floor.go)
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
# Started through a copy: exec of a binary another process still has open for writing (a
# child forked while go build wrote it, golang/go#22315) fails with "text file busy".
cp "$tmp/floor" "$tmp/floor-server"
"$tmp/floor-server" -addr "127.0.0.1:$port" -dsn "postgres://postgres@127.0.0.1:5432/$db?sslmode=disable" -pool 16 >"$tmp/floor.log" 2>&1 &
floor=$!
for _ in $(seq 100); do curl -sf "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
curl -sf "127.0.0.1:$port/healthz" >/dev/null || { echo "compare.sh: the floor server did not start" >&2; cat "$tmp/floor.log" >&2; exit 1; }

load() { # load URL CONNS: prints "requests/s p99_ms non2xx"
  # Every run starts right after a checkpoint, so no run meets one: PostgreSQL starts one
  # about every minute under this load (max_wal_size 1 GB), and the 30-90 ms stalls of a run
  # that met one decided its p99. Both servers then pay for whole pages written to the WAL
  # at their first change after it; measured in turns (6 pairs of 8 s, new scattered keys at
  # 16 connections), idemgate against the floor was 1.39x with a checkpoint before each run
  # and 1.25x without, p99 0.39x and 0.45x the floor's.
  command psql -h 127.0.0.1 -U postgres -qc CHECKPOINT >/dev/null
  wrk -t2 -c"$2" -d"${secs}s" --latency -s "$here/acquire.lua" "$1" >"$tmp/wrk" 2>&1 || true
  awk '/Requests\/sec/ {r = $2}
       $1 == "99%" {v = $2; if (v ~ /us$/) {sub(/us/, "", v); v /= 1000} else if (v ~ /ms$/) {sub(/ms/, "", v)} else if (v ~ /s$/) {sub(/s/, "", v); v *= 1000}; p = v}
       /Non-2xx/ {b = $NF}
       END {printf "%s %s %s\n", r + 0, p + 0, b + 0}' "$tmp/wrk"
}
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

printf '%-6s %12s %12s %9s %9s %8s %s\n' conns idemgate/s floor/s idem_p99 floor_p99 ratio non2xx
for c in $conns; do
  : >"$tmp/idem"; : >"$tmp/floor"
  for _ in $(seq "$reps"); do
    load "$url" "$c" >>"$tmp/idem"
    load "http://127.0.0.1:$port" "$c" >>"$tmp/floor"
  done
  ir=$(cut -d' ' -f1 "$tmp/idem" | median); fr=$(cut -d' ' -f1 "$tmp/floor" | median)
  ip=$(cut -d' ' -f2 "$tmp/idem" | median); fp=$(cut -d' ' -f2 "$tmp/floor" | median)
  bad=$(awk '{s += $3} END {print s + 0}' "$tmp/idem")
  printf '%-6s %12.0f %12.0f %9.2f %9.2f %8.2f %s\n' "$c" "$ir" "$fr" "$ip" "$fp" "$(awk -v a="$ir" -v b="$fr" 'BEGIN {print (b > 0) ? a / b : 0}')" "$bad"
done
