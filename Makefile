# edgeguard — see README.md. `make test` works on a brand-new Debian machine:
# it installs the servers the tests start (scripts/tools.sh) and runs them.
GO      ?= go
TIMEOUT ?= 12m

.PHONY: build run test bench lint tools k6 loadtest loadtest-smoke

build:
	$(GO) build ./...

# The edge on its own: embedded memory store, the example rules, a built-in
# demo origin. Try: curl -i localhost:8080/ (RateLimit fields; 429 after 10).
run:
	$(GO) run ./cmd/edge --rules examples/rules.yaml

tools:
	./scripts/tools.sh

lint:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# Every package runs under the race detector: they all have concurrency
# (stores, harness, shedder) or are cheap enough that it costs nothing.
# The Consul agent the harness starts is the one scripts/install-consul.sh
# built and cached (instant once cached; tools has just run it).
test: tools lint
	consul=$$(./scripts/install-consul.sh) && \
	EDGEGUARD_CONSUL="$$consul" $(GO) test -race -count=1 -timeout $(TIMEOUT) ./...
	cd loadtest && $(GO) vet ./... && EDGEGUARD_CONSUL="$$(../scripts/install-consul.sh)" $(GO) test -race -count=1 ./...

# Benchmarks against real Redis (standalone and Cluster), started by the
# harness; see BENCHMARKS.md for the figures and how to compare runs.
BENCH      ?= .
BENCHTIME  ?= 1s
COUNT      ?= 1
bench: tools
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) -count $(COUNT) -timeout 30m ./...

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
