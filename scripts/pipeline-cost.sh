#!/usr/bin/env bash
# Instructions one request costs the edge, per path of BenchmarkPipelineCost
# (internal/edge/cost_bench_test.go): denied, proxied, ruled, shed. Each
# sample is two callgrind runs of the benchmark, 2,000 and 6,000 requests,
# counted everywhere, and prints:
#   - whole process: the difference of the two runs' totals over the 4,000
#     requests between them. The harness's copy of the request, the
#     loopback origin's server (proxied, ruled) and the background
#     goroutines are in it; the start-up and the warm-up are not;
#   - inside Handle: what the longer run's calls from the benchmark's loop
#     into Pipeline.Handle cost with everything under them. While a
#     proxied or ruled request waits for the origin, the origin's server
#     runs on the same thread, and in some runs callgrind counts its work
#     under Handle too (those runs read about 12,000 instructions higher),
#     so for those paths read the whole-process figure.
# Instruction counts hold on a busy machine where times do not.
#
#   scripts/pipeline-cost.sh                      # every path, RUNS=2 samples each
#   RUNS=3 scripts/pipeline-cost.sh denied shed
#   TEST_BIN=old.test scripts/pipeline-cost.sh    # go test -c ./internal/edge, built elsewhere
#
# Needs valgrind. It stops by itself: loopback only, free ports.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v callgrind_annotate >/dev/null || { echo "pipeline-cost: valgrind is missing (apt-get install valgrind)" >&2; exit 1; }

RUNS="${RUNS:-2}"
paths=("$@")
[ ${#paths[@]} -gt 0 ] || paths=(denied proxied ruled shed)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bin="${TEST_BIN:-}"
if [ -z "$bin" ]; then
	bin="$work/edge.test"
	go test -trimpath -c -o "$bin" ./internal/edge
fi
bin=$(realpath "$bin")

# count N OUT: a callgrind run of N requests of $path; prints its total.
count() {
	(cd internal/edge && GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off GOMAXPROCS=1 valgrind --tool=callgrind \
		--callgrind-out-file="$2" "$bin" -test.run '^$' -test.bench "BenchmarkPipelineCost/$path\$" \
		-test.benchtime "${1}x" >"$work/log" 2>&1) || { cat "$work/log" >&2; exit 1; }
	awk '/^(summary|totals):/ { print $2; exit }' "$2"
}

for path in "${paths[@]}"; do
	for run in $(seq "$RUNS"); do
		short=$(count 2000 "$work/short.out")
		long=$(count 6000 "$work/long.out")
		# The calls from the benchmark's loop (costEdge's func3) into
		# Handle. callgrind may file them under recursion levels
		# (Handle'2) when a goroutine switch hides a return: the level
		# holding the loop's calls is read.
		inside=$(callgrind_annotate --tree=caller --inclusive=yes "$work/long.out" 2>/dev/null | awk '
			/  < .*costEdge\.func[0-9]+ \(/ {
				c = $1; gsub(",", "", c)
				n = $0; sub(/.*\(/, "", n); sub(/x\).*/, "", n); gsub(",", "", n)
				next
			}
			/^$/ { c = 0; n = 0 }
			/\*  .*pipeline\.\(\*Pipeline\)\.Handle/ && n > best { best = n; cost = c }
			END { if (best > 0) printf "%d (%d of the loop'\''s calls)", cost / best, best; else print "not found" }')
		printf '%-8s sample %d: whole process %d, inside Handle %s instructions a request\n' \
			"$path" "$run" $(((long - short) / 4000)) "$inside"
	done
done
