#!/usr/bin/env bash
# Runs govulncheck (pinned) against a local copy of the Go vulnerability database: this machine
# reaches no vulnerability service, only the Go module proxy, so the database is built from the
# OSV files of the golang.org/x/vulndb module (pinned below; bump it to pick up new advisories)
# with that module's own indexdb command. The built database is cached per vulndb version.
set -euo pipefail
cd "$(dirname "$0")/.."
GOVULNCHECK=golang.org/x/vuln/cmd/govulncheck@v1.9.0
VULNDB_VERSION=v0.0.0-20261105234957-e22db6528018
db=${XDG_CACHE_HOME:-$HOME/.cache}/idemgate-vulndb/$VULNDB_VERSION
if [ ! -f "$db/index/db.json" ]; then
  echo "govulncheck.sh: building the vulnerability database $VULNDB_VERSION (once per version)" >&2
  src=$(go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  tmp=$(mktemp -d "${db%/*}.XXXXXX" 2>/dev/null || { mkdir -p "${db%/*}"; mktemp -d "${db%/*}.XXXXXX"; })
  go run "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION" -vulns "$src/data/osv" -out "$tmp/db"
  mkdir -p "${db%/*}" && rm -rf "$db" && mv "$tmp/db" "$db" && rm -rf "$tmp"
fi
go run "$GOVULNCHECK" -db "file://$db" ./...
