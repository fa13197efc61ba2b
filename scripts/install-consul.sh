#!/usr/bin/env bash
# Builds the Consul agent the tests start, once per version, from its Go module
# (Consul has no Debian package), and caches the binary outside the repository:
#   ${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}/consul-<version>/consul
# Prints the binary's path. Idempotent: a cached binary is reused.
set -euo pipefail

version="${CONSUL_VERSION:-1.21.0}"
cache="${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}"
bin="$cache/consul-$version/consul"
if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then
	echo "$bin"
	exit 0
fi

# One build of a tool at a time: a second run (another checkout, targets
# in parallel) waits for the first and reuses what it built.
mkdir -p "$cache"
exec 9>"$cache/consul-$version.lock"
flock 9
if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then
	echo "$bin"
	exit 0
fi
echo "tools: building consul $version from its Go module (once; a few minutes)" >&2
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
export GOFLAGS=-mod=mod
modcache=$(go env GOMODCACHE)
( cd "$work" && go mod download -x "github.com/hashicorp/consul@v$version" >/dev/null 2>&1 || go mod download "github.com/hashicorp/consul@v$version" )
src="$modcache/github.com/hashicorp/consul@v$version"
[ -d "$src" ] || { echo "consul module source not found at $src" >&2; exit 1; }
cp -r "$src" "$work/consul"
chmod -R u+w "$work/consul"
cd "$work/consul"
# The release go.mod points its submodules (api, sdk, …) at local directories
# that the module zip does not carry; drop those replaces so the published
# versions are used.
sed -i -E '/^replace[[:space:]]+github\.com\/hashicorp\/consul\/[a-z/-]+[[:space:]]+=>[[:space:]]+\.\//d' go.mod
sed -i -E '/^[[:space:]]*github\.com\/hashicorp\/consul\/[a-z/-]+[[:space:]]+=>[[:space:]]+\.\//d' go.mod
go mod tidy >/dev/null 2>&1 || true
mkdir -p "$(dirname "$bin")"
go build -trimpath -o "$bin.tmp.$$" .
mv "$bin.tmp.$$" "$bin"
"$bin" version >&2
echo "$bin"
