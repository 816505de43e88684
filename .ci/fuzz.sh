#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a bounded time each (FUZZTIME, default 10s), one
# after another (go test -fuzz takes one target at a time). Each target starts from its f.Add
# seeds plus the committed corpus in <package>/testdata/fuzz/<Target>/ (grown by
# .ci/fuzz-corpus.sh, `make fuzz-corpus`), which plain `go test` also replays. An input that
# fails is written there by go test and must be committed with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-10s}
# Targets are read from the package's test files as go list names them (build tags applied),
# not from `go test -list`, which compiles and links every package's test binary only to
# print names: 16 s for web/ alone, and go test -fuzz builds its own, instrumented, binary anyway.
go list -f '{{.ImportPath}} {{.Dir}} {{join .TestGoFiles " "}} {{join .XTestGoFiles " "}}' ./... |
while read -r pkg dir files; do
  [ -n "$files" ] || continue
  for target in $(cd "$dir" && grep -ho '^func Fuzz[A-Za-z0-9_]*(' $files | sed 's/^func //; s/($//' || true); do
    echo "fuzz: $pkg $target ($fuzztime)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" >/tmp/fuzz.$$.log 2>&1 </dev/null || { cat /tmp/fuzz.$$.log; rm -f /tmp/fuzz.$$.log; exit 1; }
  done
done
rm -f /tmp/fuzz.$$.log
