# edgeguard — see README.md. `make test` works on a brand-new Debian machine:
# it installs the servers the tests start (scripts/tools.sh) and runs them.
GO      ?= go
TIMEOUT ?= 12m
# Everything builds with -trimpath: no path of this checkout ends up in a
# binary, and the build cache serves a checkout at any path. Without it a
# fresh clone recompiles every package of the module (its directory is part
# of each package's cache key), minutes of make test's time under -race.
export GOFLAGS := $(strip $(filter-out -trimpath,$(GOFLAGS)) -trimpath)

.PHONY: build package package-check run test test-suite test-go loadtest-test test-busy faults faults-failover bench bench-tls fuzz-paths lint tools dashboards dashboards-check stack-up stack-down stack-outputs drills stack-test stack-build k6 loadtest loadtest-smoke shed-bench bench-stream-peers bench-slow-readers bench-big-object bench-peers bench-tenants rls-differential

# bin/edge and bin/regionctl, stamped with `git describe` (edge --version,
# edgeguard_build_info); the Go toolchain adds the VCS revision itself.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS := -s -w -X github.com/edgeguard/edgeguard/internal/buildinfo.version=$(VERSION)
BUILDVCS := $(shell git rev-parse --git-dir >/dev/null 2>&1 && echo true || echo false)
build:
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=$(BUILDVCS) -ldflags '$(LDFLAGS)' -o bin/ ./cmd/edge ./cmd/regionctl

# Debian packages of both binaries (nfpm, built from its module and cached),
# into dist/; package-check inspects them and starts the unit's command.
NFPM ?= github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.41.1
ARCH ?= $(shell $(GO) env GOARCH)
# A Debian version starts with a digit: v1.2.3 → 1.2.3, an untagged tree → 0.0.0~git<describe>.
DEB_VERSION := $(shell echo '$(patsubst v%,%,$(VERSION))' | sed -E '/^[0-9]+\./!s/^/0.0.0~git/')
package: build
	rm -rf dist && mkdir -p dist
	VERSION=$(DEB_VERSION) ARCH=$(ARCH) $(GO) run $(NFPM) package --config packaging/nfpm-edge.yaml --packager deb --target dist/
	VERSION=$(DEB_VERSION) ARCH=$(ARCH) $(GO) run $(NFPM) package --config packaging/nfpm-regionctl.yaml --packager deb --target dist/

package-check: package
	./scripts/check-package.sh

# The edge on its own: embedded memory store, the example rules, the built-in
# demo origin (only ever on request: without --origin or --demo-origin the
# edge refuses to start). One built binary, so Ctrl-C and SIGHUP reach the
# edge itself; more flags with ARGS=... Try: curl -i localhost:8080/ (429 after 10).
ARGS ?=
run: build
	./bin/edge --listen 127.0.0.1:8080 --rules examples/rules.yaml --demo-origin --drain-delay 0 $(ARGS)

tools:
	./scripts/tools.sh

# staticcheck is pinned and built from its module on first use (then cached).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	$(GO) vet -tags stack ./...
	$(GO) run $(STATICCHECK) -tags stack ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# The lint, the dashboards check, the load-test module's tests, the
# package check and the stack test's builds (stack-build) run in the light
# lane beside the heavy packages (scripts/test-go.sh), where the cores have
# room; the stack test after, with nothing left to build.
# test-suite is what make test runs once the tools are there, and what make
# test-busy runs under the busy recipe.
TEST_STACK_BUILD := $(CURDIR)/.stack-build
test: tools
	$(MAKE) --no-print-directory test-suite

test-suite:
	$(MAKE) --no-print-directory test-go \
		LIGHT_BEFORE='$(MAKE) --no-print-directory lint dashboards-check' \
		LIGHT_AFTER='$(MAKE) --no-print-directory loadtest-test package-check stack-build STACK_BUILD_DIR=$(TEST_STACK_BUILD)'
	$(MAKE) stack-test STACK_BUILD_DIR=$(TEST_STACK_BUILD)

# The load-test extension module's own tests (its own go.mod).
loadtest-test:
	cd loadtest && $(GO) vet ./... && EDGEGUARD_CONSUL="$$(../scripts/install-consul.sh)" $(GO) test -race -count=1 ./...

