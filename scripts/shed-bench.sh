#!/usr/bin/env bash
# The shedder benchmark on the applied stack (make stack-up): runs
# loadtest/scenarios/shed-bench.js ROUNDS times in each mode, alternated
# (today, adaptive; then adaptive, today; ...), and prints each mode's
# figures as median (smallest–largest) over its runs. Each run's figures
# stay in loadtest/results/shed-bench-<stamp>-r<N>-<mode>-*.json.
#
#   scripts/shed-bench.sh            ROUNDS (3), SCALE (0.5), SLOWDOWN (2), SETTINGS
#                                    (adaptive.min_limit=2), REGION, FACTOR, UNLOADED,
#                                    STEP, HALVED, REQUEST_TIMEOUT, VU_SECONDS
#
# SCALE and SLOWDOWN run the origin at 4 of its 8 workers and twice its
# service time (100 req/s, 300 at 3x: what one k6 sends on time on two
# shared cores); SETTINGS go to the region's shedder with each mode
# (min_limit 2: the halved origin's 2 workers, split between the edges).
# It leaves the region's shedder at adaptive.enabled=false (the default),
# with SETTINGS applied, and its origin at the capacity it found.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds="${ROUNDS:-3}"
stamp=$(date -u +%Y%m%dT%H%M%S)
args=(-e "SCALE=${SCALE:-0.5}" -e "SLOWDOWN=${SLOWDOWN:-2}" -e "SETTINGS=${SETTINGS-adaptive.min_limit=2}")
for v in REGION FACTOR UNLOADED_FACTOR UNLOADED STEP HALVED REQUEST_TIMEOUT VU_SECONDS; do
	[ -z "${!v:-}" ] || args+=(-e "$v=${!v}")
done
# The generator shares the cores with the stack: no remote write.
export PROMETHEUS_RW=0

runs=()
rc=0
for ((r = 1; r <= rounds; r++)); do
	modes=(today adaptive)
	((r % 2)) || modes=(adaptive today)
	for mode in "${modes[@]}"; do
		run="$stamp-r$r-$mode"
		echo "== shed-bench round $r/$rounds: $mode"
		if "$root/loadtest/run.sh" shed-bench -e "MODE=$mode" -e "RUN=$run" "${args[@]}" 2> >(grep -v 'level=warning' >&2); then
			runs+=("$run")
		else
			echo "shed-bench: run $run failed (exit $?)" >&2
			rc=1
			[ -f "$root/loadtest/results/shed-bench-$run-figures.json" ] && runs+=("$run")
		fi
	done
done

# Back to the default mode (the last run may have been adaptive).
outputs="${STACK_OUTPUTS:-${STACK_STATE:-$root/.stack}/outputs.json}"
python3 - "$outputs" "${REGION:-}" <<'PY' | sh
import json, shlex, sys
o = json.load(open(sys.argv[1]))
v = lambda x: x["value"] if isinstance(x, dict) and "value" in x else x
regions = v(o["regions"])
region = sys.argv[2] or ("us-east" if "us-east" in regions else sorted(regions)[0])
consul = regions[region]["consul"]["http"].split("://")[-1]
print(" ".join(shlex.quote(a) for a in [v(o["state_dir"]) + "/bin/regionctl", "--consul", consul, "shedder", "set", "--region", region, "adaptive.enabled=false"]) + " >/dev/null")
PY

python3 - "$root/loadtest/results" "${runs[@]}" <<'PY'
import json, os, statistics, sys
results, runs = sys.argv[1], sys.argv[2:]
by = {"today": [], "adaptive": []}
for run in runs:
    fig = json.load(open(os.path.join(results, f"shed-bench-{run}-figures.json")))
    k6p = os.path.join(results, f"shed-bench-{run}-k6.json")
    fig["k6"] = json.load(open(k6p)) if os.path.exists(k6p) else {}
    by[fig["mode"]].append(fig)

def cell(xs, fmt):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return fmt(xs[0])
    return f"{fmt(statistics.median(xs))} ({fmt(min(xs))}–{fmt(max(xs))})"

