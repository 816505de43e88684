#!/usr/bin/env bash
# Grows the committed fuzz corpus: runs every fuzz target for CORPUSTIME (default 60s), then
# copies the inputs the fuzzer found interesting (they live in the Go build cache, under
# $(go env GOCACHE)/fuzz/<import path>/<Target>/) into that package's testdata/fuzz/<Target>/,
# where plain `go test` replays them as regression inputs and `make fuzz` starts from them.
# Commit the result. Run it after changing a decoder or validator; package patterns as
# arguments limit it to those packages (default ./...).
set -euo pipefail
cd "$(dirname "$0")/.."
corpustime=${CORPUSTIME:-60s}
cache=$(go env GOCACHE)/fuzz
for pkg in $(go list "${@:-./...}"); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    echo "corpus: $pkg $target ($corpustime)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$corpustime" "$pkg" >/tmp/fuzz-corpus.$$.log 2>&1 ||
      { cat /tmp/fuzz-corpus.$$.log; rm -f /tmp/fuzz-corpus.$$.log; exit 1; }
    mkdir -p "$dir/testdata/fuzz/$target"
    if [ -d "$cache/$pkg/$target" ]; then
      cp -n "$cache/$pkg/$target"/* "$dir/testdata/fuzz/$target/" 2>/dev/null || true
    fi
    echo "corpus: $target has $(ls "$dir/testdata/fuzz/$target" | wc -l) inputs"
  done
done
rm -f /tmp/fuzz-corpus.$$.log
