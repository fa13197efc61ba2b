#!/usr/bin/env bash
# Brings the local multi-region stack up or down with Terraform
# (terraform/environments/local), keeping everything — binaries, Terraform
# state, pids, configs, logs, outputs.json — in the state directory:
#   STACK_STATE (default .stack at the repository root).
#
#   scripts/stack.sh up        build, init, apply, reconcile (restart what died, push the rules, wait for
#                              every edge), write outputs.json, print endpoints
#   scripts/stack.sh plan      terraform plan -detailed-exitcode (0: nothing to change)
#   scripts/stack.sh down      destroy, stop anything left, remove the state directory
#   scripts/stack.sh outputs   terraform output -json
#   scripts/stack.sh build     build the binaries into STACK_BUILD_DIR only (make test does it
#                              ahead, beside the heavy tests)
#
# With STACK_BUILD_DIR set, up builds the binaries there (go build relinks
# only what is out of date, so binaries built ahead cost a second) and
# copies them into the state directory; without it, it builds them there.
set -euo pipefail
# Without a CLI config file Terraform warns on every command; an empty one
# says the same (no provider mirrors: the stack only uses the built-in one).
[ -n "${TF_CLI_CONFIG_FILE:-}" ] || [ -f "$HOME/.terraformrc" ] || export TF_CLI_CONFIG_FILE=/dev/null

root=$(cd "$(dirname "$0")/.." && pwd)

bins=(edge regionctl stackctl stackorigin)
# build DIR: the stack's binaries, up to date, in DIR (built in
# STACK_BUILD_DIR and copied when it is set). A binary that changed is
# copied beside its old self and renamed over it: a running one (a
# re-apply) keeps its file.
build() {
	local out=${STACK_BUILD_DIR:-$1}
	mkdir -p "$out" "$1"
	out=$(cd "$out" && pwd)
	(cd "$root" && go build -o "$out/" "${bins[@]/#/./cmd/}")
	[ "$out" != "$1" ] || return 0
	for b in "${bins[@]}"; do
		cmp -s "$out/$b" "$1/$b" || { cp "$out/$b" "$1/$b.new" && mv -f "$1/$b.new" "$1/$b"; }
	done
}

if [ "${1:-}" = build ]; then
	[ -n "${STACK_BUILD_DIR:-}" ] || { echo "stack.sh build: set STACK_BUILD_DIR" >&2; exit 2; }
	build "$STACK_BUILD_DIR"
	exit 0
fi

state="${STACK_STATE:-$root/.stack}"
mkdir -p "$state"
state=$(cd "$state" && pwd)
env_dir="$root/terraform/environments/local"
export TF_DATA_DIR="$state/terraform"
export TF_IN_AUTOMATION=1
terraform=$("$root/scripts/install-terraform.sh")
tf() { "$terraform" -chdir="$env_dir" "$@"; }
vars=(-var "state_dir=$state" -var "bin_dir=$state/bin")

case "${1:-}" in
up)
	# The Consul agent the stack runs (built and cached once).
	# The Consul agent and the Prometheus (with Consul discovery) the stack
	# runs, each built and cached once when the machine lacks one.
	EDGEGUARD_CONSUL=$("$root/scripts/install-consul.sh")
	EDGEGUARD_PROMETHEUS=$("$root/scripts/install-prometheus.sh")
	export EDGEGUARD_CONSUL EDGEGUARD_PROMETHEUS
	build "$state/bin"
	tf init -input=false -backend-config="path=$state/terraform.tfstate" >/dev/null
	tf apply -input=false -auto-approve "${vars[@]}"
	rules_file="$root/$(tf output -raw rules_file)"
	"$state/bin/stackctl" --state "$state" reconcile --rules "$rules_file" --rls "$(dirname "$rules_file")/rls"
	tf output -json >"$state/outputs.json.tmp"
	mv "$state/outputs.json.tmp" "$state/outputs.json"
	"$state/bin/stackctl" --state "$state" endpoints --outputs "$state/outputs.json"
	;;
down)
	if [ -f "$state/terraform.tfstate" ] && [ -d "$TF_DATA_DIR" ]; then
		tf destroy -input=false -auto-approve "${vars[@]}"
	fi
	# Whatever Terraform did not know about (a failed apply, a lost state).
	if [ -x "$state/bin/stackctl" ]; then
		"$state/bin/stackctl" --state "$state" down --all
	fi
	rm -rf "$state"
	;;
outputs)
	tf output -json
	;;
plan)
	tf plan -input=false -detailed-exitcode "${vars[@]}"
	;;
*)
	echo "usage: $0 up|down|outputs|plan|build" >&2
	exit 2
	;;
esac
