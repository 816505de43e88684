#!/usr/bin/env bash
# e2e/setup.sh - puts in place what the browser tests in e2e/ need (`make e2e` and
# `make test` run it first; safe to run by hand).
#
# Uses only the Go module proxy, Debian's archive and the npm registry; nothing is
# downloaded from Playwright's CDN (the tests never call playwright.Install()):
#   1. Debian's Chromium (/usr/bin/chromium), launched by the tests through
#      playwright's ExecutablePath option;
#   2. the playwright-go driver: Node.js plus the exact playwright-core version the
#      playwright-go module in go.mod was built for, laid out as <dir>/node and
#      <dir>/package/cli.js in $PLAYWRIGHT_DRIVER_PATH, or else in
#      $HOME/.cache/ms-playwright-go/<version> (where playwright-go looks by default).
#
# Re-runnable: when everything is in place it only checks (well under a second).
# Run it again after bumping playwright-go in go.mod; a driver directory of another
# version, or the empty one playwright.Run() leaves behind, is rebuilt.
set -euo pipefail

NODE_FALLBACK_VERSION=20.20.2 # only when the machine's node is missing or too old
CHROMIUM=/usr/bin/chromium    # the path e2e/main_test.go launches

cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { printf 'e2e/setup.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
SUDO=
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

# --- which playwright-go module, and which playwright-core it needs ----------
mod=$(grep -oE '^\s*github\.com/(playwright-community|mxschmitt)/playwright-go v[^ ]+' go.mod | head -1 | awk '{print $1}')
[ -n "$mod" ] || die "no playwright-go module in go.mod"
moddir=$(go list -m -f '{{.Dir}}' "$mod" 2>/dev/null || true)
if [ -z "$moddir" ] || [ ! -f "$moddir/run.go" ]; then
  go mod download "$mod"
  moddir=$(go list -m -f '{{.Dir}}' "$mod")
fi
ver=$(sed -n 's/.*playwrightCliVersion *= *"\([^"]*\)".*/\1/p' "$moddir/run.go")
[ -n "$ver" ] || die "cannot read playwrightCliVersion from $moddir/run.go"
dest=${PLAYWRIGHT_DRIVER_PATH:-$HOME/.cache/ms-playwright-go/$ver}

# --- Chromium from Debian -------------------------------------------------------
if [ ! -x "$CHROMIUM" ]; then
  log "installing Debian's chromium"
  command -v apt-get >/dev/null || die "$CHROMIUM is missing and there is no apt-get to install it"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
  [ -x "$CHROMIUM" ] || die "apt-get installed chromium but $CHROMIUM is not there"
fi

# --- the driver ---------------------------------------------------------------
# driver_ok runs the driver as playwright-go does (about 0.7 s); driver_in_place is the
# quick check of a re-run: node starts and package.json names the right version.
driver_ok() { [ -x "$1/node" ] && "$1/node" "$1/package/cli.js" --version 2>/dev/null | grep -qF "Version $ver"; }
driver_in_place() {
  [ -x "$1/node" ] && [ -f "$1/package/cli.js" ] && "$1/node" --version >/dev/null 2>&1 &&
    grep -qF "\"version\": \"$ver\"" "$1/package/package.json" 2>/dev/null
}

if ! driver_in_place "$dest"; then
  log "building playwright driver $ver in $dest"
  if ! command -v npm >/dev/null && [ -n "${SUDO+x}" ] && command -v apt-get >/dev/null; then
    log "npm not found: installing Debian's npm (needed once, to fetch playwright-core@$ver)"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  command -v npm >/dev/null || die "npm not found (needed once, to fetch playwright-core@$ver)"
  mkdir -p "$(dirname "$dest")"
  tmp=$(mktemp -d "$(dirname "$dest")/.e2e-setup.XXXXXX") && chmod 755 "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "playwright-core@$ver" >/dev/null)
  tar -xzf "$tmp/playwright-core-$ver.tgz" -C "$tmp" # gives $tmp/package/cli.js
  rm -f "$tmp/playwright-core-$ver.tgz"

  # Node.js: the machine's own if new enough for this playwright-core, else a pinned
  # build from the npm package node-linux-<arch>.
  need=$(sed -n 's/.*"node": *">= *\([0-9]*\).*/\1/p' "$tmp/package/package.json")
  have=$(node --version 2>/dev/null | sed 's/^v\([0-9]*\).*/\1/' || true)
  if [ -n "$have" ] && [ "$have" -ge "${need:-0}" ]; then
    ln -s "$(readlink -f "$(command -v node)")" "$tmp/node"
  else
    case $(uname -m) in x86_64) arch=x64 ;; aarch64) arch=arm64 ;; *) die "no node build for $(uname -m)" ;; esac
    log "machine node '${have:-none}' < ${need:-?}; using node-linux-$arch@$NODE_FALLBACK_VERSION"
    (cd "$tmp" && npm pack --silent "node-linux-$arch@$NODE_FALLBACK_VERSION" >/dev/null)
    tar -xzf "$tmp"/node-linux-*.tgz -C "$tmp" --strip-components=2 package/bin/node
    rm -f "$tmp"/node-linux-*.tgz
  fi

  # github.com/mxschmitt/playwright-go patches this guard into the bundle when it
  # downloads the driver itself; do the same (no-op for versions without it).
  bundle=$tmp/package/lib/coreBundle.js
  if [ -f "$bundle" ] && grep -q 'pageError\.location\.url' "$bundle"; then
    sed -i -e 's/pageError\.location\.url/pageError.location?.url || ""/g' \
      -e 's/pageError\.location\.lineNumber/pageError.location?.lineNumber || 0/g' \
      -e 's/pageError\.location\.columnNumber/pageError.location?.columnNumber || 0/g' "$bundle"
  fi

  driver_ok "$tmp" || die "driver in $tmp does not report version $ver"
  rm -rf "$dest" && mv -T "$tmp" "$dest"
  trap - EXIT
fi

log "ok: $mod -> playwright-core $ver in $dest; $("$CHROMIUM" --version 2>/dev/null || echo chromium)"
