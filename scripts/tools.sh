#!/usr/bin/env bash
# Installs what the tests need on a Debian/Ubuntu machine, only when missing:
# Redis (server, sentinel, cli, benchmark), wrk, h2load (nghttp2-client: the
# HTTP/2 scenario of internal/peerbench), stress-ng (make test-busy),
# systemd's socket-activation launcher (the e2e socket activation test),
# nginx (nginx-light) and HAProxy (the peers internal/peerbench measures the
# edge against),
# Tomcat 10 and Jetty 9 (pkg/pathsem's differential tests), Prometheus (with promtool)
# and the Redis exporter from apt, and Consul, built once
# from its Go module by install-consul.sh and cached outside the repository,
# as is Pebble, the ACME test server (install-pebble.sh, about 20 s once),
# and h2spec, the HTTP/2 conformance checker (install-h2spec.sh).
# The local stack (terraform/) also needs Prometheus and the Redis exporter
# (apt), Terraform (install-terraform.sh: PATH, else built once from its Go
# module) and a Prometheus with Consul discovery (install-prometheus.sh).
# Idempotent; safe to run every time.
set -euo pipefail

need=()
for bin in file:file curl:curl stress-ng:stress-ng redis-server:redis-server redis-sentinel:redis-sentinel redis-cli:redis-tools redis-benchmark:redis-tools wrk:wrk h2load:nghttp2-client prometheus:prometheus promtool:prometheus prometheus-redis-exporter:prometheus-redis-exporter systemd-socket-activate:systemd; do
	command -v "${bin%%:*}" >/dev/null 2>&1 || need+=("${bin#*:}")
done
# nginx and HAProxy, the peers of internal/peerbench (its smoke tests run in
# make test); /usr/sbin is not on every user's PATH.
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
# Tomcat 10 and Jetty 9 for pkg/pathsem's differential tests (they put no
# binary on PATH; the tests start them from base directories of their own).
[ -f /usr/share/tomcat10/bin/bootstrap.jar ] || need+=(tomcat10)
[ -f /usr/share/jetty9/start.jar ] || need+=(jetty9)
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
if [ ${#need[@]} -gt 0 ]; then
	# shellcheck disable=SC2207
	need=($(printf '%s\n' "${need[@]}" | sort -u))
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then
		sudo="sudo"
	fi
	echo "tools: installing ${need[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update -qq
	$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	# Debian starts the Prometheus and exporter services on :9090 and :9121,
	# ports the edges and the stack use, nginx on :80, Tomcat and Jetty on
	# :8080, and HAProxy as a service; the tests start their own on free ports.
	if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
		$sudo systemctl disable --now prometheus prometheus-redis-exporter nginx haproxy tomcat10 jetty9 jetty9.timer >/dev/null 2>&1 || true
	fi
fi

# Each install script prints its binary's path (the Makefile passes
# consul's to the tests as EDGEGUARD_CONSUL; the harness also finds the cached
# binaries by itself). Those built into the cache are linked into one
# directory, printed last, for a shell's PATH (docs/deployment.md).
cache="${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}"
here=$(dirname "$0")
mkdir -p "$cache/bin"
# link puts a built binary (or a directory's executables) in $cache/bin;
# one found on the PATH instead (terraform) is left where it is.
link() {
	case "$1" in
	"$cache"/*) ;;
	*) return 0 ;;
	esac
	if [ -d "$1" ]; then
		for f in "$1"/*; do
			[ -f "$f" ] && [ -x "$f" ] && ln -sfn "$f" "$cache/bin/$(basename "$f")"
		done
	else
		ln -sfn "$1" "$cache/bin/$(basename "$1")"
	fi
	return 0
}
bin=$("$here/install-consul.sh")
link "$bin"
bin=$("$here/install-pebble.sh")
link "$bin"
# h2spec, the HTTP/2 conformance checker the edge's tests run (EDGEGUARD_H2SPEC).
bin=$("$here/install-h2spec.sh")
link "$bin"
# Built (once) only when missing; the stack scripts ask them for the paths.
bin=$("$here/install-terraform.sh")
link "$bin"
bin=$("$here/install-prometheus.sh")
link "$bin"
echo "tools: built tools are in $cache/bin; for a shell: export PATH=\"$cache/bin:\$PATH\"" >&2
