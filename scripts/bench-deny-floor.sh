#!/usr/bin/env bash
# What a denial costs the edge against the floor of its own server, side by
# side on loopback: the edge answering a flooding client's 429 from its
# over-limit cache (one per-address rule, sliding_log 10 per hour, the
# memory store), and scripts/denyfloor answering the same 429 with none of
# the edge's pipeline, once over a bare listener ("server": fasthttp as
# the edge configures it) and once through the edge's accept stack and
# framing reader ("listeners"). The three answers are checked to be the
# same bytes (the Date aside) before anything is measured.
#
# It reports, per server:
#   - CPU per request: utime + stime from /proc over N keep-alive requests
#     (h2load --h1, CONNS connections), SETS alternated sets (the order
#     rotates), each set's ratios to the bare server, and their medians;
#   - instructions per request (CALLGRIND=1, the default): each server
#     alone under callgrind (GOMAXPROCS=1, async preemption off), counters
#     zeroed after a warm-up, CG_N requests, then as long again idle, whose
#     count (the background goroutines, which run by the clock and so count
#     for far more under valgrind's slowdown) is taken off. Instruction
#     counts hold on a busy machine where times do not; they leave out the
#     kernel's part of a system call;
#   - system calls per request (STRACE=1, the default): strace -c -f over
#     N/5 requests.
#
#   scripts/bench-deny-floor.sh
#   SETS=5 N=200000 CALLGRIND=0 scripts/bench-deny-floor.sh
#   EDGE_BIN=/path/to/edge scripts/bench-deny-floor.sh   # a binary built elsewhere
#
# Needs h2load (nghttp2-client), curl and python3; valgrind and strace for
# their parts. Everything runs on loopback, on free ports, and stops by
# itself.
set -euo pipefail
cd "$(dirname "$0")/.."

SETS="${SETS:-3}"
N="${N:-100000}"
CONNS="${CONNS:-16}"
CALLGRIND="${CALLGRIND:-1}"
CG_N="${CG_N:-20000}"
STRACE="${STRACE:-1}"

need() { command -v "$1" >/dev/null || { echo "bench-deny-floor: $1 is missing ($2)" >&2; exit 1; }; }
need h2load "apt-get install nghttp2-client"
need curl "apt-get install curl"
need python3 "apt-get install python3"
[ "$CALLGRIND" = 1 ] && need callgrind_control "apt-get install valgrind"
[ "$STRACE" = 1 ] && need strace "apt-get install strace"

# $work, $pids (killed at exit) and port.
. scripts/bench-common.sh

if [ -n "${EDGE_BIN:-}" ]; then
	cp "$EDGE_BIN" "$work/edge"
else
	go build -o "$work/edge" ./cmd/edge
fi
go build -o "$work/denyfloor" ./scripts/denyfloor
cat >"$work/rules.yaml" <<'EOF'
version: 1
rules:
  - {id: per-ip, key: [ip], algorithm: sliding_log, limit: 10, window: 1h}
EOF

names=(edge listeners server)
# cmd NAME PORT: the command line of one server.
cmd() {
	case $1 in
	edge) echo "$work/edge --listen 127.0.0.1:$2 --admin 127.0.0.1:$(port) --rules $work/rules.yaml --demo-origin --drain-delay 0" ;;
	listeners) echo "$work/denyfloor -listen 127.0.0.1:$2 -listeners" ;;
	server) echo "$work/denyfloor -listen 127.0.0.1:$2" ;;
	esac
}
up() { # PORT
	for _ in $(seq 600); do
		curl -s -o /dev/null "http://127.0.0.1:$1/" && return 0
		sleep 0.1
	done
	echo "bench-deny-floor: nothing answers on port $1" >&2
	exit 1
}
load() { # PORT COUNT → h2load's output
	h2load --h1 -n "$2" -c "$CONNS" -t 1 "http://127.0.0.1:$1/p" 2>&1
}
check_load() { # NAME COUNT OUTPUT: every request answered 429
	if ! grep -q "status codes: 0 2xx, 0 3xx, $2 4xx, 0 5xx" <<<"$3"; then
		echo "bench-deny-floor: $1 did not answer $2 429s:" >&2
		grep -E 'requests:|status codes:' <<<"$3" >&2
		exit 1
	fi
}
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # clock ticks
tck=$(getconf CLK_TCK)

declare -A P PID
for s in "${names[@]}"; do
	P[$s]=$(port)
	# shellcheck disable=SC2046
	$(cmd "$s" "${P[$s]}") >"$work/$s.log" 2>&1 &
	PID[$s]=$!
	pids+=("${PID[$s]}")
done
for s in "${names[@]}"; do
	up "${P[$s]}"
	load "${P[$s]}" 2000 >/dev/null # the rule's ten, then denials; warm
done

# The same answer from each: the Date aside, and the seconds until the
# edge's oldest admission leaves the hour (Retry-After, the t parameter),
# which count down from the floors' 3600, as many digits.
for s in "${names[@]}"; do
	curl -si "http://127.0.0.1:${P[$s]}/p" | tr -d '\r' | grep -v '^Date:' |
		sed -E 's/^(Retry-After: )[0-9]{4}$/\1NNNN/; s/;t=[0-9]{4}$/;t=NNNN/' >"$work/answer.$s"
