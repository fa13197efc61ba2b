#!/usr/bin/env bash
# busy.sh CMD ARGS… runs CMD on a machine made busy the way a production host
# is, and exits with CMD's status:
#  - noise: stress-ng with a fixed mix, two CPU workers at 60 %, one worker
#    writing and reading 512 MiB of memory, one writing and reading a file
#    (3.8 tasks runnable or in disk wait on average: a load average of
#    about 4 on a 2-core machine, before the tests add theirs);
#  - stalls: every 150–600 ms, one of the Redis servers CMD's tests started
#    is stopped (SIGSTOP) for 20–80 ms, then resumed (SIGCONT), as a fork
#    or an fsync stalls a production Redis.
# Only servers started by internal/testenv under CMD are stalled: a
# redis-server that descends from this script and whose working directory
# holds the harness's pulse.lock. A test's own Freeze outlasts a stall
# (the harness and the pulser signal under a flock on pulse.lock, and a
# frozen server is marked frozen-<pid>); a test whose own freezes are its
# stress keeps the mark for as long as they run (testenv's ExemptNode), so
# no stall lands between them. Whatever the pulser stopped, it
# resumes when it exits, however it exits; it stops by itself when this
# script is gone or after BUSY_TIMEOUT.
#
#   BUSY_TIMEOUT  seconds before the noise and the stalls stop by themselves
#                 (default 3600); CMD itself is not limited
#   BUSY_NOISE=0  no stress-ng;  BUSY_PULSE=0  no stalls
#   BUSY_LOG      a file that gets one line per stall (pid, milliseconds)
#
# INT or TERM reach CMD as usual (Ctrl-C goes to the whole process group);
# this script cleans up once CMD has returned.
set -uo pipefail

if [ $# -eq 0 ]; then
	echo "usage: $0 CMD [ARGS…]" >&2
	exit 2
fi
timeout=${BUSY_TIMEOUT:-3600}
case $timeout in '' | *[!0-9]*)
	echo "busy: BUSY_TIMEOUT must be a number of seconds (got $timeout)" >&2
	exit 2
	;;
esac
root=$$

log() { echo "busy: $*" >&2; }

# ---------------------------------------------------------------- noise
noise_pid=
noise_dir=
start_noise() {
	[ "${BUSY_NOISE:-1}" = 0 ] && return
	if ! command -v stress-ng >/dev/null 2>&1; then
		log "stress-ng not found (make tools installs it)"
		exit 2
	fi
	noise_dir=$(mktemp -d "${TMPDIR:-/tmp}/busy-noise-XXXXXX")
	stress-ng --cpu 2 --cpu-load 60 --vm 1 --vm-bytes 512M --hdd 1 --hdd-bytes 256M \
		--temp-path "$noise_dir" --timeout "${timeout}s" --quiet >"$noise_dir/stress-ng.log" 2>&1 &
	noise_pid=$!
	# Gone with this script even when it is killed outright.
	(while kill -0 "$root" 2>/dev/null && kill -0 "$noise_pid" 2>/dev/null; do sleep 1; done
		kill -TERM "$noise_pid" 2>/dev/null) &
	log "noise: stress-ng pid $noise_pid (cpu 2 at 60 %, vm 1 × 512M, hdd 1 × 256M)"
}

stop_noise() {
	[ -n "$noise_pid" ] || return
	kill -TERM "$noise_pid" 2>/dev/null
	wait "$noise_pid" 2>/dev/null
	rm -rf "$noise_dir"
	noise_pid=
}

