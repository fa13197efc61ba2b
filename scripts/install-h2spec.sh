#!/usr/bin/env bash
# Builds h2spec (an HTTP/2 conformance checker) from its Go module (tagged
# before Go modules: the version is +incompatible), once per
# version, and caches it outside the repository:
#   ${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}/h2spec-<version>/h2spec
# Prints the binary's path, which the Makefile passes to the tests as
# EDGEGUARD_H2SPEC. Idempotent: a cached binary is reused.
set -euo pipefail

version="${H2SPEC_VERSION:-v2.2.1}"
cache="${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}"
dir="$cache/h2spec-$version"
bin="$dir/h2spec"
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
	echo "$bin"
	exit 0
fi
# One build of a tool at a time: a second run (another checkout, targets
# in parallel) waits for the first and reuses what it built.
mkdir -p "$cache"
exec 9>"$cache/h2spec-$version.lock"
flock 9
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
	echo "$bin"
	exit 0
fi
echo "tools: building h2spec $version from its Go module (once)" >&2
mkdir -p "$dir"
GOBIN="$dir" GOFLAGS=-mod=mod go install "github.com/summerwind/h2spec/cmd/h2spec@$version+incompatible" >&2
"$bin" --version >&2
echo "$bin"
