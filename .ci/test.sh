#!/usr/bin/env bash
# make test (and make check: `.ci/test.sh check`): every phase under a header that says how
# long the run has taken when the phase starts, then the total, so a slow phase is plain:
#
#   == check: gofmt (0 s)  == vet  == staticcheck  == templ  == openapi lint  == go test -race
#   == postgres 17 and 18  == e2e  == ha  == fuzz
#   == govulncheck  == done in N s
#
# vet and staticcheck run with GOFLAGS=-race: both type-check from compiled export data, and
# compiled with -race it is exactly what `go test -race` builds next, so every package is
# compiled once for the three of them instead of twice (on a cold cache, as CI has, the race
# build was the second full compile of the module and its dependencies; docs/operations.md
# "Test times" has the figures).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
start=$SECONDS
phase() { echo "== $1 ($((SECONDS - start)) s)"; }

phase "setup: PostgreSQL"
.ci/postgres.sh

phase "check: gofmt"
out=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$out" ]; then echo "gofmt would change:"; echo "$out"; exit 1; fi

phase "vet"
GOFLAGS="${GOFLAGS:+$GOFLAGS }-race" go vet ./...
go vet -tags ha ./e2e/history/ # the failover proof's file, built only by make ha

phase "staticcheck"
GOFLAGS="${GOFLAGS:+$GOFLAGS }-race" go tool staticcheck ./...

phase "templ"
go tool templ generate -log-level error
if ! git diff --quiet -- '*_templ.go' || [ -n "$(git ls-files --others --exclude-standard -- '*_templ.go')" ]; then
  echo "templ generate changed files: commit the generated *_templ.go"; git status --short -- '*_templ.go'; exit 1
fi

phase "openapi lint"
.ci/openapi-lint.sh

if [ "$what" = check ]; then
  echo "== done in $((SECONDS - start)) s"
  exit 0
fi

phase "go test -race"
.ci/pgbouncer.sh
# -vet=off: the vet phase ran every analyzer go test would run (and more) on the same packages.
go test -race -vet=off -count=1 -timeout 15m ./...

phase "postgres 17 and 18: models and services"
.ci/pgversions.sh

phase "e2e"
make --no-print-directory e2e

phase "ha: failovers on a Patroni cluster"
make --no-print-directory ha

phase "fuzz"
# 3 s per target here (make fuzz: 10 s): with ~25 targets each paying its build and corpus
# replay, 10 s made this the second-longest phase (486 s in a fresh-clone trial).
FUZZTIME=${FUZZTIME:-3s} .ci/fuzz.sh

phase "govulncheck"
.ci/govulncheck.sh

echo "== done in $((SECONDS - start)) s"
