#!/usr/bin/env bash
# Builds Let's Encrypt's Pebble (a small ACME server for tests) and its
# challenge test server (DNS answers for the names being issued) from their
# Go module, once per version, and caches them outside the repository:
#   ${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}/pebble-<version>/{pebble,pebble-challtestsrv}
# Prints the directory. Idempotent: cached binaries are reused.
set -euo pipefail

version="${PEBBLE_VERSION:-v2.10.1}"
cache="${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}"
dir="$cache/pebble-$version"
if [ -x "$dir/pebble" ] && [ -x "$dir/pebble-challtestsrv" ]; then
	echo "$dir"
	exit 0
fi
# One build of a tool at a time: a second run (another checkout, targets
# in parallel) waits for the first and reuses what it built.
mkdir -p "$cache"
exec 9>"$cache/pebble-$version.lock"
flock 9
if [ -x "$dir/pebble" ] && [ -x "$dir/pebble-challtestsrv" ]; then
	echo "$dir"
	exit 0
fi
echo "tools: building pebble $version from its Go module (once)" >&2
mkdir -p "$dir"
GOBIN="$dir" GOFLAGS=-mod=mod go install \
	"github.com/letsencrypt/pebble/v2/cmd/pebble@$version" \
	"github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv@$version" >&2
echo "$dir"
