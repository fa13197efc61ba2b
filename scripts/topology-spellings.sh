#!/usr/bin/env bash
# Lists the places, outside the topology file, where the stack's non-test
# code and config spell a region, a PoP, a component id prefix or a port of
# the stack's topology (terraform/environments/local/topology.auto.tfvars.json,
# whose names and numbers are the patterns), and counts them. Comment lines
# are left out.
#
#   scripts/topology-spellings.sh [TREE]   # TREE: a checkout to scan (default: this one)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tree=$(cd "${1:-$root}" && pwd)
topology="$root/terraform/environments/local/topology.auto.tfvars.json"
read -r ids ports < <(python3 - "$topology" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
names = set(t["regions"]) | {p for r in t["regions"].values() for p in r["pops"]}
nums = set()
def walk(v):
    if isinstance(v, dict):
        for k, x in v.items():
            if k != "region_stride":
                walk(x)
    elif isinstance(v, int):
        nums.add(v)
walk(t["ports"])
prefixes = "|".join(f'"{k}-"|{k}-\\$\\{{' for k in ("edge", "redis", "consul", "origin"))
print(f"(\\b({'|'.join(sorted(names))})\\b|{prefixes})", f"\\b({'|'.join(str(n) for n in sorted(nums))})\\b")
PY
)
cd "$tree"
mapfile -t files < <(find terraform internal/stack cmd/stackctl cmd/drills loadtest/fixture.sh loadtest/scenarios scripts/stack.sh scripts/install-terraform.sh \
	-type f \( -name '*.go' -o -name '*.tf' -o -name '*.js' -o -name '*.sh' -o -name '*.json' -o -name '*.tfvars' \) \
	! -name '*_test.go' ! -name 'topology.auto.tfvars.json' ! -path '*/rls/*' ! -path '*/.terraform/*' 2>/dev/null | sort)
hits() { grep -nE "$1" "${files[@]}" | grep -vE '^[^:]+:[0-9]+:[[:space:]]*(//|#|\*)' || true; }
for what in ids ports; do
	pattern=${!what}
	echo "== $what"
	hits "$pattern"
	echo "-- $what: $(hits "$pattern" | grep -c . || true) lines in $(hits "$pattern" | cut -d: -f1 | sort -u | grep -c . || true) files"
done
