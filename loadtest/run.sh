#!/usr/bin/env bash
# Runs one scenario with the custom k6 against the stack:
#   loadtest/run.sh multi-region|overload|failover|soak [k6 run flags...]
# Outputs: $STACK_OUTPUTS if set, else .stack/outputs.json (written by
# make stack-up), else `terraform output -json` of the local environment.
# When the outputs name a Prometheus, k6 streams its metrics there
# (experimental-prometheus-rw) unless PROMETHEUS_RW=0.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
scenario="${1:?usage: $0 SCENARIO [k6 flags]}"
shift
script="$root/loadtest/scenarios/$scenario.js"
[ -f "$script" ] || { echo "loadtest: no scenario $scenario (have: $(cd "$root/loadtest/scenarios" && ls *.js | sed 's/\.js$//' | tr '\n' ' '))" >&2; exit 2; }
k6=$("$root/loadtest/build-k6.sh")

outputs="${STACK_OUTPUTS:-}"
if [ -z "$outputs" ]; then
	state="${STACK_STATE:-$root/.stack}"
	if [ -f "$state/outputs.json" ]; then
		outputs="$state/outputs.json"
	elif [ -d "$root/terraform/environments/local" ] && command -v terraform >/dev/null; then
		mkdir -p "$root/loadtest/results"
		outputs="$root/loadtest/results/outputs.json"
		terraform -chdir="$root/terraform/environments/local" output -json >"$outputs"
	else
		echo "loadtest: no stack outputs: run make stack-up (or set STACK_OUTPUTS)" >&2
		exit 1
	fi
fi
case "$outputs" in /*) ;; *) outputs="$PWD/$outputs" ;; esac
[ -f "$outputs" ] || { echo "loadtest: stack outputs $outputs: no such file" >&2; exit 1; }

args=()
prom=$(python3 -c 'import json,sys; v=json.load(open(sys.argv[1])).get("prometheus_url"); v=v.get("value") if isinstance(v,dict) else v; print(v or "")' "$outputs")
if [ -n "$prom" ] && [ "${PROMETHEUS_RW:-1}" != 0 ]; then
	export K6_PROMETHEUS_RW_SERVER_URL="${K6_PROMETHEUS_RW_SERVER_URL:-${prom%/}/api/v1/write}"
	export K6_PROMETHEUS_RW_TREND_STATS="${K6_PROMETHEUS_RW_TREND_STATS:-p(50),p(95),p(99),max}"
	export K6_PROMETHEUS_RW_PUSH_INTERVAL="${K6_PROMETHEUS_RW_PUSH_INTERVAL:-2s}"
	args+=(-o experimental-prometheus-rw --tag "testid=$scenario-$(date +%s)")
fi

# failover.js runs the stack's own drill tooling unless DRILL_CMD replaces it.
if [ "$scenario" = failover ] && [ -z "${DRILL_CMD:-}" ]; then
	mkdir -p "$root/loadtest/results/bin"
	(cd "$root" && "${GO:-go}" build -o loadtest/results/bin/drills ./cmd/drills)
	export EDGEGUARD_DRILLS="$root/loadtest/results/bin/drills"
fi

cd "$root"
export STACK_OUTPUTS="$outputs" EDGEGUARD_ROOT="$root"
# The REST API on a free port: runs side by side must not fight over 6565.
exec "$k6" run --quiet --address "${K6_ADDRESS:-127.0.0.1:0}" "${args[@]}" "$@" "$script"