# Every package runs under the race detector: they all have concurrency
# (stores, harness, shedder) or are cheap enough that it costs nothing.
# The heavy end-to-end packages run one at a time, in this order, and beside
# them the others one at a time: never two heavy packages at once
# (scripts/test-go.sh; it checks that every package of ./... runs once).
# The Consul agent the harness starts is the one scripts/install-consul.sh
# built and cached (instant once cached; tools has run it); h2spec likewise
# (scripts/install-h2spec.sh).
HEAVY_PKGS ?= ./internal/dashcheck ./internal/faults ./internal/edge/e2e ./internal/edge ./pkg/limiter
test-go:
	GO='$(GO)' TIMEOUT='$(TIMEOUT)' HEAVY_PKGS='$(HEAVY_PKGS)' LIGHT_BEFORE='$(LIGHT_BEFORE)' LIGHT_AFTER='$(LIGHT_AFTER)' ./scripts/test-go.sh

# The tests on a busy machine (scripts/busy.sh): stress-ng noise and
# stalls of the tests' own Redis servers while BUSY_CMD runs, by default
# everything make test runs (test-suite: both lanes, their lint, package
# and load-test steps, then the stack test). PKG runs one package instead,
# RUN and COUNT narrowing it; BUSY_CMD='make test-go' the Go tests alone:
#   make test-busy PKG=./pkg/limiter RUN=TestSlowStoreStaysExact COUNT=30
PKG ?=
RUN ?=
BUSY_CMD ?= $(if $(PKG),$(GO) test -race -count=$(COUNT) -timeout $(TIMEOUT) -run '$(RUN)' $(PKG),$(MAKE) --no-print-directory test-suite)
test-busy: tools
	EDGEGUARD_CONSUL="$$(./scripts/install-consul.sh)" EDGEGUARD_H2SPEC="$$(./scripts/install-h2spec.sh)" \
	./scripts/busy.sh $(BUSY_CMD)

# The full fault matrix of internal/faults (`make test` runs its quick
# subset): every fault × deployment (standalone, Sentinel, Cluster) ×
# algorithm through toxiproxy on loopback, bounded by FAULTS_TIMEOUT; prints
# the table (markdown, for docs/guarantees.md) even when cells fail.
FAULTS_TIMEOUT ?= 40m
faults: tools
	@table=$$(mktemp) && \
	EDGEGUARD_FAULTS=full EDGEGUARD_FAULTS_TABLE="$$table" \
		$(GO) test -count=1 -timeout $(FAULTS_TIMEOUT) -run '^TestFaultMatrix$$' ./internal/faults/; \
	rc=$$?; echo; echo "fault matrix, $$(date -u +%F), commit $$(git rev-parse --short HEAD 2>/dev/null):"; \
	cat "$$table"; rm -f "$$table"; exit $$rc

# The master changes under writes alone (a failover with no pause, a master
# SIGKILLed; Sentinel and Cluster), FAULTS_COUNT times each cell, the table
# of every run at the end. FAULTS_ALGS narrows the algorithms (comma-separated);
# FAULTS_LIMIT sets the key's limit (600 by default: reached after the change;
# a smaller one is reached while the edges move over):
#   make faults-failover FAULTS_COUNT=20 FAULTS_ALGS=fixed_window
# (23 minutes on two shared cores; every algorithm 20 times needs about two
# hours: FAULTS_TIMEOUT=3h).
FAULTS_COUNT ?= 1
FAULTS_ALGS ?=
FAULTS_LIMIT ?=
faults-failover: tools
	@table=$$(mktemp) && \
	EDGEGUARD_FAULTS=failover EDGEGUARD_FAULTS_ALGS='$(FAULTS_ALGS)' EDGEGUARD_FAULTS_LIMIT='$(FAULTS_LIMIT)' EDGEGUARD_FAULTS_TABLE="$$table" \
		$(GO) test -count=$(FAULTS_COUNT) -timeout $(FAULTS_TIMEOUT) -run '^TestFaultMatrix$$' ./internal/faults/; \
	rc=$$?; echo; echo "master changes under writes ×$(FAULTS_COUNT), $$(date -u +%F), commit $$(git rev-parse --short HEAD 2>/dev/null):"; \
	cat "$$table"; rm -f "$$table"; exit $$rc

# The multi-region stack (terraform/README.md): Terraform applies
# terraform/environments/local, whose provisioners run stackctl. Everything
# it makes lives in $(STACK_STATE); stack-down removes it.
STACK_STATE ?= .stack
export STACK_STATE

stack-up: tools
	./scripts/stack.sh up

stack-down:
	./scripts/stack.sh down

stack-outputs:
	@./scripts/stack.sh outputs

# The region drills against the applied stack; prints a table.
drills:
	$(GO) run ./cmd/drills --outputs $(STACK_STATE)/outputs.json

# The shedder against a 3x step and an origin whose capacity halves, on the
# applied stack (make stack-up): today's shedder and the adaptive origin
# limit alternated, ROUNDS (3) runs each, ~90 s a run; prints the table
# (scripts/shed-bench.sh, loadtest/scenarios/shed-bench.js). Not in test.
shed-bench: k6
	ROUNDS=$(or $(ROUNDS),3) ./scripts/shed-bench.sh

