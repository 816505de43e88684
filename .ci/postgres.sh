#!/usr/bin/env bash
# Make sure a PostgreSQL server answers on 127.0.0.1:5432 as user postgres without a password,
# as the tests expect (TEST_DATABASE_URL overrides the target, and then this script only checks).
# Starts an installed but stopped cluster with pg_ctlcluster; installs Debian's postgresql only
# when none is installed and we are root. Safe to re-run: a running server costs one query.
set -euo pipefail
log() { printf 'postgres.sh: %s\n' "$*" >&2; }
ok() { psql "${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}" -Atqc 'select 1' >/dev/null 2>&1; }

if ! command -v psql >/dev/null || ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  if [ -n "${TEST_DATABASE_URL:-}" ]; then ok && exit 0; fi
  [ "$(id -u)" = 0 ] || { log "PostgreSQL is not installed; install it or set TEST_DATABASE_URL"; exit 1; }
  log "installing Debian's postgresql"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
fi
ok && exit 0
[ -n "${TEST_DATABASE_URL:-}" ] && { log "cannot reach TEST_DATABASE_URL"; exit 1; }

ver=$(ls /etc/postgresql | sort -V | tail -1)
if ! pg_lsclusters -h 2>/dev/null | awk -v v="$ver" '$1==v && $2=="main" && $4=="online"' | grep -q .; then
  log "starting PostgreSQL $ver"
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start
fi
for _ in $(seq 50); do ok && exit 0; sleep 0.2; done

# Running but refusing us: a fresh Debian cluster wants passwords on TCP. Trust loopback only.
if [ "$(id -u)" = 0 ]; then
  hba=/etc/postgresql/$ver/main/pg_hba.conf
  if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
    log "allowing trust auth on 127.0.0.1 in $hba"
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main reload
  fi
  for _ in $(seq 50); do ok && exit 0; sleep 0.2; done
fi
log "PostgreSQL does not answer on 127.0.0.1:5432 as user postgres"
exit 1
