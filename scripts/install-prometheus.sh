#!/usr/bin/env bash
# Prints the path of a Prometheus that can discover targets through Consul
# (consul_sd_configs), which the local stack uses. Debian's package is
# preferred; Debian bookworm's build leaves Consul discovery out, in which
# case Prometheus is built once from its Go module and cached outside the
# repository, like Consul (install-consul.sh):
#   ${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}/prometheus-<version>/prometheus
set -euo pipefail

version="${PROMETHEUS_MODULE_VERSION:-v0.307.3}" # Prometheus 3.7.3
cache="${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}"
bin="$cache/prometheus-$version/prometheus"

# A config with one consul_sd_configs job: promtool (shipped with the Debian
# package) refuses it when that Prometheus lacks Consul discovery.
supports_consul() {
	local promtool=$1 dir
	dir=$(mktemp -d)
	printf 'scrape_configs:\n  - job_name: x\n    consul_sd_configs:\n      - server: "127.0.0.1:8500"\n' >"$dir/p.yml"
	"$promtool" check config "$dir/p.yml" >/dev/null 2>&1
	local rc=$?
	rm -rf "$dir"
	return $rc
}

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 && supports_consul promtool; then
	command -v prometheus
	exit 0
fi
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
	echo "$bin"
	exit 0
fi

# One build of a tool at a time: a second run (another checkout, targets
# in parallel) waits for the first and reuses what it built.
mkdir -p "$cache"
exec 9>"$cache/prometheus-$version.lock"
flock 9
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
	echo "$bin"
	exit 0
fi
echo "tools: building prometheus ($version) from its Go module, for Consul discovery (once; a few minutes)" >&2
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
export GOFLAGS=-mod=mod
modcache=$(go env GOMODCACHE)
(cd "$work" && go mod download "github.com/prometheus/prometheus@$version")
src="$modcache/github.com/prometheus/prometheus@$version"
[ -d "$src" ] || { echo "prometheus module source not found at $src" >&2; exit 1; }
cp -r "$src" "$work/prometheus"
chmod -R u+w "$work/prometheus"
cd "$work/prometheus"
mkdir -p "$(dirname "$bin")"
# Without the builtinassets tag the web UI is not embedded; the API, the
# remote-write receiver and scraping are all there.
go build -trimpath -o "$bin.tmp.$$" ./cmd/prometheus
mv "$bin.tmp.$$" "$bin"
"$bin" --version >&2
echo "$bin"
