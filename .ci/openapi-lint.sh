#!/usr/bin/env bash
# Lint web/openapi.json with Redocly CLI (from the npm registry, pinned) under
# .ci/redocly.yaml: the recommended rules as errors, so any finding fails `make test`. Client
# generators (openapi-typescript, openapi-generator) read what these rules check: a schema
# that requires members it never defines, an object with no additionalProperties read as "no
# members", components no operation uses. Installs into a per-machine cache once (about 15 MB;
# Debian's npm first if there is none and we may install it), then runs in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
version=2.77.0 # needs node >= 20; later releases need node 22
dir=${XDG_CACHE_HOME:-$HOME/.cache}/idemgate/redocly-cli-$version
log() { printf 'openapi-lint.sh: %s\n' "$*" >&2; }
if [ ! -x "$dir/node_modules/.bin/redocly" ]; then
  if ! command -v npm >/dev/null; then
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    command -v apt-get >/dev/null || { log "npm is missing and there is no apt-get to install it"; exit 1; }
    log "npm not found: installing Debian's npm (once, to fetch @redocly/cli@$version)"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  log "installing @redocly/cli@$version into $dir"
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --silent "@redocly/cli@$version" >/dev/null
fi
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true
out=$("$dir/node_modules/.bin/redocly" lint --config .ci/redocly.yaml --format stylish web/openapi.json 2>&1) || {
  printf '%s\n' "$out" | grep -v '║\|╔\|╚'; exit 1; }
printf '%s\n' "$out" | grep -E 'valid|warning|error' | grep -v 'Deprecation' || true
