#!/usr/bin/env bash
# Builds k6 with the k6/x/edgeguard extension the way xk6 does (a generated
# main package importing go.k6.io/k6/cmd and the extension, built with
# `go build`), and caches the binary outside the repository:
#   ${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}/k6-<k6 version>-<key>/k6
# The key is a hash of every file of this repository the build compiles:
# the source and embedded files of each package of the extension's module
# and of the edge's module (reached through the replace directive) that
# `go list -deps` lists for the build's settings, both modules' go.mod and
# go.sum, and the Go version. Any change to them builds a new binary; an
# unchanged tree reuses the cached one; the three newest builds are kept.
# Prints the binary's path.
#   --key    prints the cache directory's name (k6-<version>-<key>) instead
#   --files  prints the files the key covers instead
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
ext="$root/loadtest"
k6_version=$(cd "$ext" && go list -m -f '{{.Version}}' go.k6.io/k6)
# The files the build compiles from the two modules, relative to the root.
# An error from go list stops the script: a key that silently left packages
# out would reuse a stale binary.
pkgfiles='{{if .Module}}{{if or (eq .Module.Path "github.com/edgeguard/edgeguard") (eq .Module.Path "github.com/edgeguard/edgeguard/loadtest")}}{{$d := .Dir}}'
for list in GoFiles CgoFiles CFiles HFiles SFiles SysoFiles EmbedFiles; do
	pkgfiles+="{{range .$list}}{{\$d}}/{{.}}{{\"\\n\"}}{{end}}"
done
pkgfiles+='{{end}}{{end}}'
compiled=$(cd "$ext" && CGO_ENABLED=0 go list -deps -f "$pkgfiles" .)
files=$(
	{
		printf '%s\n' "$compiled" | sed -n "s|^$root/||p"
		printf '%s\n' go.mod go.sum loadtest/go.mod loadtest/go.sum
	} | LC_ALL=C sort -u
)
if ! grep -qx 'loadtest/module.go' <<<"$files"; then
	echo "k6: go list did not list the extension's own files" >&2
	exit 1
fi
case "${1:-}" in
--files)
	printf '%s\n' "$files"
	exit 0
	;;
esac
hash=$(
	cd "$root"
	{
		go env GOVERSION
		xargs sha256sum <<<"$files"
	} | sha256sum | cut -c1-16
)
case "${1:-}" in
--key)
	echo "k6-$k6_version-$hash"
	exit 0
	;;
esac
cache="${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}"
dir="$cache/k6-$k6_version-$hash"
bin="$dir/k6"
if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then
	echo "$bin"
	exit 0
fi

# One build at a time: a second run (another checkout, targets in
# parallel) waits for the first and reuses what it built.
mkdir -p "$cache"
exec 9>"$cache/k6.lock"
flock 9
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
	CGO_ENABLED=0 go build -trimpath -o "$bin.tmp.$$" .
)
mv "$bin.tmp.$$" "$bin"
# Keep the three newest builds (other trees may use an older one).
ls -dt "$cache"/k6-*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
"$bin" version >&2
echo "k6: built in $(($(date +%s) - start)) s: $bin" >&2
echo "$bin"
