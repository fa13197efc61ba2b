#!/usr/bin/env bash
# Builds k6 with the k6/x/edgeguard extension the way xk6 does (a generated
# main package importing go.k6.io/k6/cmd and the extension, built with
# `go build`), and caches the binary outside the repository:
#   ${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}/k6-<k6 version>-<extension hash>/k6
# The hash covers the extension's sources and module files and every
# package of this repository it compiles in (go list -deps), so any change
# to them builds a new binary; an unchanged tree reuses the cached one; the
# three newest builds are kept.
# Prints the binary's path.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
ext="$root/loadtest"
k6_version=$(cd "$ext" && go list -m -f '{{.Version}}' go.k6.io/k6)
hash=$(cd "$root" && {
	find loadtest -path loadtest/scenarios -prune -o -path loadtest/results -prune -o \
		\( \( -name '*.go' ! -name '*_test.go' \) -o -name go.mod -o -name go.sum \) -print
	# The repository's packages the extension imports, however deep.
	(cd loadtest && go list -deps -f '{{if .Module}}{{if eq .Module.Path "github.com/edgeguard/edgeguard"}}{{.Dir}}{{end}}{{end}}' .) |
		sed "s|^$root/||" | while read -r d; do find "$d" -maxdepth 1 -name '*.go' ! -name '*_test.go' -print; done
	echo go.mod go.sum
} | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
cache="${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}"
dir="$cache/k6-$k6_version-$hash"
bin="$dir/k6"
if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then
	echo "$bin"
	exit 0
fi

echo "k6: building k6 $k6_version with k6/x/edgeguard (extension $hash)" >&2
start=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/main.go" <<'GO'
// Command k6 is k6 with the k6/x/edgeguard extension (generated).
package main

import (
	k6cmd "go.k6.io/k6/cmd"

	_ "github.com/edgeguard/edgeguard/loadtest"
)

func main() { k6cmd.Execute() }
GO
# The extension's go.sum seeds the build module's, so tidy only adds what
# k6's command packages need beyond the extension.
cp "$ext/go.sum" "$work/go.sum"
(
	cd "$work"
	go mod init k6build >/dev/null 2>&1
	go mod edit \
		-require="go.k6.io/k6@$k6_version" \
		-require=github.com/edgeguard/edgeguard/loadtest@v0.0.0 \
		-replace=github.com/edgeguard/edgeguard/loadtest="$ext" \
		-replace=github.com/edgeguard/edgeguard="$root"
	# The extension's go.mod requirements (read through the replace) give
	# the same dependency versions as its tests use.
	go mod tidy >&2
	mkdir -p "$dir"
	CGO_ENABLED=0 go build -trimpath -o "$bin.tmp" .
)
mv "$bin.tmp" "$bin"
# Keep the three newest builds (other trees may use an older one).
ls -dt "$cache"/k6-*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
"$bin" version >&2
echo "k6: built in $(($(date +%s) - start)) s: $bin" >&2
echo "$bin"
