#!/usr/bin/env bash
# Make sure Debian's pgbouncer binary is installed: models' PgBouncer test starts its own
# pgbouncer (transaction pooling, on a free loopback port, in front of the test PostgreSQL) to
# prove idemgate works behind it. Installs the package only when missing and we are root; the
# packaged service itself is not used. Safe to re-run: an installed binary costs one stat.
set -euo pipefail
log() { printf 'pgbouncer.sh: %s\n' "$*" >&2; }
bin=/usr/sbin/pgbouncer
[ -x "$bin" ] && exit 0
command -v pgbouncer >/dev/null && exit 0
[ "$(id -u)" = 0 ] || { log "pgbouncer is not installed and we are not root: apt-get install pgbouncer"; exit 1; }
command -v apt-get >/dev/null || { log "pgbouncer is missing and there is no apt-get to install it"; exit 1; }
log "installing Debian's pgbouncer"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null
[ -x "$bin" ] || { log "apt-get installed pgbouncer but $bin is not there"; exit 1; }