# ---------------------------------------------------------------- stalls
# ppid_and_state PID sets ps_state and ps_ppid and ps_pgrp from
# /proc/PID/stat (the command name may hold spaces and parentheses: read
# past its last ')').
ppid_and_state() {
	local line rest
	read -r line 2>/dev/null <"/proc/$1/stat" || return 1
	rest=${line##*) }
	# shellcheck disable=SC2086
	set -- $rest
	ps_state=$1 ps_ppid=$2 ps_pgrp=$3
}

# descends PID: PID's ancestry reaches this script.
descends() {
	local pid=$1 depth=0
	while [ "$pid" -gt 1 ] && [ $depth -lt 64 ]; do
		ppid_and_state "$pid" || return 1
		[ "$ps_ppid" -eq "$root" ] && return 0
		pid=$ps_ppid depth=$((depth + 1))
	done
	return 1
}

# targets lists the Redis servers to stall: comm redis-server, leader of its
# own process group (the harness starts each server in its own), below this
# script, working directory a harness deployment dir.
targets() {
	local d pid comm
	for d in /proc/[0-9]*; do
		pid=${d#/proc/}
		read -r comm 2>/dev/null <"$d/comm" || continue
		[ "$comm" = redis-server ] || continue
		ppid_and_state "$pid" || continue
		[ "$ps_pgrp" = "$pid" ] || continue
		[ -e "$d/cwd/pulse.lock" ] || continue
		descends "$pid" && echo "$pid"
	done
}

pulser() {
	local stopped="" pulses=0 skipped=0 seen=" " nseen=0 lockfd
	# resume everything still stopped by a stall, unless the test froze it
	# meanwhile (then the test's Thaw resumes it).
	resume() {
		local pid
		for pid in $stopped; do
			[ -e "/proc/$pid/cwd/frozen-$pid" ] || kill -CONT "$pid" 2>/dev/null
		done
		stopped=""
	}
	# shellcheck disable=SC2317 # the EXIT trap calls it
	finish() {
		[ -z "$stopped" ] || pulses=$((pulses + 1))
		resume
		log "stalls: $pulses sent to $nseen Redis servers ($skipped skipped: frozen by their test)"
	}
	trap finish EXIT
	trap 'exit 0' TERM INT HUP
	local started=$SECONDS pids pid ms pause
	while kill -0 "$root" 2>/dev/null && [ $((SECONDS - started)) -lt "$timeout" ]; do
		pause=$((150 + RANDOM % 451))
		sleep "$(printf '0.%03d' "$pause")"
		mapfile -t pids < <(targets)
		[ ${#pids[@]} -gt 0 ] || continue
		pid=${pids[RANDOM % ${#pids[@]}]}
		# Under the harness's lock: no stall on a server its test froze.
		{ exec {lockfd}<"/proc/$pid/cwd/pulse.lock"; } 2>/dev/null || continue
		if ! flock -w 2 -x "$lockfd"; then
			exec {lockfd}<&-
			continue
		fi
		ppid_and_state "$pid" || ps_state=X
		if [ -e "/proc/$pid/cwd/frozen-$pid" ] || [ "$ps_state" = T ] || [ "$ps_state" = X ]; then
			skipped=$((skipped + 1))
		elif kill -STOP "$pid" 2>/dev/null; then
			stopped="$pid"
		fi
		exec {lockfd}<&-
		[ -n "$stopped" ] || continue
		ms=$((20 + RANDOM % 61))
		sleep "$(printf '0.%03d' "$ms")"
		if { exec {lockfd}<"/proc/$pid/cwd/pulse.lock"; } 2>/dev/null; then
			flock -w 2 -x "$lockfd" || true
			resume
			exec {lockfd}<&-
		else
			resume # gone meanwhile
		fi
		pulses=$((pulses + 1))
		case $seen in *" $pid "*) ;; *) seen="$seen$pid " nseen=$((nseen + 1)) ;; esac
		[ -z "${BUSY_LOG:-}" ] || echo "$(date -u +%T.%N) pid $pid stalled ${ms}ms" >>"$BUSY_LOG"
	done
}

pulse_pid=
start_pulser() {
	[ "${BUSY_PULSE:-1}" = 0 ] && return
	if ! command -v flock >/dev/null 2>&1; then
		log "flock not found (util-linux)"
		exit 2
	fi
	pulser &
	pulse_pid=$!
	log "stalls: pulser pid $pulse_pid (SIGSTOP 20–80 ms every 150–600 ms, the test run's Redis servers only)"
}

stop_pulser() {
	[ -n "$pulse_pid" ] || return
	kill -TERM "$pulse_pid" 2>/dev/null
	wait "$pulse_pid" 2>/dev/null
	pulse_pid=
}

cleanup() {
	stop_pulser
	stop_noise
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_noise
start_pulser
"$@"
rc=$?
cleanup
log "$1 exited with status $rc"
exit "$rc"
