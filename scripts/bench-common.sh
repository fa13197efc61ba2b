# Sourced by the side-by-side benchmark scripts (bench-deny-floor.sh,
# bench-rls.sh, bench-tls.sh) from the repository's root: a scratch
# directory ($work) and the processes a script starts ($pids), both gone
# when it exits however it exits, and port, which prints a free loopback
# port.
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
