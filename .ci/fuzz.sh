#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a bounded time each (FUZZTIME, default 10s), one
# after another (go test -fuzz takes one target at a time). Each target starts from its f.Add
# seeds plus the committed corpus in <package>/testdata/fuzz/<Target>/ (grown by
# .ci/fuzz-corpus.sh, `make fuzz-corpus`), which plain `go test` also replays. An input that
# fails is written there by go test and must be committed with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-10s}
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    echo "fuzz: $pkg $target ($fuzztime)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" >/tmp/fuzz.$$.log 2>&1 || { cat /tmp/fuzz.$$.log; rm -f /tmp/fuzz.$$.log; exit 1; }
  done
done
rm -f /tmp/fuzz.$$.log
