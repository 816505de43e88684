#!/usr/bin/env bash
# make bench, second half: start idemgate on a throwaway PostgreSQL database and run
# .ci/bench/compare.sh against it (the ratio to the floor server, in turns, same run) for
# new keys, duplicates (DUP_EVERY=4: every key acquired four times) and a retry storm on one
# key (HOT_KEYS=1), at 16 and 64 connections; then, against idemgate alone: the storm and new
# keys in turns (the storm goal is a ratio to the new-key rate) with the group admission
# slot's acquires per statement, statement latency, occupancy and lingering, other keys' rate
# and p99 alone, beside GET /healthz, beside new keys and beside a storm (in turns, medians),
# batches of 100 against single acquires (keys/s), group admission on (default) against off,
# lingering off (default), on and auto, SQLite's new-key and hot-key rates against
# PostgreSQL's, and idemgate proxy against the upstream alone (new keys and replays). Every run begins with a CHECKPOINT (see rate). Env passed through to
# compare.sh: CONNS, SECONDS_EACH, REPEATS.
set -euo pipefail
export PGOPTIONS=--client-min-messages=warning # no NOTICEs from DROP DATABASE IF EXISTS
cd "$(dirname "$0")/.."
compare=.ci/bench/compare.sh
command -v wrk >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -qq wrk >/dev/null; } || { echo "bench.sh: install wrk" >&2; exit 2; }
db=idemgate_bench
psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
tmp=$(mktemp -d); pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS '$db' WITH (FORCE)" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
go build -o "$tmp/idemgate.build" . && cp "$tmp/idemgate.build" "$tmp/idemgate" # a copy: see "text file busy" in .ci/bench/compare.sh
key=idg_bench_$(head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 32)
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db?sslmode=disable" IDEMGATE_ADDR=127.0.0.1:$port \
  IDEMGATE_BOOTSTRAP_API_KEY=$key IDEMGATE_ADMIN_PASSWORD=bench-password-123 IDEMGATE_LOG_FORMAT=json \
  "$tmp/idemgate" serve >"$tmp/server.log" 2>&1 & pid=$!
for _ in $(seq 100); do curl -sf "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
echo "== new keys (every request a fresh key)"
IDEMGATE_API_KEY=$key bash "$compare" "http://127.0.0.1:$port" | tee "$tmp/cmp-new"
echo "== duplicates (DUP_EVERY=4: one admission, three duplicates per key)"
DUP_EVERY=4 IDEMGATE_API_KEY=$key bash "$compare" "http://127.0.0.1:$port" | tee "$tmp/cmp-dup"
echo "== retry storm (HOT_KEYS=1: every request the same key; the floor locks its row, idemgate does not)"
HOT_KEYS=1 IDEMGATE_API_KEY=$key bash "$compare" "http://127.0.0.1:$port" | tee "$tmp/cmp-hot"

# wrk against one URL: prints "requests/s p99_ms non2xx". rate starts with a checkpoint, so
# that no run meets one: PostgreSQL starts one about every minute under this load (max_wal_size
# 1 GB), and the 30-90 ms stalls of a run that met one decided its p99 (other keys' p99 alone
# measured 48 ms in one make bench run, 5.7-8 ms in runs that each began with a CHECKPOINT).
# compare.sh does the same. measure does not checkpoint (beside takes its own first, before
# its other load).
secs=${SECONDS_EACH:-10}
ckpt() { psql -h 127.0.0.1 -U postgres -qc CHECKPOINT >/dev/null; }
rate() { ckpt; measure "$@"; }
measure() { # measure URL CONNS SCRIPT [ENV=VALUE...]
  local url=$1 c=$2 script=$3; shift 3
  env "$@" IDEMGATE_API_KEY=$key wrk -t2 -c"$c" -d"${secs}s" --latency -s "$script" "$url" >"$tmp/wrk" 2>&1 || true
  awk '/Requests\/sec/{r=$2} $1=="99%"{v=$2; if(v~/us$/){sub(/us/,"",v);v/=1000} else if(v~/ms$/){sub(/ms/,"",v)} else if(v~/s$/){sub(/s/,"",v);v*=1000}; p=v}
       /Non-2xx/{b=$NF} END{printf "%.0f %.2f %d\n", r, p, b}' "$tmp/wrk"
}
start() { # start NAME PORT ENV=VALUE...: another idemgate, same key
  local name=$1 p=$2; shift 2
  env "$@" IDEMGATE_ADDR=127.0.0.1:$p IDEMGATE_BOOTSTRAP_API_KEY=$key IDEMGATE_ADMIN_PASSWORD=bench-password-123 \
    IDEMGATE_LOG_FORMAT=json "$tmp/idemgate" serve >"$tmp/$name.log" 2>&1 &
  pids="$pids $!"
  for _ in $(seq 100); do curl -sf "127.0.0.1:$p/healthz" >/dev/null && return; sleep 0.1; done
  echo "bench.sh: $name did not start" >&2; cat "$tmp/$name.log" >&2; exit 1
}
freeport() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
pids=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; for p in $pids; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS '$db' WITH (FORCE)" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
single=.ci/single.lua

