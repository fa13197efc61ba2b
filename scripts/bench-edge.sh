#!/usr/bin/env bash
# Runs the edge's wrk benchmarks (internal/edge/e2e/bench_test.go) RUNS times,
# each in a fresh process (fresh edge build, fresh Redis Cluster), and prints
# the tables of BENCHMARKS.md: medians over the runs, with the smallest and
# largest value in brackets. Ratios and added latencies are computed within
# each run (every configuration against `off` a few seconds earlier, shedder-on
# against shedder-off just before it), then their median is taken: on a
# shared machine that is what can be compared. Whole runs are repeated rather
# than -count N, which would run each configuration N times back to back.
#
#   scripts/bench-edge.sh                          # 3 runs (~2.5 min each on 2 cores)
#   RUNS=5 DURATION=10s scripts/bench-edge.sh
#   BENCH='BenchmarkEdgeWrk/(off|cluster|ratios)$' scripts/bench-edge.sh
#   scripts/bench-edge.sh summarize out/run*.txt   # tables from earlier runs
#
# The paired measure (BenchmarkEdgeWrk/paired/…): off and one configuration
# started once, wrk alternating between them in slices (A B, B A, …), ratios
# within each pair, pooled over RUNS runs; "aa" is off against off, the
# noise floor; "-pinned" binds both edges to CPU 0 and wrk to CPU 1;
# "-together" loads both edges at the same time, each pair one slice:
#
#   scripts/bench-edge.sh paired                    # 3 runs of 12 pairs of 3 s, every paired case
#   RUNS=2 PAIRS=16 SLICE=2s CASES='aa|cluster-leased' scripts/bench-edge.sh paired
#   scripts/bench-edge.sh summarize-paired out/paired*.txt
#
# Needs wrk, redis-server and redis-cli. DURATION is each measured wrk run
# (EDGE_BENCH_DURATION), CONNS its connections (EDGE_BENCH_CONNS, default 64).
set -euo pipefail
cd "$(dirname "$0")/.."

