#!/usr/bin/env bash
# The Go tests as `make test` runs them: every package of `go list ./...`
# exactly once, under the race detector, at most two packages at once and
# never two heavy ones. The heavy end-to-end packages (HEAVY_PKGS: real
# servers, many processes, assertions on what happens while things are
# slow) run one at a time, in the order given; beside them the light
# packages run one at a time too (their output is printed when they are
# done). Two heavy packages at once competed for the cores of a small
# machine and for its timing; one after the other with the light ones
# beside them takes about as long as the heavy ones alone. The heavy
# packages' test binaries are built first, together (go test -c), and then
# run one after the other, each from its package's directory as go test
# runs it (an ok line with its time, or its whole output and a FAIL line):
# go test -p 1 would link each binary between two runs, about 5 s apiece on
# the run's critical path. A HEAVY_PKGS
# entry that is no package of the module, or listed twice, is an error, so a
# package can be neither skipped nor run twice; a new package runs with the
# light ones. internal/edge's allocation tests (named Allocs, built only
# without the race detector, whose instrumentation allocates) run once more
# in a build of their own after the light packages. `make test` puts its
# other light steps in that lane too: LIGHT_BEFORE runs before the light
# packages (the lint and the dashboards check), LIGHT_AFTER after them (the
# load-test module's tests and the package check); a failing one fails the
# run, and the light lane's output (theirs included) is printed at the end.
#
#   GO (go), TIMEOUT (12m, per test binary), HEAVY_PKGS (packages, one an
#   entry: import paths or ./dirs), LIGHT_BEFORE, LIGHT_AFTER (shell
#   commands, empty by default)
# The Consul and h2spec the tests start are the cached ones (tools.sh).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

GO=${GO:-go}
TIMEOUT=${TIMEOUT:-12m}
HEAVY_PKGS=${HEAVY_PKGS:-./internal/dashcheck ./internal/faults ./internal/edge/e2e ./internal/edge ./pkg/limiter}

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

echo "test-go: $(wc -l <<<"$heavy") heavy packages one at a time, beside them $(wc -l <<<"$light") light ones one at a time" >&2
light_out=$(mktemp)
bins=$(mktemp -d)
trap 'rm -rf "$light_out" "$light_out.rc" "$bins"' EXIT
t0=$SECONDS
# A background command starts with SIGINT ignored: env gives it back, so
# Ctrl-C stops the light packages as it stops the heavy ones.
# shellcheck disable=SC2086 # lists of packages
{
	rc=0
	: >"$light_out"
	if [ -n "${LIGHT_BEFORE:-}" ]; then
		echo "test-go: light lane: $LIGHT_BEFORE" >>"$light_out"
		env --default-signal=INT bash -c "$LIGHT_BEFORE" >>"$light_out" 2>&1 || rc=1
	fi
	env --default-signal=INT $GO test -race -count=1 -timeout "$TIMEOUT" -p 1 $light >>"$light_out" 2>&1 || rc=1
	# Allocation counts, asserted only in a build without the race
	# detector (its instrumentation allocates): the tests named Allocs in
	# files built with !race.
	env --default-signal=INT $GO test -count=1 -timeout "$TIMEOUT" -run 'Allocs' ./internal/edge/ >>"$light_out" 2>&1 || rc=1
	if [ -n "${LIGHT_AFTER:-}" ]; then
		echo "test-go: light lane: $LIGHT_AFTER" >>"$light_out"
		env --default-signal=INT bash -c "$LIGHT_AFTER" >>"$light_out" 2>&1 || rc=1
	fi
	echo "$rc $((SECONDS - t0))" >"$light_out.rc"
} &
light_pid=$!
# One binary a package, named after the import path's last element (go
# test -c refuses two of one name).
# shellcheck disable=SC2086
$GO test -race -c -o "$bins/" $heavy
rc_heavy=$?
if [ "$rc_heavy" -eq 0 ]; then
	for pkg in $heavy; do
		dir=$($GO list -f '{{.Dir}}' "$pkg") || { rc_heavy=1 && continue; }
		start=$EPOCHREALTIME
		out=$(cd "$dir" && "$bins/${pkg##*/}.test" -test.count=1 -test.timeout="$TIMEOUT" -test.paniconexit0 2>&1)
		status=$?
		took=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3fs", b - a }')
		if [ "$status" -eq 0 ]; then
			printf 'ok  \t%s\t%s\n' "$pkg" "$took"
		else
			printf '%s\nFAIL\t%s\t%s\n' "$out" "$pkg" "$took"
			rc_heavy=1
		fi
	done
fi
t_heavy=$((SECONDS - t0))
wait "$light_pid"
read -r rc_light t_light <"$light_out.rc" || { rc_light=1 t_light='?'; }
rm -f "$light_out.rc"
echo "--- light packages ---"
cat "$light_out"
echo "test-go: heavy packages ${t_heavy} s (status $rc_heavy), light packages beside them ${t_light} s (status $rc_light)" >&2
[ "$rc_light" -eq 0 ] && [ "$rc_heavy" -eq 0 ]