# `edge rls` against envoyproxy/ratelimit, answer by answer, on the
# reference's own configuration files (cmd/rlsdiff, internal/rlsdiff): its
# binary and its checkout by path, never downloaded (in its checkout: go
# build -o ratelimit ./src/service_cmd). Prints every differing call with
# both answers; exit 1 on a difference docs/envoy.md does not name. Not in
# test (its smoke test, the edge on both sides, is).
RATELIMIT ?=
REFERENCE_SRC ?=
rls-differential: build
	@if [ -z "$(RATELIMIT)" ] || [ -z "$(REFERENCE_SRC)" ]; then echo "usage: make rls-differential RATELIMIT=path/to/ratelimit REFERENCE_SRC=path/to/checkout" >&2; exit 2; fi
	$(GO) run ./cmd/rlsdiff -reference '$(RATELIMIT)' -reference-src '$(REFERENCE_SRC)' -edge bin/edge

# Brings a stack of its own up (state in a temp dir), runs the k6 smoke
# (multi-region.js, 20 s, correctness thresholds), drills 1, 3, 5 and 6, the DNS
# drain and self-healing tests, and takes it down: the build tag keeps this
# package out of `go test ./...`, so it runs exactly once. k6 is built first
# (cached by k6 version and the extension's content). With STACK_BUILD_DIR
# (make test sets it), the stack's binaries and the test binary come from
# there, built ahead by stack-build (scripts/stack.sh up relinks whatever is
# out of date).
STACK_BUILD_DIR ?=
stack-test: tools k6
ifeq ($(STACK_BUILD_DIR),)
	$(GO) test -tags stack -count=1 -timeout 15m -v -run 'Test' ./internal/stack/drills/
else
	$(GO) test -tags stack -c -o '$(STACK_BUILD_DIR)/drills.test' ./internal/stack/drills/
	cd internal/stack/drills && STACK_BUILD_DIR='$(STACK_BUILD_DIR)' '$(STACK_BUILD_DIR)/drills.test' \
		-test.count=1 -test.timeout=15m -test.v -test.run='Test'
endif

# The stack's binaries and the stack test's binary, into STACK_BUILD_DIR.
stack-build:
	STACK_BUILD_DIR='$(STACK_BUILD_DIR)' ./scripts/stack.sh build
	$(GO) test -tags stack -c -o '$(STACK_BUILD_DIR)/drills.test' ./internal/stack/drills/

# The Grafana boards are generated from dashboards/src (Grafana's foundation
# SDK); `make dashboards` rewrites the JSON, the check fails when the
# committed JSON is stale. Alert rules: syntax and unit tests (promtool).
dashboards:
	cd dashboards && npm ci --no-audit --no-fund --loglevel=error && npm run --silent generate

dashboards-check:
	cd dashboards && npm ci --no-audit --no-fund --loglevel=error && npm run --silent check
	promtool check rules dashboards/alerts/edgeguard.rules.yml
	promtool test rules dashboards/alerts/edgeguard.test.yml

# Benchmarks against real Redis (standalone and Cluster), started by the
# harness; see docs/perf-notes.md for how to compare runs.
BENCH      ?= .
BENCHTIME  ?= 1s
COUNT      ?= 1
bench: tools
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) -count $(COUNT) -timeout 30m ./...

# TLS termination against Debian's nginx on the same certificate (handshakes,
# resumed handshakes, keep-alive HTTP/1.1 and HTTP/2), alternated rounds;
# ROUNDS and DURATION as in scripts/bench-tls.sh. Not part of make test.
bench-tls:
	./scripts/bench-tls.sh

# pkg/pathsem's paths against real Tomcat and Jetty (started by the test,
# as in make test) for FUZZTIME; what it finds lands in
# pkg/pathsem/testdata/fuzz/ and then runs in make test. Not part of make test.
FUZZTIME ?= 10m
fuzz-paths: tools
	$(GO) test -run '^$$' -fuzz '^FuzzServletDifferential$$' -fuzztime $(FUZZTIME) ./pkg/pathsem

# k6 with the k6/x/edgeguard extension (loadtest/, its own Go module), built
# the way xk6 does and cached in ~/.cache/edgeguard/k6-<version>-<hash>/.
k6:
	@./loadtest/build-k6.sh

# One scenario against the running stack (make stack-up), e.g.
#   make loadtest SCENARIO=overload
# Results: loadtest/results/<scenario>-<time>.json. STACK_OUTPUTS=FILE runs
# against other outputs (loadtest/fixture.sh up prints a small stand-in's).
SCENARIO ?= multi-region
loadtest:
	./loadtest/run.sh $(SCENARIO)

