#!/usr/bin/env bash
# Prints the path of a Terraform for the local stack (terraform/): the one in
# PATH when it is recent enough, else one built once from its Go module and
# cached outside the repository, like Consul (install-consul.sh):
#   ${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}/terraform-<version>/terraform
#
# The version built is the newest whose module builds on its own: from 1.9
# on, Terraform's state backends are nested modules that its module zip
# leaves out and that the Go module proxy does not serve, so 1.13.x cannot
# be built from the proxy. The stack needs >= 1.4 (terraform_data; the
# required_version in terraform/environments/local/main.tf) and only the
# built-in provider.
set -euo pipefail
# Without a CLI config file Terraform warns on every command; an empty one
# says the same (no provider mirrors: the stack only uses the built-in one).
[ -n "${TF_CLI_CONFIG_FILE:-}" ] || [ -f "$HOME/.terraformrc" ] || export TF_CLI_CONFIG_FILE=/dev/null

version="${TERRAFORM_VERSION:-1.8.5}"
min_minor=4 # 1.4
cache="${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}"
bin="$cache/terraform-$version/terraform"

if command -v terraform >/dev/null 2>&1; then
	# "1.11.4", or "1.8.5-dev" for a build from the module.
	have=$(terraform version -json 2>/dev/null | sed -n 's/.*"terraform_version": *"\([0-9][0-9.]*\).*/\1/p')
	major=${have%%.*}
	rest=${have#*.}
	minor=${rest%%.*}
	if [ "${major:-0}" -gt 1 ] || { [ "${major:-0}" -eq 1 ] && [ "${minor:-0}" -ge "$min_minor" ]; }; then
		command -v terraform
		exit 0
	fi
fi
if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then
	echo "$bin"
	exit 0
fi

# One build of a tool at a time: a second run (another checkout, targets
# in parallel) waits for the first and reuses what it built.
mkdir -p "$cache"
exec 9>"$cache/terraform-$version.lock"
flock 9
if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then
	echo "$bin"
	exit 0
fi
echo "tools: building terraform $version from its Go module (once; a few minutes)" >&2
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$(dirname "$bin")"
GOFLAGS=-mod=mod GOBIN="$work/bin" go install -trimpath "github.com/hashicorp/terraform@v$version"
mv "$work/bin/terraform" "$bin"
"$bin" version >&2
echo "$bin"
