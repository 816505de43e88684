#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a bounded time each (FUZZTIME, default 10s), one
# after another (a fuzzing run takes one target at a time). Each target starts from its f.Add
# seeds plus the committed corpus in <package>/testdata/fuzz/<Target>/ (grown by
# .ci/fuzz-corpus.sh, `make fuzz-corpus`), which plain `go test` also replays. An input that
# fails is written there and must be committed with the fix.
#
# Each package's instrumented test binary is built once (go test -c -fuzz) and run for each of
# its targets, as go test -fuzz would run it: in the package's directory, with the fuzz cache
# under $GOCACHE/fuzz/<import path>. `go test -fuzz` per target linked the binary again for
# every target: 11 s a target for web/ against 4 s, about 3 minutes of `make test` in all.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-10s}
gocache=$(go env GOCACHE)
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
# Targets are read from the package's test files as go list names them (build tags applied),
# not from `go test -list`, which compiles and links every package's test binary only to
# print names: 16 s for web/ alone.
go list -f '{{.ImportPath}} {{.Dir}} {{join .TestGoFiles " "}} {{join .XTestGoFiles " "}}' ./... |
while read -r pkg dir files; do
  [ -n "$files" ] || continue
  targets=$(cd "$dir" && grep -ho '^func Fuzz[A-Za-z0-9_]*(' $files | sed 's/^func //; s/($//' || true)
  [ -n "$targets" ] || continue
  test="$bin/$(echo "$pkg" | tr / _).test"
  go test -c -fuzz . -o "$test" "$pkg" </dev/null
  for target in $targets; do
    echo "fuzz: $pkg $target ($fuzztime)"
    (cd "$dir" && "$test" -test.run '^$' -test.fuzz "^${target}\$" -test.fuzztime "$fuzztime" \
      -test.fuzzcachedir "$gocache/fuzz/$pkg" -test.paniconexit0 -test.timeout 10m) >"$bin/log" 2>&1 </dev/null ||
      { cat "$bin/log"; exit 1; }
  done
done