pct = lambda x: f"{100 * x:.0f} %"
ms = lambda x: f"{x:.0f}"
ratio = lambda x: f"{x:.1f}"
sec = lambda x: f"{x:.0f}"
std = lambda x: f"{x:.3f}"
rows = [
    ("seconds from the step to goodput ≥ 90 % (1 s windows)", lambda f: f["step"]["seconds_to_90"], sec),
    ("goodput / capacity, 3× step, from 5 s on", lambda f: f["step"]["goodput_ratio_after_5s"], pct),
    ("… share of its 1 s windows at ≥ 90 %", lambda f: f["step"]["good_windows_after_5s"], pct),
    ("seconds from the halving to goodput ≥ 90 %", lambda f: f["halved"]["seconds_to_90"], sec),
    ("goodput / capacity, halved, from 5 s on", lambda f: f["halved"]["goodput_ratio_after_5s"], pct),
    ("… share of its 1 s windows at ≥ 90 %", lambda f: f["halved"]["good_windows_after_5s"], pct),
    ("offered at the edges, req/s, 3× step, from 5 s on", lambda f: f["step"].get("offered_after_5s"), lambda x: f"{x:.0f}"),
    ("offered at the edges, req/s, halved, from 5 s on", lambda f: f["halved"].get("offered_after_5s"), lambda x: f"{x:.0f}"),
    ("unloaded p99 ms (k6)", lambda f: f["unloaded_p99_ms"], ms),
    ("admitted p99 ms, 3× step, from 5 s on (k6)", lambda f: f["step"]["admitted_p99_ms"], ms),
    ("admitted p99 ms, halved, from 5 s on (k6)", lambda f: f["halved"]["admitted_p99_ms"], ms),
    ("… 3× step ÷ unloaded (k6)", lambda f: f["step"]["p99_ratio"], ratio),
    ("… halved ÷ unloaded (k6)", lambda f: f["halved"]["p99_ratio"], ratio),
    ("unloaded p99 ms (edges)", lambda f: f["edge_unloaded_p99_ms"], ms),
    ("admitted p99 ms, 3× step, from 5 s on (edges)", lambda f: f["step"]["edge_p99_ms"], ms),
    ("admitted p99 ms, halved, from 5 s on (edges)", lambda f: f["halved"]["edge_p99_ms"], ms),
    ("… 3× step ÷ unloaded (edges)", lambda f: f["step"]["edge_p99_ratio"], ratio),
    ("… halved ÷ unloaded (edges)", lambda f: f["halved"]["edge_p99_ratio"], ratio),
    ("rejection ratio, 3× step, from 5 s on", lambda f: f["step"]["rejection_mean_after_5s"], std),
    ("rejection ratio, halved, from 5 s on", lambda f: f["halved"]["rejection_mean_after_5s"], std),
    ("rejection ratio stddev over 1 s, largest 10 s window of the overload", lambda f: f["rejection_stddev_10s_max"], std),
]
n = {m: len(v) for m, v in by.items()}
print()
print(f"shed-bench: {n['today']} run(s) today, {n['adaptive']} adaptive; median (smallest–largest)")
print()
print("| | today's shedder | adaptive |")
print("|---|---:|---:|")
for name, get, fmt in rows:
    print(f"| {name} | " + " | ".join(cell([get(f) for f in by[m]], fmt) for m in ("today", "adaptive")) + " |")
for m in ("today", "adaptive"):
    lost = sum(f["k6"].get("critical_lost", 0) for f in by[m])
    sent = sum(f["k6"].get("critical_sent", 0) for f in by[m])
    sentall = [f["k6"].get("requests_per_s") for f in by[m]]
    dropped = sum(f["k6"].get("dropped_iterations", 0) for f in by[m])
    missed = sum(f.get("windows_missed", 0) for f in by[m])
    refused = sum(f.get("critical_refused_by_edges") or 0 for f in by[m])
    print(f"{m}: critical lost {lost:.0f} of {sent:.0f} (k6: not a 200, timeouts included), refused by the edges {refused:.0f}; k6 sent {cell(sentall, lambda x: f'{x:.0f}')} req/s, dropped {dropped:.0f} iterations; {missed} sampler window(s) missed")
    causes = {}
    for f in by[m]:
        for tier, cs in f["k6"].get("not_ok", {}).items():
            for c, v in cs.items():
                causes.setdefault(tier, {}).setdefault(c, 0)
                causes[tier][c] += v
    if causes:
        print(f"{m}: not a 200, by tier and cause (all runs): " + "; ".join(
            f"{tier} " + ", ".join(f"{c} {v:.0f}" for c, v in cs.items() if v) for tier, cs in causes.items() if any(cs.values())))
PY
exit $rc