# The CI smoke: 20 s of multi-region.js with the correctness thresholds only.
loadtest-smoke:
	SMOKE=1 ./loadtest/run.sh multi-region

# The edge's streaming proxy beside Debian's nginx (internal/peerbench):
# time to first byte of a 4 MiB object and CPU per GiB proxied, SETS sets
# alternating the two, RUNS time-to-first-byte requests per client; prints
# the table of BENCHMARKS.md; PEERS_ARGS adds flags (-volume-scale 0.25,
# -clients 16, -ttfb-only, -trace 5s: where the first byte's time goes inside
# the edge, from an execution trace). Not part of make test (its smoke test is).
NGINX ?= /usr/sbin/nginx
SETS  ?= 3
RUNS  ?= 200
PEERS_ARGS ?=
bench-stream-peers: build
	$(GO) run ./scripts/peerbench stream -edge bin/edge -nginx $(NGINX) -sets $(SETS) -requests $(RUNS) $(PEERS_ARGS)

# The edge's resident memory per open stream: SLOW_CLIENTS clients each
# reading a 1 GiB object at 64 KiB/s for SLOW_HOLD, then nginx the same way.
SLOW_CLIENTS ?= 1000
SLOW_HOLD    ?= 60s
bench-slow-readers: build
	$(GO) run ./scripts/peerbench slow -edge bin/edge -nginx $(NGINX) -clients $(SLOW_CLIENTS) -hold $(SLOW_HOLD)

# What a small request costs the edge, nginx (NGINX) and HAProxy (HAPROXY),
# all in front of one fasthttp origin on loopback (internal/peerbench,
# requests.go; the peers' configurations are templates in
# internal/peerbench/peers): proxied, with a JSON access log, a per-client
# rule not reached, a one-key flood answered 429, the edge's ramp shedding,
# TLS, and HTTP/2 over TLS (h2load -c16 -m10 in wrk's place, no p99).
# wrk -t2 -c64, 2 s warm-up then PEERS_DURATION measured, a fixed-rate run
# at half the peak for the p99, SETS sets rotating the proxies' order;
# prints the table of BENCHMARKS.md. PEERS_ARGS adds flags (-warmup 0s,
# -fixed 0s). Not part of make test (its smoke test, -smoke, is).
HAPROXY        ?= /usr/sbin/haproxy
PEERS_DURATION ?= 10s
bench-peers: build
	$(GO) run ./scripts/peerbench requests -edge bin/edge -nginx $(NGINX) -haproxy $(HAPROXY) -sets $(SETS) -duration $(PEERS_DURATION) $(PEERS_ARGS)

# Tenant isolation (issue 51) at its own scale, the edge at its defaults
# beside nginx (NGINX), each alone before one origin on loopback and pinned
# alone to one CPU (the origin and the clients on the others; needs 2 CPUs):
# b.example on 8 connections alone for TENANTS_PHASE, then as long beside
# a.example, whose origin answers after 5 s (1,200 clients from 5 addresses,
# 2 critical ones) and then floods it (3x the edge's workers connections from
# 48 addresses, an origin answering at once; b.example judged at a fixed
# rate, half its closed-loop rate alone, each request lost unless answered
# within 1 s). Prints the tables of BENCHMARKS.md and PASS/FAIL per goal;
# about 5 minutes a set, TENANTS_SETS sets (3), alternating which target
# goes first: from 3 sets on, b.example's rate and p99 beside the slowdown
# are judged on their medians over the sets, each set's printed beside (one
# set's move by about 10 %, nginx's too). TENANTS_ARGS adds flags (-scenarios
# slow,flood,join, -pin=false, -deadline 500ms, -open-share 0.25, -slow 2s,
# -a-clients 600, -a-pool 256,1200,10s, -edge-args "--workers 256"). Not part
# of make test (its smoke test is).
TENANTS_PHASE ?= 20s
TENANTS_SETS  ?= 3
TENANTS_ARGS  ?=
bench-tenants: build
	$(GO) run ./scripts/peerbench tenants -edge bin/edge -nginx $(NGINX) -phase $(TENANTS_PHASE) -sets $(TENANTS_SETS) $(TENANTS_ARGS)

# A BIG_SIZE-byte object (10 GiB) through the edge, hashed by the origin and
# the client: equal, the time it took and the edge's peak resident memory.
BIG_SIZE ?= 10737418240
bench-big-object: build
	$(GO) run ./scripts/peerbench big -edge bin/edge -size $(BIG_SIZE)
