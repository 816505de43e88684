# idemgate — the two commands a user needs are `go run .` and `make test`.
SHELL := /bin/bash
# The toolchain is pinned: go1.26.8 (this machine's own Go) has standard-library advisories
# fixed only in later releases, and govulncheck is part of `make test`. go1.27.3 is fetched
# from the Go module proxy on first use (about 76 MB, once per machine).
export GOTOOLCHAIN := go1.27.3
GO ?= go
PKGS := ./...

.PHONY: run test check generate bench scale fmt e2e fuzz fuzz-corpus vuln verify screenshots ha

run:
	$(GO) run .

# The whole test (.ci/test.sh, each phase under a header with the time taken so far): start
# PostgreSQL if needed, static checks, then every test with the race detector against real
# PostgreSQL and SQLite databases (models' tests also go through a pgbouncer they start:
# .ci/pgbouncer.sh installs Debian's when missing), then the browser tests (e2e), the fuzz
# targets and govulncheck.
test:
	.ci/test.sh

# Every fuzz target for FUZZTIME (default 10s) each.
fuzz:
	.ci/fuzz.sh

# Grow the committed fuzz corpus (CORPUSTIME per target, default 60s), then commit testdata/fuzz.
fuzz-corpus:
	.ci/fuzz-corpus.sh

# govulncheck against a local copy of the Go vulnerability database (see the script); any
# reachable vulnerability, in a dependency or in the standard library, fails `make test`.
vuln:
	.ci/govulncheck.sh

# The history checker (e2e/history/) for longer: make verify DURATION=5m
DURATION ?= 60s
verify:
	.ci/postgres.sh
	VERIFY_DURATION=$(DURATION) $(GO) test -count=1 -timeout 0 -run . -v ./e2e/history/

# The failover proof (docs/operations.md "High availability"): .ci/ha.sh starts a 3-node Patroni
# cluster of PostgreSQL with synchronous replication and one etcd member on loopback
# (installing Debian's patroni and etcd-server when missing), the history checker runs two
# idemgate processes on it while the primary fails HA_FAILOVERS times (default 7: a node killed,
# a switchover, a crash of PostgreSQL alone, in turn), and the cluster is removed again, pass or
# fail.
HA_FAILOVERS ?= 7
ha:
	.ci/ha.sh start || { .ci/ha.sh stop; exit 1; }
	IDEMGATE_HA=1 HA_FAILOVERS=$(HA_FAILOVERS) $(GO) test -tags ha -count=1 -timeout 15m -run TestHistoryWithFailovers -v ./e2e/history/; \
		rc=$$?; .ci/ha.sh stop; exit $$rc

# Browser tests: e2e/setup.sh installs Debian's Chromium and the playwright driver when
# missing (fast no-op otherwise), then the dashboard is driven in headless Chromium against
# the built binary and a throwaway PostgreSQL database. Screenshots: $$E2E_SCREENSHOTS
# (default e2e/screenshots). Only ./e2e/, not ./e2e/...: the history checker in e2e/history/
# needs no browser and already runs in `test`'s race step with every other package.
e2e:
	.ci/postgres.sh
	bash e2e/setup.sh
	$(GO) test -tags e2e -count=1 -timeout 10m ./e2e/

# Regenerate the screenshots of docs/operations.md (Dashboard): every page at 1280 px and 390 px
# into docs/screenshots/
# (TestPagesAccessible, TestStaleRelease and TestExplorePlayback save them when E2E_SCREENSHOTS is set), then commit
# the PNGs.
screenshots:
	.ci/postgres.sh
	bash e2e/setup.sh
	E2E_SCREENSHOTS=docs/screenshots $(GO) test -tags e2e -count=1 -timeout 5m -run 'TestPagesAccessible|TestStaleRelease|TestExplorePlayback' ./e2e/
	rm -f docs/screenshots/Test*.png # the tests' own step screenshots, not the manual's

# gofmt, go vet, staticcheck and an up-to-date templ generate (the first phases of test).
check:
	.ci/test.sh check

generate:
	$(GO) tool templ generate -log-level error

fmt:
	gofmt -w $$(git ls-files '*.go')

# Go benchmarks, then idemgate's acquire against the floor server (.ci/bench/: compare.sh and floor.go),
# both on a throwaway PostgreSQL database. Figures are ratios measured in the same run.
bench:
	.ci/postgres.sh
	$(GO) test -run '^$$' -bench . -benchtime 2s ./services/
	.ci/bench.sh

# The size benchmark of issue 27 (.ci/scale.sh): N keys (default 200000; the report uses
# N=10000000, hours) seeded through the API and spread over 60 days, then every dashboard page
# and API read, the audit export, the purge (alone and under load) and bytes per key, beside a
# database of 10,000 keys in the same run. DB=sqlite for SQLite. make scale N=20000 is quick.
scale:
	.ci/scale.sh