# The storm goal is a ratio to idemgate's own new-key rate. The compare.sh rows above are
# minutes apart, on a database the runs between them have grown, and this machine's speed
# drifts by more than the difference sought; so new keys and the one-key storm are also
# loaded in turns here, A B A B, and the summary takes its storm ratios from these medians.
echo "== one hot key against new keys, in turns (HOT_KEYS=1 and fresh keys), idemgate alone"
printf '%-6s %10s %10s %9s %9s %7s %7s\n' conns new/s hot/s new_p99 hot_p99 rate p99
med() { sort -g | awk '{a[NR]=$1} END{print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# The group admission slot, from idemgate's /metrics: "statements acquires busy_seconds
# linger_seconds lingers_gathered lingers_expired" so far (IDEMGATE_GROUP_LINGER).
slot() {
  curl -sf "127.0.0.1:$port/metrics" | awk '$1=="idemgate_group_admission_batches_total"{b=$2}
    $1=="idemgate_group_admission_batched_acquires_total"{i=$2} $1=="idemgate_group_admission_single_acquires_total"{s=$2}
    $1=="idemgate_group_admission_busy_seconds_total"{t=$2} $1=="idemgate_group_admission_linger_seconds_total"{l=$2}
    $1=="idemgate_group_admission_lingers_total{result=\"gathered\"}"{g=$2} $1=="idemgate_group_admission_lingers_total{result=\"expired\"}"{x=$2}
    END{printf "%.0f %.0f %.6f %.6f %.0f %.0f\n", b+s, i+s, t, l, g, x}'
}
# slotrate LOAD URL CONNS SCRIPT [ENV=VALUE...]: rate's line, and the slot's work during it
# appended to $tmp/slot as "LOAD statements acquires busy_seconds linger_seconds
# lingers_gathered lingers_expired" before, then the same after.
slotrate() {
  local load=$1; shift
  local a; a=$(slot); rate "$@"; echo "$load $a $(slot)" >>"$tmp/slot"
}
: >"$tmp/turns"
for c in ${CONNS:-16 64}; do
  : >"$tmp/tn"; : >"$tmp/th"; : >"$tmp/slot"
  for _ in $(seq "${REPEATS:-3}"); do
    slotrate new "http://127.0.0.1:$port" "$c" $single HOT_KEYS=0 >>"$tmp/tn"
    slotrate hot "http://127.0.0.1:$port" "$c" $single HOT_KEYS=1 >>"$tmp/th"
  done
  nr=$(cut -d' ' -f1 "$tmp/tn" | med); np=$(cut -d' ' -f2 "$tmp/tn" | med)
  hr=$(cut -d' ' -f1 "$tmp/th" | med); hp=$(cut -d' ' -f2 "$tmp/th" | med)
  echo "$c $nr $hr $np $hp" | tee -a "$tmp/turns" | awk '{printf "%-6s %10d %10d %9.2f %9.2f %7.2f %7.2f\n", $1, $2, $3, $4, $5, ($2>0)?$3/$2:0, ($4>0)?$5/$4:0}'
  # What bounds these rates: one statement at a time (docs/operations.md, "What bounds the
  # rate"). Occupancy near 100% means every acquire waited for the statement in flight; the rate
  # is then acquires per statement over the statement's latency.
  # Lingering: the share of the time the slot waited for answered callers to come back, and
  # the share of its lingers that gathered what they waited for.
  awk -v c="$c" -v secs="$secs" '{n[$1]+=$8-$2; a[$1]+=$9-$3; t[$1]+=$10-$4; w[$1]+=$11-$5; g[$1]+=$12-$6; x[$1]+=$13-$7; r[$1]++}
    END{printf "       slot at %s conns:", c
        split("new hot", L); for (j=1; j<=2; j++) { l=L[j]; if (n[l]>0) printf "  %s keys %.1f acquires/statement, %.2f ms/statement, busy %.0f%%, lingering %.0f%% (%.0f%% of %d lingers gathered);", l, a[l]/n[l], 1000*t[l]/n[l], 100*t[l]/(r[l]*secs), 100*w[l]/(r[l]*secs), (g[l]+x[l]>0)?100*g[l]/(g[l]+x[l]):0, g[l]+x[l] }
        printf "\n"}' "$tmp/slot"
done

# Beside the same 64-connection load of new keys too: on a machine whose cores the load takes,
# other keys slow down beside any load; what a storm on one key must not add is a slowdown of
# its own (row locks, held pool connections), so the storm is compared with both.
# And beside 64 connections of GET /healthz: no database, no authentication, the least work
# idemgate does for a request; what that load alone does to other keys' p99 is the share of
# the cores', which no handling of a storm can avoid on a machine whose cores the load shares.
echo "== other keys during a retry storm: new keys at 16 connections, alone, beside 64 connections of GET /healthz, of new keys, and of a storm on one key"
beside() { # beside LOAD: rate of 16 connections of new keys beside 64 connections of LOAD
  ckpt
  case $1 in
    healthz) (wrk -t1 -c64 -d"$((secs + 2))s" "http://127.0.0.1:$port/healthz" >/dev/null 2>&1) & ;;
    new) (IDEMGATE_API_KEY=$key HOT_KEYS=0 wrk -t1 -c64 -d"$((secs + 2))s" -s $single "http://127.0.0.1:$port" >/dev/null 2>&1) & ;;
    storm) (IDEMGATE_API_KEY=$key HOT_KEYS=1 wrk -t1 -c64 -d"$((secs + 2))s" -s $single "http://127.0.0.1:$port" >/dev/null 2>&1) & ;;
  esac
  local w=$!
  sleep 1; measure "http://127.0.0.1:$port" 16 $single; wait $w
}
# In turns, REPEATS times, medians: one 10-second p99 beside another load moved by 3x between
# two runs of the same build (one met a checkpoint, the other not).
: >"$tmp/beside-runs"
for _ in $(seq "${REPEATS:-3}"); do
  echo "$(rate "http://127.0.0.1:$port" 16 $single) $(beside healthz) $(beside new) $(beside storm)" | tee -a "$tmp/beside-runs" |
    awk '{printf "  run: alone %d/s p99 %.2f ms   beside /healthz %d/s p99 %.2f ms   beside new keys %d/s p99 %.2f ms   beside the storm %d/s p99 %.2f ms\n", $1, $2, $4, $5, $7, $8, $10, $11}'
