#!/usr/bin/env bash
# The Go tests as `make test` runs them: every package of `go list ./...`
# exactly once, under the race detector. The heavy end-to-end packages
# (HEAVY_PKGS: real servers, many processes, assertions on what happens
# while things are slow) run one at a time, after the others, which run
# GOMAXPROCS at a time: two heavy packages at once competed for the cores of
# a small machine and for its timing. A HEAVY_PKGS entry that is no package
# of the module, or listed twice, is an error, so a package can be neither
# skipped nor run twice; a new package runs with the light ones.
#
#   GO (go), TIMEOUT (12m, per test binary), HEAVY_PKGS (packages, one an
#   entry: import paths or ./dirs)
# The Consul and h2spec the tests start are the cached ones (tools.sh).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

GO=${GO:-go}
TIMEOUT=${TIMEOUT:-12m}
HEAVY_PKGS=${HEAVY_PKGS:-./pkg/limiter ./internal/edge ./internal/edge/e2e ./internal/faults ./internal/dashcheck}

fail() {
	echo "test-go: $*" >&2
	exit 2
}

all=$($GO list ./...) || fail "go list ./... failed"
# shellcheck disable=SC2086 # a list of packages
heavy=$($GO list $HEAVY_PKGS) || fail "HEAVY_PKGS: not packages of this module: $HEAVY_PKGS"
# go list names a package once however often it is given.
read -ra words <<<"$HEAVY_PKGS"
[ "${#words[@]}" -eq "$(wc -l <<<"$heavy")" ] || fail "HEAVY_PKGS: one package per entry (no ... patterns), each once: $HEAVY_PKGS"
outside=$(grep -vxF -f <(echo "$all") <<<"$heavy")
[ -z "$outside" ] || fail "HEAVY_PKGS names packages outside ./...: $outside"
light=$(grep -vxF -f <(echo "$heavy") <<<"$all")
# Together, light and heavy are every package, each once.
[ "$(sort <<<"$light"$'\n'"$heavy")" = "$(sort <<<"$all")" ] || fail "light + heavy packages differ from go list ./..."

consul=${EDGEGUARD_CONSUL:-$(./scripts/install-consul.sh)} || fail "no Consul (make tools)"
h2spec=${EDGEGUARD_H2SPEC:-$(./scripts/install-h2spec.sh)} || fail "no h2spec (make tools)"
export EDGEGUARD_CONSUL=$consul EDGEGUARD_H2SPEC=$h2spec

echo "test-go: $(wc -l <<<"$light") packages GOMAXPROCS at a time, then $(wc -l <<<"$heavy") one at a time" >&2
t0=$SECONDS
# shellcheck disable=SC2086 # lists of packages
$GO test -race -count=1 -timeout "$TIMEOUT" $light
rc_light=$?
t1=$SECONDS
# shellcheck disable=SC2086
$GO test -race -count=1 -timeout "$TIMEOUT" -p 1 $heavy
rc_heavy=$?
t2=$SECONDS
echo "test-go: light packages $((t1 - t0)) s (status $rc_light), heavy packages one at a time $((t2 - t1)) s (status $rc_heavy)" >&2
[ "$rc_light" -eq 0 ] && [ "$rc_heavy" -eq 0 ]
