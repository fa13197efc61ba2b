#!/usr/bin/env bash
# Installs what the tests need on a Debian/Ubuntu machine, only when missing:
# Redis (server, sentinel, cli, benchmark), wrk, stress-ng (make test-busy),
# nginx (nginx-light: the peer internal/peerbench measures the edge against),
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
for bin in file:file curl:curl stress-ng:stress-ng redis-server:redis-server redis-sentinel:redis-sentinel redis-cli:redis-tools redis-benchmark:redis-tools wrk:wrk prometheus:prometheus promtool:prometheus prometheus-redis-exporter:prometheus-redis-exporter; do
	command -v "${bin%%:*}" >/dev/null 2>&1 || need+=("${bin#*:}")
done
# nginx, the peer of internal/peerbench (its smoke test runs in make test);
# /usr/sbin is not on every user's PATH.
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
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
	# ports the edges and the stack use, nginx on :80 and Tomcat and Jetty on
	# :8080; the tests start their own on free ports.
	if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
		$sudo systemctl disable --now prometheus prometheus-redis-exporter nginx tomcat10 jetty9 jetty9.timer >/dev/null 2>&1 || true
	fi
fi

# Prints the binary's path, which the Makefile passes to the tests as
# EDGEGUARD_CONSUL; the harness also finds the cached binary by itself.
"$(dirname "$0")/install-consul.sh" >/dev/null
"$(dirname "$0")/install-pebble.sh" >/dev/null
# h2spec, the HTTP/2 conformance checker the edge's tests run (EDGEGUARD_H2SPEC).
"$(dirname "$0")/install-h2spec.sh" >/dev/null
# Built (once) only when missing; the stack scripts ask them for the paths.
"$(dirname "$0")/install-terraform.sh" >/dev/null
"$(dirname "$0")/install-prometheus.sh" >/dev/null