done
for s in listeners server; do
	if ! diff -u "$work/answer.edge" "$work/answer.$s" >&2; then
		echo "bench-deny-floor: the $s floor's answer differs from the edge's (above)" >&2
		exit 1
	fi
done
echo "the same 429 from the edge and both floors ($(wc -c <"$work/answer.edge") bytes without the Date)"

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo
echo "CPU per request, µs (N=$N, $CONNS connections, $SETS sets; load $(cut -d' ' -f1 /proc/loadavg) before)"
declare -A US
for set in $(seq "$SETS"); do
	order=("${names[@]:$(((set - 1) % 3))}" "${names[@]:0:$(((set - 1) % 3))}")
	line="set $set:"
	for s in "${order[@]}"; do
		t0=$(cpu "${PID[$s]}")
		out=$(load "${P[$s]}" "$N")
		t1=$(cpu "${PID[$s]}")
		check_load "$s" "$N" "$out"
		US[$s,$set]=$(awk -v d=$((t1 - t0)) -v t="$tck" -v n="$N" 'BEGIN {printf "%.2f", d * 1e6 / t / n}')
		line+=" $s ${US[$s,$set]}"
	done
	echo "$line; edge ÷ server $(awk -v a="${US[edge,$set]}" -v b="${US[server,$set]}" 'BEGIN {printf "%.2f", a / b}'), listeners ÷ server $(awk -v a="${US[listeners,$set]}" -v b="${US[server,$set]}" 'BEGIN {printf "%.2f", a / b}'), edge ÷ listeners $(awk -v a="${US[edge,$set]}" -v b="${US[listeners,$set]}" 'BEGIN {printf "%.2f", a / b}')"
done
for pair in edge/server listeners/server edge/listeners; do
	a=${pair%/*} b=${pair#*/}
	m=$(for set in $(seq "$SETS"); do awk -v a="${US[$a,$set]}" -v b="${US[$b,$set]}" 'BEGIN {print a / b}'; done | median)
	r=$(for set in $(seq "$SETS"); do awk -v a="${US[$a,$set]}" -v b="${US[$b,$set]}" 'BEGIN {print a / b}'; done | sort -g | awk 'NR==1 {lo=$1} {hi=$1} END {printf "%.2f–%.2f", lo, hi}')
	printf "median %s ÷ %s: %.2f (%s)\n" "$a" "$b" "$m" "$r"
done

if [ "$STRACE" = 1 ]; then
	echo
	sn=$((N / 5))
	echo "system calls per request (strace -c -f, $sn requests)"
	for s in "${names[@]}"; do
		strace -c -f -o "$work/strace.$s" -p "${PID[$s]}" 2>/dev/null &
		st=$!
		sleep 1 # attached to every thread
		out=$(load "${P[$s]}" "$sn")
		kill -INT "$st"
		wait "$st" 2>/dev/null || true
		check_load "$s" "$sn" "$out"
		awk -v n="$sn" -v s="$s" 'NR > 2 && $NF != "total" && $4 + 0 > 0 && $4 / n >= 0.01 {l = l sprintf(" %s %.2f", $NF, $4 / n)} END {print s ":" l}' "$work/strace.$s"
	done
fi

for s in "${names[@]}"; do kill "${PID[$s]}" 2>/dev/null || true; done

if [ "$CALLGRIND" = 1 ]; then
	echo
	echo "instructions per request (callgrind, $CG_N requests, the idle background taken off)"
	declare -A IR
	for s in "${names[@]}"; do
		p=$(port)
		# shellcheck disable=SC2046
		GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off GOMAXPROCS=1 valgrind --tool=callgrind --callgrind-out-file="$work/cg.$s" \
			$(cmd "$s" "$p") >"$work/cg.$s.log" 2>&1 &
		v=$!
		pids+=("$v")
		up "$p"
		load "$p" 2000 >/dev/null
		callgrind_control -z "$v" >/dev/null 2>&1
		t0=$(date +%s.%N)
		out=$(load "$p" "$CG_N")
		t1=$(date +%s.%N)
		callgrind_control -d "$v" >/dev/null 2>&1
		check_load "$s" "$CG_N" "$out"
		callgrind_control -z "$v" >/dev/null 2>&1
		sleep "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')"
		callgrind_control -d "$v" >/dev/null 2>&1
		kill "$v" 2>/dev/null || true
		wait "$v" 2>/dev/null || true
		busy=$(awk '/^totals:/ {print $2}' "$work/cg.$s.1")
		idle=$(awk '/^totals:/ {print $2}' "$work/cg.$s.2")
		IR[$s]=$(((busy - idle) / CG_N))
		echo "$s: ${IR[$s]} ($((busy / CG_N)) with the background; $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f", b - a}') s)"
	done
	echo "edge ÷ server $(awk -v a="${IR[edge]}" -v b="${IR[server]}" 'BEGIN {printf "%.2f", a / b}'), listeners ÷ server $(awk -v a="${IR[listeners]}" -v b="${IR[server]}" 'BEGIN {printf "%.2f", a / b}'), edge ÷ listeners $(awk -v a="${IR[edge]}" -v b="${IR[listeners]}" 'BEGIN {printf "%.2f", a / b}')"
fi