summarize() {
	awk '
	FNR == 1 { run++ }
	/^Benchmark(EdgeWrk|CriticalP99Overload|RedisScriptCost)/ {
		name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
		if (!(name in seen)) { seen[name] = 1; order[++nn] = name }
		for (i = 3; i < NF; i += 2) v[run, name, $(i + 1)] = $i
	}
	function has(r, n, m) { return (r, n, m) in v }
	function add(key, x) { cnt[key]++; val[key, cnt[key]] = x }
	function median(key,   n, i, j, t, a) {
		n = cnt[key]
		if (n == 0) return ""
		for (i = 1; i <= n; i++) a[i] = val[key, i]
		for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
		lo[key] = a[1]; hi[key] = a[n]
		return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	function show(key, fmt,   m) {
		m = median(key)
		if (m == "") return "–"
		if (cnt[key] == 1) return sprintf(fmt, m)
		return sprintf(fmt " (" fmt "–" fmt ")", m, lo[key], hi[key])
	}
	END {
		for (r = 1; r <= run; r++) for (k = 1; k <= nn; k++) {
			n = order[k]
			if (n !~ /^EdgeWrk\// || n == "EdgeWrk/ratios" || !has(r, n, "req/s")) continue
			base = (n == "EdgeWrk/shedder-on") ? "EdgeWrk/shedder-off" : "EdgeWrk/off"
			add(n SUBSEP "rps", v[r, n, "req/s"])
			add(n SUBSEP "p50", v[r, n, "p50-ms"])
			add(n SUBSEP "p99", v[r, n, "p99-ms"])
			add(n SUBSEP "cpu", v[r, n, "edge-cpu-s/1000req"] * 1000)
			add(n SUBSEP "other", v[r, n, "other-cores"])
			if (has(r, n, "script-calls/req")) add(n SUBSEP "script", v[r, n, "script-calls/req"])
			if (has(r, n, "redis-evalsha/req")) add(n SUBSEP "eval", v[r, n, "redis-evalsha/req"])
			if (has(r, n, "redis-cpu-s/1000req")) add(n SUBSEP "rcpu", v[r, n, "redis-cpu-s/1000req"] * 1000)
			if (has(r, n, "calls-in-flight")) add(n SUBSEP "inflight", v[r, n, "calls-in-flight"])
			if (has(r, n, "hot-master-cpu-s/1000req")) add(n SUBSEP "hotcpu", v[r, n, "hot-master-cpu-s/1000req"] * 1000)
			if (has(r, n, "hot-master-evalsha/req")) add(n SUBSEP "hoteval", v[r, n, "hot-master-evalsha/req"])
			if (has(r, n, "edge-syscr/req")) add(n SUBSEP "sys", sprintf("%.2f", v[r, n, "edge-syscr/req"]) + 0)
			if (has(r, n, "edge-syscw/req")) add(n SUBSEP "sysw", sprintf("%.2f", v[r, n, "edge-syscw/req"]) + 0)
			if (has(r, n, "fallbacks/run")) { fb[n] += v[r, n, "fallbacks/run"]; if (v[r, n, "fallbacks/run"] > 0) fbruns[n]++ }
			if (has(r, n, "ol-rate")) {
				add(n SUBSEP "olrate", v[r, n, "ol-rate"])
				add(n SUBSEP "oloff50", v[r, n, "ol-off-p50-ms"]); add(n SUBSEP "olon50", v[r, n, "ol-p50-ms"])
				add(n SUBSEP "oloff99", v[r, n, "ol-off-p99-ms"]); add(n SUBSEP "olon99", v[r, n, "ol-p99-ms"])
				add(n SUBSEP "old50", v[r, n, "ol-p50-ms"] - v[r, n, "ol-off-p50-ms"])
				add(n SUBSEP "old99", v[r, n, "ol-p99-ms"] - v[r, n, "ol-off-p99-ms"])
				add(n SUBSEP "olfail", v[r, n, "ol-failed"] * 100)
			}
			if (has(r, n, "script-calls/req") && has(r, base, "req/s") && n != base)
				add(n SUBSEP "lratio", (v[r, n, "edge-cpu-s/1000req"] - v[r, base, "edge-cpu-s/1000req"]) / v[r, base, "edge-cpu-s/1000req"])
			if (has(r, n "-plain", "req/s")) add(n SUBSEP "apgain", v[r, n, "req/s"] / v[r, n "-plain", "req/s"])
			if (has(r, base, "req/s") && n != base) {
				add(n SUBSEP "ratio", v[r, n, "req/s"] / v[r, base, "req/s"])
				add(n SUBSEP "d50", v[r, n, "p50-ms"] - v[r, base, "p50-ms"])
				add(n SUBSEP "d99", v[r, n, "p99-ms"] - v[r, base, "p99-ms"])
				add(n SUBSEP "dcpu", (v[r, n, "edge-cpu-s/1000req"] - v[r, base, "edge-cpu-s/1000req"]) * 1000)
			}
		}
		print "Edge under wrk: median over " run " runs (smallest–largest); ratios and added figures are per-run differences from `off` (shedder-on: from shedder-off)"
		print ""
		print "| configuration | runs | req/s | ÷ base | p50 ms | p50 added | p99 ms | p99 added | edge CPU ms / 1000 req | added | other load (cores) |"
		print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
		for (k = 1; k <= nn; k++) {
			n = order[k]
			if (n !~ /^EdgeWrk\// || cnt[n SUBSEP "rps"] == 0) continue
			label = n; sub(/^EdgeWrk\//, "", label)
			printf "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", label, cnt[n SUBSEP "rps"], show(n SUBSEP "rps", "%.0f"), show(n SUBSEP "ratio", "%.2f"),
				show(n SUBSEP "p50", "%.2f"), show(n SUBSEP "d50", "%+.2f"), show(n SUBSEP "p99", "%.1f"), show(n SUBSEP "d99", "%+.1f"),
				show(n SUBSEP "cpu", "%.1f"), show(n SUBSEP "dcpu", "%+.1f"), show(n SUBSEP "other", "%.2f")
		}
		print ""
		print "Per decision: the limiter CPU of the edge (edge CPU per request minus that of off in the same run) ÷ the edge CPU per request of off; read and write system calls of the edge per request (/proc/PID/io); fallback decisions summed over the runs"
		print ""
		print "| configuration | limiter CPU ÷ request CPU | syscalls read / req | syscalls write / req | fallbacks (runs with any) | req/s ÷ same with --redis-autopipeline=false |"
		print "|---|---:|---:|---:|---:|---:|"
		for (k = 1; k <= nn; k++) {
			n = order[k]
			if (n !~ /^EdgeWrk\// || cnt[n SUBSEP "rps"] == 0) continue
			label = n; sub(/^EdgeWrk\//, "", label)
			printf "| %s | %s | %s | %s | %d (%d) | %s |\n", label, show(n SUBSEP "lratio", "%.2f"), show(n SUBSEP "sys", "%.2f"), show(n SUBSEP "sysw", "%.2f"),
				fb[n], fbruns[n], show(n SUBSEP "apgain", "%.2f")
		}
		print ""
		print "Open loop at half the rate wrk reached on the limited edge (same run): the limited edge and a limiting-off edge one after the other"
		print ""
		print "| configuration | rate req/s | p50 off ms | p50 on ms | p50 added | p99 off ms | p99 on ms | p99 added | failed % |"
		print "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
		for (k = 1; k <= nn; k++) {
			n = order[k]
			if (cnt[n SUBSEP "olrate"] == 0) continue
			label = n; sub(/^EdgeWrk\//, "", label)
			printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", label, show(n SUBSEP "olrate", "%.0f"), show(n SUBSEP "oloff50", "%.2f"), show(n SUBSEP "olon50", "%.2f"),
				show(n SUBSEP "old50", "%+.2f"), show(n SUBSEP "oloff99", "%.1f"), show(n SUBSEP "olon99", "%.1f"), show(n SUBSEP "old99", "%+.1f"), show(n SUBSEP "olfail", "%.2f")
		}
		print ""
		print "Limiter store traffic"
		print ""
		print "| configuration | script calls / req (edge) | EVALSHA / req (Redis masters) | Redis CPU ms / 1000 req (all nodes) | store calls in flight (mean) | busiest master: EVALSHA / req | busiest master: CPU ms / 1000 req |"
		print "|---|---:|---:|---:|---:|---:|---:|"
		for (k = 1; k <= nn; k++) {
			n = order[k]
			if (n !~ /^EdgeWrk\// || cnt[n SUBSEP "script"] == 0) continue
			label = n; sub(/^EdgeWrk\//, "", label)
			printf "| %s | %s | %s | %s | %s | %s | %s |\n", label, show(n SUBSEP "script", "%.3f"), show(n SUBSEP "eval", "%.3f"),
				show(n SUBSEP "rcpu", "%.1f"), show(n SUBSEP "inflight", "%.2f"), show(n SUBSEP "hoteval", "%.3f"), show(n SUBSEP "hotcpu", "%.2f")
		}
		ns = 0
		for (r = 1; r <= run; r++) for (k = 1; k <= nn; k++) {
			n = order[k]
			if (n !~ /^RedisScriptCost\// || !has(r, n, "script/incr-expire")) continue
			add(n SUBSEP "sus", v[r, n, "script-redis-µs/decision"]); add(n SUBSEP "ius", v[r, n, "incr-expire-redis-µs/decision"])
			add(n SUBSEP "sratio", v[r, n, "script/incr-expire"]); ns++
		}
		if (ns > 0) {
			print ""
			print "Redis CPU per decision: each script against INCRBY+EXPIRE of the same number of keys (ratio within each run)"
			print ""
			print "| algorithm / style | script µs | INCRBY+EXPIRE µs | ratio |"
			print "|---|---:|---:|---:|"
			for (k = 1; k <= nn; k++) {
				n = order[k]
				if (cnt[n SUBSEP "sratio"] == 0) continue
				label = n; sub(/^RedisScriptCost\//, "", label)
				printf "| %s | %s | %s | %s |\n", label, show(n SUBSEP "sus", "%.1f"), show(n SUBSEP "ius", "%.1f"), show(n SUBSEP "sratio", "%.2f")
			}
		}
		n = "CriticalP99Overload"
		for (r = 1; r <= run; r++) if (has(r, n, "p99-ratio")) {
			add("u99", v[r, n, "unloaded-p99-ms"]); add("l99", v[r, n, "overload-p99-ms"]); add("s99", v[r, n, "overload-steady-p99-ms"])
			add("ratio", v[r, n, "p99-ratio"]); add("sratio", v[r, n, "steady-p99-ratio"]); add("ok", v[r, n, "critical-success"] * 100)
		}
		if (cnt["ratio"] > 0) {
			print ""
			print "Critical tier under 3× overload: median over " cnt["ratio"] " runs (smallest–largest)"
			print ""
			print "| unloaded p99 ms | 3× overload p99 ms | ratio | p99 ms after the ramp | ratio | critical success % |"
			print "|---:|---:|---:|---:|---:|---:|"
			printf "| %s | %s | %s | %s | %s | %s |\n", show("u99", "%.1f"), show("l99", "%.1f"), show("ratio", "%.2f"),
				show("s99", "%.1f"), show("sratio", "%.2f"), show("ok", "%.1f")
		}
	}' "$@"
}

# summarize_paired pools the PAIR lines of the runs: per case, the median of
# the pairs' ratios, their quartiles and a bootstrap 95% interval of the
# median (2,000 resamples, fixed seed), with script calls per request over
# all of B's slices and the load average seen.
summarize_paired() {
	awk '
	function q(a, n, p,   h, i) { h = p * (n - 1); i = int(h); return (i + 1 >= n) ? a[n] : a[i + 1] + (h - i) * (a[i + 2] - a[i + 1]) }
	function sort(a, n,   i, j, t) { for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t } }
	function stats(c, kind,   n, i, k, a, m, r, meds) {
		n = cnt[c]
		for (i = 1; i <= n; i++) a[i] = v[c, kind, i]
		sort(a, n)
		med = q(a, n, 0.5); p25 = q(a, n, 0.25); p75 = q(a, n, 0.75)
		srand(1)
		for (k = 1; k <= 2000; k++) {
			for (i = 1; i <= n; i++) r[i] = a[int(rand() * n) + 1]
			sort(r, n); meds[k] = q(r, n, 0.5)
		}
		sort(meds, 2000); lo = q(meds, 2000, 0.025); hi = q(meds, 2000, 0.975)
		return sprintf("%.3f [%.3f–%.3f] (%.3f–%.3f)", med, p25, p75, lo, hi)
	}
	/ PAIR case=/ {
		for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
		c = f["case"]
		if (!(c in cnt)) order[++nc] = c
		n = ++cnt[c]
		v[c, "rps", n] = f["rps_b"] / f["rps_a"]
		v[c, "cpu", n] = (f["cpu_us_b"] - f["cpu_us_a"]) / f["cpu_us_a"]
		req[c] += f["req_b"]; scr[c] += f["scripts_b"]; ev[c] += f["evalsha_b"]
	}
	/ LOAD case=/ {
		for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
		c = f["case"]
		for (j = 0; j < 2; j++) {
			l = f[j ? "load1_end" : "load1_start"] + 0
			if (!(c in lmin) || l < lmin[c]) lmin[c] = l
			if (!(c in lmax) || l > lmax[c]) lmax[c] = l
		}
	}
	END {
		print "Paired, interleaved: each case against off; per pair B ÷ A; median [interquartile range] (bootstrap 95% interval of the median)"
		print ""
		print "| case | pairs | req/s ÷ off | CPU per request (B − A) ÷ A | script calls / req | EVALSHA / req | load average (1 min) |"
		print "|---|---:|---|---|---:|---:|---|"
		for (k = 1; k <= nc; k++) {
			c = order[k]
			printf "| %s | %d | %s | %s | %.4f | %.4f | %.1f–%.1f |\n", c, cnt[c], stats(c, "rps"), stats(c, "cpu"),
				scr[c] / req[c], ev[c] / req[c], lmin[c], lmax[c]
		}
	}' "$@"
}

if [[ "${1:-}" == summarize ]]; then
	shift
	summarize "$@"
	exit
fi
if [[ "${1:-}" == summarize-paired ]]; then
	shift
	summarize_paired "$@"
	exit
fi
if [[ "${1:-}" == paired ]]; then
	RUNS=${RUNS:-3}
	CASES=${CASES:-'aa|aa-pinned|aa-together|standalone-leased|cluster-leased|standalone-leased-pinned|cluster-leased-pinned|standalone-leased-together|cluster-leased-together'}
	OUT=${OUT:-$(mktemp -d)}
	export EDGE_BENCH_PAIRS=${PAIRS:-12} EDGE_BENCH_SLICE=${SLICE:-3s} EDGE_BENCH_CONNS=${CONNS:-64}
	mkdir -p "$OUT"
	for i in $(seq "$RUNS"); do
		echo "paired run $i of $RUNS -> $OUT/paired$i.txt" >&2
		# -v: every PAIR line (without it a benchmark's log stops at 10 lines).
		go test -v -run '^$' -bench "BenchmarkEdgeWrk/paired/($CASES)\$" -benchtime 1x -count 1 -timeout 60m ./internal/edge/e2e/ >"$OUT/paired$i.txt" ||
			echo "paired run $i: some cases failed (see $OUT/paired$i.txt)" >&2
	done
	summarize_paired "$OUT"/paired*.txt
	exit
fi

RUNS=${RUNS:-3}
BENCH=${BENCH:-'BenchmarkEdgeWrk|BenchmarkCriticalP99Overload|BenchmarkRedisScriptCost'}
OUT=${OUT:-$(mktemp -d)}
export EDGE_BENCH_DURATION=${DURATION:-8s} EDGE_BENCH_CONNS=${CONNS:-64}
mkdir -p "$OUT"
for i in $(seq "$RUNS"); do
	echo "run $i of $RUNS -> $OUT/run$i.txt" >&2
	# A failed configuration prints no result line: the others still count.
	go test -run '^$' -bench "$BENCH" -benchtime 1x -count 1 -timeout 30m ./internal/edge/e2e/ >"$OUT/run$i.txt" ||
		echo "run $i: some benchmarks failed (see $OUT/run$i.txt)" >&2
done
summarize "$OUT"/run*.txt