done
for f in 1 2 4 5 7 8 10 11; do cut -d' ' -f$f "$tmp/beside-runs" | med; done | paste -sd' ' >"$tmp/beside"
awk '{printf "medians: alone %d/s p99 %.2f ms   beside /healthz %d/s p99 %.2f ms   beside new keys %d/s p99 %.2f ms   beside the storm %d/s p99 %.2f ms\n", $1, $2, $3, $4, $5, $6, $7, $8}' "$tmp/beside"

echo "== batch acquire (100 keys per request) against single acquires, 16 connections, idemgate alone"
s=$(rate "http://127.0.0.1:$port" 16 $single); b=$(rate "http://127.0.0.1:$port" 16 .ci/batch.lua BATCH=100)
echo "$s $b" | awk '{printf "single: %d keys/s (p99 %.1f ms)   batch100: %d keys/s (p99 %.1f ms per batch)   ratio %.1f   non2xx %d/%d\n", $1, $2, $4*100, $5, ($1>0)?$4*100/$1:0, $3, $6}'

echo "== group admission on (the default) against off (IDEMGATE_GROUP_ADMISSION=false), new keys, idemgate alone"
offport=$(freeport)
start grouping-off "$offport" DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db?sslmode=disable" IDEMGATE_GROUP_ADMISSION=false
printf '%-6s %10s %10s %9s %9s %7s\n' conns on/s off/s on_p99 off_p99 ratio
for c in ${CONNS:-16 64}; do
  on=$(rate "http://127.0.0.1:$port" "$c" $single); off=$(rate "http://127.0.0.1:$offport" "$c" $single)
  echo "$c $on $off" | awk '{printf "%-6s %10d %10d %9.2f %9.2f %7.2f\n", $1, $2, $5, $3, $6, ($5>0)?$2/$5:0}'
