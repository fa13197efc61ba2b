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
set -euo pipefail
# Without a CLI config file Terraform warns on every command; an empty one
# says the same (no provider mirrors: the stack only uses the built-in one).
[ -n "${TF_CLI_CONFIG_FILE:-}" ] || [ -f "$HOME/.terraformrc" ] || export TF_CLI_CONFIG_FILE=/dev/null

root=$(cd "$(dirname "$0")/.." && pwd)
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
	(cd "$root" && go build -o "$state/bin/" ./cmd/edge ./cmd/regionctl ./cmd/stackctl ./cmd/stackorigin)
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
	echo "usage: $0 up|down|outputs|plan" >&2
	exit 2
	;;
esac
