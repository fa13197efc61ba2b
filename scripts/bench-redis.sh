#!/usr/bin/env bash
# Runs the limiter's benchmarks (pkg/limiter/bench_test.go) RUNS times, each in
# a fresh process with fresh Redis servers, then prints benchstat over the runs
# and the tables of BENCHMARKS.md: ratios are computed within each run (Go path
# vs redis-benchmark on the same server a few seconds apart, pipelined vs
# single) and the median over runs is shown, which is what a shared machine
# allows. Whole runs are repeated rather than -count N, which would run each
# benchmark N times back to back and leave minutes between the two sides of a
# ratio.
#
#   scripts/bench-redis.sh                 # 6 runs (~3 min each on 2 cores)
#   RUNS=3 BENCH='BenchmarkRedisTake/standalone' scripts/bench-redis.sh
#   scripts/bench-redis.sh summarize out/run*.txt   # tables from earlier runs
#
# Needs redis-server, redis-cli and redis-benchmark (make tools) and, for the
# summary, benchstat through the Go module proxy.
set -euo pipefail
cd "$(dirname "$0")/.."

# summarize prints the BenchmarkRedisTake tables: medians over the files' runs
# (one run per file) of each figure and of each within-run ratio.
summarize() {
	awk '
	FNR == 1 { run++ }
	/^Benchmark/ {
		name = $1; sub(/-[0-9]+$/, "", name)
		for (i = 3; i < NF; i += 2) v[run, name, $(i + 1)] = $i
		if (!(name in names)) names[name] = ++nn # tables keep the benchmarks order
	}
	function put(metric, x) { if (x != "") print key, metric, x }
	function get(r, n, m) { return ((r, n, m) in v) ? v[r, n, m] : "" }
	function ratio(a, b) { return (a == "" || b == "" || b == 0) ? "" : a / b }
	END {
		for (r = 1; r <= run; r++) for (n in names) {
			if (n !~ /^BenchmarkRedisTake\/.*\/single$/) continue
			b = substr(n, 1, length(n) - length("/single"))
			key = sprintf("%04d:%s", names[n], b)
			split("redis-benchmark redis-benchmark-P16 single pipelined single-denied pipelined-denied", styles, " ")
			for (i = 1; i <= 6; i++) {
				s = styles[i]
				put(s ":rate", get(r, b "/" s, "decisions/s"))
				put(s ":allocs", get(r, b "/" s, "allocs/decision"))
				put(s ":redis", get(r, b "/" s, "redis-µs/decision"))
				put(s ":client", get(r, b "/" s, "client-µs/decision"))
			}
			put("frac1", ratio(get(r, b "/single", "decisions/s"), get(r, b "/redis-benchmark", "decisions/s")))
			put("frac16", ratio(get(r, b "/pipelined", "decisions/s"), get(r, b "/redis-benchmark-P16", "decisions/s")))
			put("gain", ratio(get(r, b "/pipelined", "decisions/s"), get(r, b "/single", "decisions/s")))
			put("rbgain", ratio(get(r, b "/redis-benchmark-P16", "decisions/s"), get(r, b "/redis-benchmark", "decisions/s")))
			put("denied1", ratio(get(r, b "/single-denied", "decisions/s"), get(r, b "/single", "decisions/s")))
			put("denied16", ratio(get(r, b "/pipelined-denied", "decisions/s"), get(r, b "/pipelined", "decisions/s")))
		}
	}' "$@" | sort -k1,1 -k2,2 -k3,3g | awk '
	function flush() {
		if (n == 0) return
		med[key] = (n % 2) ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2
		lo[key] = x[1]; hi[key] = x[n]
		runs[key] = n
		n = 0
	}
	{
		kk = $1 SUBSEP $2
		if (kk != key) { flush(); key = kk }
		if (!($1 in seen)) { seen[$1] = 1; order[++nb] = $1 }
		x[++n] = $3
	}
	function kilo(v) { return v >= 1000 ? sprintf("%.0fk", v / 1000) : sprintf("%.0f", v) }
	function f(b, m, fmt) { return ((b, m) in med) ? sprintf(fmt, med[b, m]) : "–" }
	function r(b, m) { return ((b, m) in med) ? kilo(med[b, m]) : "–" }
	# a within-run ratio: median, and the range over the runs
	function q(b, m) { return ((b, m) in med) ? sprintf("%.2f (%.2f–%.2f)", med[b, m], lo[b, m], hi[b, m]) : "–" }
	function label(b) { sub(/^[0-9]+:BenchmarkRedisTake\//, "", b); sub(/\//, " | ", b); return b }
	END {
		flush()
		print "Decisions per second: medians of " runs[order[1], "single:rate"] " runs. Fractions and gains: median (lowest–highest) of the ratio computed within each run."
		print ""
		print "| mode | algorithm | redis-benchmark | Go single | fraction | redis-benchmark -P16 | Go pipelined (16/Take) | fraction | Go pipelined ÷ single | redis-benchmark -P16 ÷ plain |"
		print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
		for (i = 1; i <= nb; i++) {
			b = order[i]
			printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", label(b), r(b, "redis-benchmark:rate"), r(b, "single:rate"), q(b, "frac1"),
				r(b, "redis-benchmark-P16:rate"), r(b, "pipelined:rate"), q(b, "frac16"), q(b, "gain"), q(b, "rbgain")
		}
		print ""
		print "Cost per decision: allocations, and CPU µs of the Redis servers (all nodes) and of the client"
		print ""
		print "| mode | algorithm | allocs single | allocs pipelined | Redis µs: redis-benchmark | Go single | redis-benchmark -P16 | Go pipelined | client µs: redis-benchmark | Go single | redis-benchmark -P16 | Go pipelined |"
		print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
		for (i = 1; i <= nb; i++) {
			b = order[i]
			printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", label(b), f(b, "single:allocs", "%.1f"), f(b, "pipelined:allocs", "%.1f"),
				f(b, "redis-benchmark:redis", "%.1f"), f(b, "single:redis", "%.1f"), f(b, "redis-benchmark-P16:redis", "%.1f"), f(b, "pipelined:redis", "%.1f"),
				f(b, "redis-benchmark:client", "%.1f"), f(b, "single:client", "%.1f"), f(b, "redis-benchmark-P16:client", "%.2f"), f(b, "pipelined:client", "%.2f")
		}
		print ""
		print "Denied path (exhausted keys: the scripts admit nothing, so they add nothing)"
		print ""
		print "| mode | algorithm | single-denied | ÷ single | pipelined-denied | ÷ pipelined | Redis µs single-denied | pipelined-denied |"
		print "|---|---|---:|---:|---:|---:|---:|---:|"
		for (i = 1; i <= nb; i++) {
			b = order[i]
			printf "| %s | %s | %s | %s | %s | %s | %s |\n", label(b), r(b, "single-denied:rate"), f(b, "denied1", "%.2f×"), r(b, "pipelined-denied:rate"),
				f(b, "denied16", "%.2f×"), f(b, "single-denied:redis", "%.1f"), f(b, "pipelined-denied:redis", "%.1f")
		}
	}'
}

if [[ "${1:-}" == summarize ]]; then
	shift
	summarize "$@"
	exit
fi

RUNS=${RUNS:-6} # benchstat gives a confidence interval from 6 samples on
BENCH=${BENCH:-'^Benchmark(RedisTake|MemoryTake|Decide)$'}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
for i in $(seq "$RUNS"); do
	echo "run $i of $RUNS -> $OUT/run$i.txt" >&2
	go test -run '^$' -bench "$BENCH" -benchmem -count 1 -timeout 60m ./pkg/limiter/ >"$OUT/run$i.txt"
done
cat "$OUT"/run*.txt >"$OUT/all.txt" # one sample per run for each benchmark
go run golang.org/x/perf/cmd/benchstat@latest "$OUT/all.txt"
echo
summarize "$OUT"/run*.txt
echo
go test -count 1 -run 'TestRedisMemoryPerKey' -v ./pkg/limiter/ | grep -E '^ +bench_test.go' | sed -E 's/^ +bench_test.go:[0-9]+: //'