done

# Lingering (IDEMGATE_GROUP_LINGER): off (the default), on and auto on three instances of one
# database, in turns, for a storm on one key at 16 connections (where lingering gains most)
# and new keys at 64 (where batches are large enough without it, and lingering for all the
# callers, before groupLingerTarget bounded it, lost 8-12%).
echo "== group admission lingering: off (the default), on and auto, in turns, medians"
lingerports=""
for m in off on auto; do
  lp=$(freeport); lingerports="$lingerports $m:$lp"
  start "linger-$m" "$lp" DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db?sslmode=disable" IDEMGATE_GROUP_LINGER=$m
done
printf '%-22s %10s %10s %10s %8s %8s\n' load off/s on/s auto/s on/off auto/off
: >"$tmp/linger"
for lc in "storm 16 1" "new 64 0"; do
  set -- $lc
  : >"$tmp/l-off"; : >"$tmp/l-on"; : >"$tmp/l-auto"
  # Each round starts with another mode (off on auto, on auto off, auto off on): in a fixed
  # order auto always ran last, on a database the two runs before it had just grown, and one
  # make bench printed auto/off 0.78 at 64 connections where six rotated pairs gave 0.90-1.08.
  for i in $(seq 0 $((${REPEATS:-3} - 1))); do
    order=($lingerports); order=("${order[@]:i%3}" "${order[@]:0:i%3}")
    for mp in "${order[@]}"; do
      rate "http://127.0.0.1:${mp#*:}" "$2" $single HOT_KEYS=$3 | cut -d' ' -f1 >>"$tmp/l-${mp%%:*}"
    done
  done
  lo=$(med <"$tmp/l-off"); ln=$(med <"$tmp/l-on"); la=$(med <"$tmp/l-auto")
  echo "$1 $2 $lo $ln $la" | tee -a "$tmp/linger" | awk '{printf "%-22s %10d %10d %10d %8.2f %8.2f\n", $1 " at " $2 " conns", $3, $4, $5, ($3>0)?$4/$3:0, ($3>0)?$5/$3:0}'
done

echo "== SQLite (embedded, synchronous=FULL) against PostgreSQL, idemgate alone, 16 connections"
liteport=$(freeport)
start sqlite "$liteport" DATABASE_URL= IDEMGATE_SQLITE_PATH="$tmp/bench.db"
printf '%-9s %12s %12s %9s %9s %7s\n' load sqlite/s postgres/s lite_p99 pg_p99 ratio
for mode in new hot; do
  hk=0; [ $mode = hot ] && hk=1
  l=$(rate "http://127.0.0.1:$liteport" 16 $single HOT_KEYS=$hk); p=$(rate "http://127.0.0.1:$port" 16 $single HOT_KEYS=$hk)
  echo "$mode $l $p" | awk '{printf "%-9s %12d %12d %9.2f %9.2f %7.2f\n", $1, $2, $5, $3, $6, ($5>0)?$2/$5:0}'
done

