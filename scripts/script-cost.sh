#!/usr/bin/env bash
# What the limiter's scripts cost Redis, in instructions per call: the
# scripts of two revisions (BASE, default HEAD~1, and the working tree's
# lua/) loaded into one redis-server run under callgrind, each called N
# times (redis-cli -r) in ROUNDS alternated rounds, the counters zeroed
# before and dumped after each phase. Instructions hold on a busy machine
# where times do not; they include the server's network and parsing work.
#
#   scripts/script-cost.sh [BASE]        # N=20000 ROUNDS=3; about 5 minutes
#
# Every call is a take that admits (limit 10^9 in a one-hour window, so no
# phase crosses a window) with the same arguments for both revisions: the
# tally flag (ARGV 8) is '0', the steady state; a script that does not read
# it ignores it. The rows marked + are the same takes tallied ('1'). Needs
# valgrind, redis-server, redis-cli, git and go.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD~1}
N=${N:-20000}
ROUNDS=${ROUNDS:-3}
for tool in valgrind callgrind_control redis-server redis-cli; do
	command -v "$tool" >/dev/null || { echo "script-cost: $tool not found" >&2; exit 1; }
done
work=$(mktemp -d)
vpid=
cleanup() {
	[ -n "$vpid" ] && kill "$vpid" 2>/dev/null && wait "$vpid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

# scripts DIR: the scripts of the lua package in DIR/lua, built by a small
# program against it (Source and Batch as the limiter calls them).
scripts() {
	local dir=$1
	printf 'module scriptcost\n\ngo 1.24\n' >"$dir/go.mod"
	mkdir -p "$dir/cmd"
	cat >"$dir/cmd/main.go" <<'EOF'
package main

import (
	"os"

	"scriptcost/lua"
)

func main() {
	for _, name := range []string{lua.FixedWindow, lua.SlidingWindow, lua.GCRA} {
		src, err := lua.Source(name)
		if err != nil {
			panic(err)
		}
		if err := os.WriteFile(name+".lua", []byte(src), 0o644); err != nil {
			panic(err)
		}
	}
	src, err := lua.Batch([]lua.Alg{{Code: 1, Name: lua.SlidingWindow, Keys: 2, Args: 8}})
	if err != nil {
		panic(err)
	}
	if err := os.WriteFile("batch.lua", []byte(src), 0o644); err != nil {
		panic(err)
	}
}
EOF
	(cd "$dir" && GOFLAGS=-mod=mod go run ./cmd)
}
mkdir -p "$work/base" "$work/tree"
git archive "$base" lua | tar -x -C "$work/base"
cp -r lua "$work/tree/"
scripts "$work/base"
scripts "$work/tree"

sock=$work/redis.sock
valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" \
	redis-server --port 0 --unixsocket "$sock" --save '' --appendonly no --daemonize no >"$work/valgrind.log" 2>&1 &
vpid=$!
for _ in $(seq 1 240); do
	redis-cli -s "$sock" ping >/dev/null 2>&1 && break
	sleep 0.5
done
cli() { redis-cli -s "$sock" "$@"; }
cli ping >/dev/null

declare -A sha
for rev in base tree; do
	for s in fixed_window sliding_window gcra batch; do
		sha[$rev.$s]=$(cli SCRIPT LOAD "$(cat "$work/$rev/$s.lua")")
	done
done
# A name ending in + is its script's take made tallied (ARGV 8 '1'), as in
# the minute after a sign of a master change: two INFO reads, a hash write.
calls="fixed_window sliding_window gcra batch fixed_window+ sliding_window+"
args() { # the EVALSHA arguments after the SHA, per call
	case $1 in
	fixed_window+) echo '1 eg:{a}:fw take 0 1000000000 3600000000 0 1 1 1' ;;
	sliding_window+) echo '2 eg:{a}:sw:cur eg:{a}:sw:prev take 0 1000000000 3600000000 0 1 1 1' ;;
	fixed_window) echo '1 eg:{a}:fw take 0 1000000000 3600000000 0 1 1 0' ;;
	sliding_window) echo '2 eg:{a}:sw:cur eg:{a}:sw:prev take 0 1000000000 3600000000 0 1 1 0' ;;
	gcra) echo '1 eg:{a}:gcra take 0 1000000000 3600000000 1000000000 1 1 0' ;;
	batch) echo '0 1 1 eg:{a}:sw:cur eg:{a}:sw:prev take 0 1000000000 3600000000 0 1 1 0' ;;
	esac
}
declare -A got
for round in $(seq 1 "$ROUNDS"); do
	for s in $calls; do
		for rev in base tree; do
			cli FLUSHALL >/dev/null
			callgrind_control -z "$vpid" >/dev/null 2>&1
			# shellcheck disable=SC2046 # the arguments are words
			cli -r "$N" EVALSHA "${sha[$rev.${s%+}]}" $(args "$s") >/dev/null
			callgrind_control -d "$rev.$s.$round" "$vpid" >/dev/null 2>&1
			f=$(ls -t "$work"/cg."$vpid".* | head -1)
			ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$f")
			got[$rev.$s]+="$((ir / N)) "
		done
	done
done
echo "instructions per call in redis-server $(redis-server --version | awk '{print $3}'), $N calls a phase, $ROUNDS rounds; base $(git rev-parse --short "$base"), tree $(git describe --always --dirty)"
printf '%-16s %-28s %-28s\n' script base tree
for s in $calls; do
	printf '%-16s %-28s %-28s\n' "$s" "${got[base.$s]}" "${got[tree.$s]}"
done
