#!/usr/bin/env bash
# The edge's rate limit service (`edge rls`) against envoyproxy/ratelimit,
# side by side on loopback, on one redis-server and one configuration file
# (one descriptor key, 10,000 values, a quota no call reaches: every call
# is a Redis decision). cmd/rlsbench drives each with a closed loop of
# ShouldRateLimit calls (CONC in flight over 4 gRPC connections) and reads
# the CPU time the service and Redis spent. Each round measures both,
# alternating which goes first, ROUNDS rounds; it prints every measurement,
# then the medians of the edge/reference ratios within rounds: calls per
# CPU second of the service, and p99 latency.
#
#   scripts/bench-rls.sh PATH-TO-RATELIMIT-BINARY
#   ROUNDS=5 DURATION=10 CONC=32 scripts/bench-rls.sh ~/ratelimit
#
# The reference runs with its defaults (no local cache, no response
# headers, REDIS_PIPELINE_WINDOW unset); RL_ENV adds settings to it
# (RL_ENV="REDIS_PIPELINE_WINDOW=150us REDIS_PIPELINE_LIMIT=8"). The edge
# runs as `edge rls` (the service alone, the drop-in) with the same
# settings as the reference, and its defaults otherwise (no header fields,
# autopipelining on). EDGE_MODE=listen runs an edge that also proxies,
# serving the API on --rls-listen with --rls-headers off; EDGE_ARGS adds
# flags to that one.
set -euo pipefail
cd "$(dirname "$0")/.."

RL_BIN="${1:?usage: scripts/bench-rls.sh PATH-TO-RATELIMIT-BINARY}"
[ -x "$RL_BIN" ] || { echo "bench-rls: $RL_BIN is not an executable" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "bench-rls: redis-server is missing (apt-get install redis-server)" >&2; exit 1; }
ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-10}" # seconds per measurement
CONC="${CONC:-32}"
RL_ENV="${RL_ENV:-}"
EDGE_ARGS="${EDGE_ARGS:-}"
EDGE_MODE="${EDGE_MODE:-rls}"

# $work, $pids (killed at exit) and port.
. scripts/bench-common.sh
wait_port() {
	for _ in $(seq 100); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	echo "bench-rls: nothing listens on $1" >&2
	exit 1
}
REDIS=$(port) EDGE=$(port) EDGE_ADMIN=$(port) EDGE_RLS=$(port) RL_GRPC=$(port) RL_HTTP=$(port) RL_DEBUG=$(port)

mkdir -p "$work/runtime/ratelimit/config"
cat >"$work/runtime/ratelimit/config/bench.yaml" <<'EOF'
domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 1000000000
EOF

go build -o "$work/edge" ./cmd/edge
go build -o "$work/rlsbench" ./cmd/rlsbench

redis-server --port "$REDIS" --bind 127.0.0.1 --save '' --appendonly no --daemonize no --logfile "$work/redis.log" &
pids+=($!)
REDIS_PID=$!
wait_port "$REDIS"

if [ "$EDGE_MODE" = rls ]; then
	# The drop-in: `edge rls` with the reference's own settings.
	EDGEGUARD_DRAIN_DELAY=0 USE_STATSD=false LOG_LEVEL=error REDIS_SOCKET_TYPE=tcp REDIS_TYPE=SINGLE REDIS_URL="127.0.0.1:$REDIS" \
		RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
		HOST=127.0.0.1 PORT="$EDGE" GRPC_HOST=127.0.0.1 GRPC_PORT="$EDGE_RLS" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$EDGE_ADMIN" \
		"$work/edge" rls >"$work/edge.log" 2>&1 &
else
	# shellcheck disable=SC2086 # EDGE_ARGS is a list of flags
	EDGEGUARD_KEY_SALT=bench-rls-key-salt-0123 "$work/edge" --listen "127.0.0.1:$EDGE" --admin "127.0.0.1:$EDGE_ADMIN" \
		--demo-origin --redis "redis://127.0.0.1:$REDIS" --region bench --pop bench --log-level error \
		--rls-listen "127.0.0.1:$EDGE_RLS" --rls-config-dir "$work/runtime/ratelimit/config" --rls-headers off $EDGE_ARGS \
		>"$work/edge.log" 2>&1 &
fi
pids+=($!)
EDGE_PID=$!
wait_port "$EDGE_RLS"

# shellcheck disable=SC2086 # RL_ENV is a list of settings
env $RL_ENV USE_STATSD=false LOG_LEVEL=error REDIS_SOCKET_TYPE=tcp REDIS_TYPE=SINGLE REDIS_URL="127.0.0.1:$REDIS" \
	RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
	HOST=127.0.0.1 PORT="$RL_HTTP" GRPC_HOST=127.0.0.1 GRPC_PORT="$RL_GRPC" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$RL_DEBUG" \
	"$RL_BIN" >"$work/ratelimit.log" 2>&1 &
pids+=($!)
RL_PID=$!
wait_port "$RL_GRPC"

measure() { # label addr pid
	"$work/rlsbench" -label "$1" -addr "$2" -pids "service=$3,redis=$REDIS_PID" -concurrency "$CONC" -duration "${DURATION}s" | tee -a "$work/results.jsonl"
}
echo "rounds=$ROUNDS duration=${DURATION}s concurrency=$CONC cpus=$(nproc) reference=$RL_BIN ${RL_ENV:+($RL_ENV)} edge: $EDGE_MODE ${EDGE_ARGS:+$EDGE_ARGS}"
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then
		measure edge "127.0.0.1:$EDGE_RLS" "$EDGE_PID"
		measure reference "127.0.0.1:$RL_GRPC" "$RL_PID"
	else
		measure reference "127.0.0.1:$RL_GRPC" "$RL_PID"
		measure edge "127.0.0.1:$EDGE_RLS" "$EDGE_PID"
	fi
done

python3 - "$work/results.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
edge = [r for r in rows if r["label"] == "edge"]
ref = [r for r in rows if r["label"] == "reference"]
def med(rs, f): return statistics.median(f(r) for r in rs)
print()
print("%-10s %12s %14s %14s %9s %9s %8s" % ("", "calls/s", "calls/CPU-s", "redis CPU/call", "p50 µs", "p99 µs", "errors"))
for name, rs in (("edge", edge), ("reference", ref)):
    print("%-10s %12.0f %14.0f %12.1f µs %9.0f %9.0f %8d" % (name, med(rs, lambda r: r["calls_per_second"]),
        med(rs, lambda r: r["calls_per_cpu_second"]), med(rs, lambda r: 1e6 * r["cpu_seconds"]["redis"] / max(1, r["calls"])),
        med(rs, lambda r: r["p50_us"]), med(rs, lambda r: r["p99_us"]), sum(r["errors"] for r in rs)))
ratio = lambda f: statistics.median(f(e) / f(x) for e, x in zip(edge, ref))
print()
print("edge/reference, median of the per-round ratios:")
print("  calls per CPU second of the service: %.2fx" % ratio(lambda r: r["calls_per_cpu_second"]))
print("  calls per second:                    %.2fx" % ratio(lambda r: r["calls_per_second"]))
print("  p99 latency:                         %.2fx (below 1: the edge's is lower)" % ratio(lambda r: r["p99_us"]))
EOF