# idemgate proxy (docs/reference.md §12) against the upstream alone: the Node.js service of the
# proxy's tests, new keys (every request forwarded and its outcome recorded) and replays (every
# request answered from idemgate, the upstream not asked), 16 connections, in turns (upstream,
# proxy) REPEATS times, medians.
echo "== idemgate proxy against the upstream alone (Node.js, web/proxy/testdata/upstream.mjs), 16 connections, medians"
command -v node >/dev/null || { echo "bench.sh: the proxy rows need Node.js" >&2; exit 2; }
node web/proxy/testdata/upstream.mjs >"$tmp/upstream.port" 2>"$tmp/upstream.log" & pids="$pids $!"
for _ in $(seq 50); do [ -s "$tmp/upstream.port" ] && break; sleep 0.1; done
up="http://127.0.0.1:$(head -1 "$tmp/upstream.port")"
pp=$(freeport)
IDEMGATE_API_KEY=$key "$tmp/idemgate" proxy --listen 127.0.0.1:$pp --upstream "$up" --idemgate "http://127.0.0.1:$port" \
  >"$tmp/proxy.log" 2>&1 & pids="$pids $!"
for _ in $(seq 50); do curl -s -o /dev/null "127.0.0.1:$pp/" && break; sleep 0.1; done
printf '%-8s %11s %9s %11s %9s %7s %7s\n' load upstream/s proxy/s up_p99_ms p99_ms rate p99
: >"$tmp/proxyrows"
for mode in new replay; do
  r=0; [ $mode = replay ] && r=1
  : >"$tmp/pu"; : >"$tmp/pp"
  for _ in $(seq ${REPEATS:-3}); do
    rate "$up" 16 .ci/proxy.lua REPLAY=$r >>"$tmp/pu"
    rate "http://127.0.0.1:$pp" 16 .ci/proxy.lua REPLAY=$r >>"$tmp/pp"
  done
  ur=$(cut -d' ' -f1 "$tmp/pu" | med); u99=$(cut -d' ' -f2 "$tmp/pu" | med)
  pr=$(cut -d' ' -f1 "$tmp/pp" | med); p99=$(cut -d' ' -f2 "$tmp/pp" | med)
  echo "$mode $ur $pr $u99 $p99" | tee -a "$tmp/proxyrows" | awk '{printf "%-8s %11d %9d %11.2f %9.2f %7.2f %7.2f\n", $1, $2, $3, $4, $5, ($2>0)?$3/$2:0, ($4>0)?$5/$4:0}'
done

# The hot path's goals, each a ratio within this run (compare.sh rows: conns idemgate/s floor/s
# idem_p99 floor_p99 ratio non2xx).
echo "== summary (ratios measured above, same run)"
join <(grep "^[0-9]" "$tmp/cmp-new") "$tmp/turns" | awk '$1 ~ /^[0-9]+$/ {
  printf "%-3s conns: new keys %.2fx floor rate, p99 %.2fx floor p99 | one hot key %.2fx own new-key rate, p99 %.2fx new-key p99 (in turns)\n",
    $1, ($3>0)?$2/$3:0, ($5>0)?$4/$5:0, ($8>0)?$9/$8:0, ($10>0)?$11/$10:0 }'
awk '{printf "16  conns: other keys beside a one-key storm: p99 %.2fx their p99 alone (%.2f -> %.2f ms), %.2fx beside the same connections of GET /healthz (%.2f ms; /healthz itself: %.2fx alone), %.2fx beside the same load of new keys (%.2f ms), medians\n", ($2>0)?$8/$2:0, $2, $8, ($4>0)?$8/$4:0, $4, ($2>0)?$4/$2:0, ($6>0)?$8/$6:0, $6}' "$tmp/beside"
awk '{printf "lingering, auto vs off: %s at %s conns %.2fx (on: %.2fx)\n", $1, $2, ($3>0)?$5/$3:0, ($3>0)?$4/$3:0}' "$tmp/linger"
awk '{printf "proxy, %s: %.2fx the upstream alone'"'"'s rate, p99 %.2fx (%.2f -> %.2f ms)\n", $1, ($2>0)?$3/$2:0, ($4>0)?$5/$4:0, $4, $5}' "$tmp/proxyrows"
