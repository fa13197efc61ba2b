#!/usr/bin/env bash
# A small stand-in for the multi-region stack, for trying the scenarios on
# one machine without Terraform. Its regions, PoPs, edges, failover lists
# and edge ports are the stack's own (terraform/environments/local/
# topology.auto.tfvars.json): each region gets its own redis-server, its
# own origin (fixed workers x service time) and its edges, each on its own
# loopback address 127.0.<100+R>.E (127.0.101.1 is region 1's first edge,
# clear of the stack's 127.0.R.E), trusting the load generator at 127.0.0.1.
# Redis, Consul, origins and Prometheus listen on free ports.
#
#   loadtest/fixture.sh up     # prints the outputs file (stack output format)
#   loadtest/fixture.sh down   # stops everything it started
#   loadtest/fixture.sh kill-redis REGION    # drill: SIGKILL the region's Redis
#   loadtest/fixture.sh start-redis REGION   # bring it back (empty) on its port
#
# Origins are smaller than the stack's: FIXTURE_ORIGINS lists workers:service
# time per region in name order ("8:5ms 2:20ms": the first region serves
# 1600 req/s, the second 100 req/s, the one overload.js drives past
# capacity). Each region also gets a Consul dev
# agent (datacenter = region) whose DNS answers the prepared query
# edge.query.consul with the region's healthy edges (registered with a
# /readyz check), so the scenarios route clients by DNS as on the stack; with
# FIXTURE_CONSUL=0 (or no Consul binary) the outputs carry no DNS address and
# the scenarios pick among a region's edges themselves.
# A Prometheus (the binary $PROMETHEUS, else prometheus on PATH or in
# ~/.cache/edgeguard) scrapes the edges and accepts k6's remote write; its
# address is the outputs' prometheus_url. Without one, none is listed.
# State: ${FIXTURE_STATE:-loadtest/results/fixture}. FIXTURE_BASE (100)
# moves the addresses, so two fixtures can run at once (with distinct
# FIXTURE_STATE). EDGE_FLAGS adds flags to every edge (e.g.
# EDGE_FLAGS='--redis-timeout 50ms').
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
state="${FIXTURE_STATE:-$root/loadtest/results/fixture}"
base="${FIXTURE_BASE:-100}" # edges on 127.0.<base+region>.<edge>
topology="$root/terraform/environments/local/topology.auto.tfvars.json"
cmd="${1:-}"

down() {
	[ -d "$state/pids" ] || return 0
	for f in "$state"/pids/*; do
		[ -e "$f" ] || continue
		pid=$(cat "$f")
		kill "$pid" 2>/dev/null || true
	done
	for f in "$state"/pids/*; do
		[ -e "$f" ] || continue
		pid=$(cat "$f")
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null || true
		rm -f "$f"
	done
}

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_http() { # url what
	for _ in $(seq 100); do
		curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "fixture: $2 not ready at $1 (logs in $state/logs)" >&2
	return 1
}

start() { # name cmd...
	local name=$1
	shift
	"$@" </dev/null >"$state/logs/$name.log" 2>&1 &
	echo $! >"$state/pids/$name"
}

case "$cmd" in
down)
	down
	echo "fixture: stopped" >&2
	;;
up)
	command -v redis-server >/dev/null || { echo "fixture: redis-server missing (make tools installs it)" >&2; exit 1; }
	down
	mkdir -p "$state/pids" "$state/logs" "$state/bin"
	(cd "$root" && go build -o "$state/bin/edge" ./cmd/edge)
	(cd "$root" && go build -o "$state/bin/origin" ./cmd/stackorigin) # the stack's origin: workers x service time
	rules="loadtest/fixture/rules.yaml"
	# The plan, from the topology: "region NAME INDEX WORKERS SERVICE_TIME"
	# and "edge REGION POP NAME ADDR NODES_IN_REGION NODES_IN_POP" lines, then
	# "ports HTTP ADMIN".
	python3 - "$topology" "$base" "${FIXTURE_ORIGINS:-8:5ms 2:20ms}" >"$state/plan" <<'PY'
import json, sys
topo = json.load(open(sys.argv[1]))
base, origins = int(sys.argv[2]), sys.argv[3].split()
for r, name in enumerate(sorted(topo["regions"]), 1):
    pops = topo["regions"][name]["pops"]
    workers, service = origins[(r - 1) % len(origins)].split(":")
    print("region", name, r, workers, service)
    e = 0
    for pop in sorted(pops):
        for i in range(pops[pop]):
            e += 1
            print("edge", name, pop, f"{name}-{pop}-{i + 1}", f"127.0.{base + r}.{e}", sum(pops.values()), pops[pop])
print("ports", topo["ports"]["edge"]["http"], topo["ports"]["edge"]["admin"])
PY
	read -r _ http_port admin_port < <(grep '^ports ' "$state/plan")
	: >"$state/started" # what ran where: the outputs are made from it
	consul=""
	if [ "${FIXTURE_CONSUL:-1}" != 0 ]; then
		consul=$("$root/scripts/install-consul.sh" 2>/dev/null) || consul=""
	fi
	while read -r _ region _ oworkers oservice; do
		rport=$(free_port)
		echo "$rport" >"$state/redis-$region.port"
		start "redis-$region" redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no
		oport=$(free_port)
		start "origin-$region" "$state/bin/origin" --listen "127.0.0.1:$oport" --workers "$oworkers" --service-time "$oservice" --queue 100000
		for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
		chttp=- cdns=-
		if [ -n "$consul" ]; then
			read -r chttp cdns cgrpc cgrpctls clan cwan cserver <<<"$(python3 -c '
import socket
ss=[socket.socket() for _ in range(7)]
for s in ss: s.bind(("127.0.0.1",0))
print(" ".join(str(s.getsockname()[1]) for s in ss))')"
			start "consul-$region" "$consul" agent -dev -datacenter "$region" -node "fixture-$region" \
				-bind 127.0.0.1 -client 127.0.0.1 -http-port "$chttp" -dns-port "$cdns" -grpc-port "$cgrpc" -grpc-tls-port "$cgrpctls" \
				-serf-lan-port "$clan" -serf-wan-port "$cwan" -server-port "$cserver" -data-dir "$state/consul-$region"
			wait_http "http://127.0.0.1:$chttp/v1/status/leader" "consul $region" || { down; exit 1; }
			for _ in $(seq 100); do
				[ "$(curl -fsS "http://127.0.0.1:$chttp/v1/status/leader" 2>/dev/null)" != '""' ] && break
				sleep 0.1
			done
			curl -fsS -X POST "http://127.0.0.1:$chttp/v1/query" \
				-d '{"Name":"edge","Service":{"Service":"edgeguard-edge","OnlyPassing":true}}' >/dev/null
		fi
		echo "region $region $rport $oport $oworkers $oservice $chttp $cdns" >>"$state/started"
	done < <(grep '^region ' "$state/plan")
	while read -r _ region pop name addr in_region in_pop; do
		read -r _ _ rport oport _ _ chttp _ < <(grep "^region $region " "$state/started")
		EDGEGUARD_KEY_SALT="fixture-salt-$region" start "edge-$name" "$state/bin/edge" --region "$region" --pop "$pop" \
			--listen "$addr:$http_port" --admin "$addr:$admin_port" \
			--redis "redis://127.0.0.1:$rport" \
			--trusted-proxies 127.0.0.1/32 --origin "http://127.0.0.1:$oport" \
			--rules "$root/$rules" --shedder "$root/loadtest/fixture/shedder.json" \
			--nodes-in-region "$in_region" --nodes-in-pop "$in_pop" --workers 64 ${EDGE_FLAGS:-}
		if [ "$chttp" != - ]; then
			curl -fsS -X PUT "http://127.0.0.1:$chttp/v1/agent/service/register" -d "{\"ID\":\"$name\",\"Name\":\"edgeguard-edge\",
				\"Address\":\"$addr\",\"Port\":$http_port,\"Meta\":{\"region\":\"$region\",\"pop\":\"$pop\"},
				\"Check\":{\"HTTP\":\"http://$addr:$admin_port/readyz\",\"Interval\":\"1s\"}}" >/dev/null
		fi
		echo "edge $region $pop $name $addr" >>"$state/started"
	done < <(grep '^edge ' "$state/plan")
	prom="${PROMETHEUS:-$(command -v prometheus || ls -d "${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}"/prometheus-*/prometheus 2>/dev/null | tail -1 || true)}"
	if [ -n "$prom" ] && [ -x "$prom" ]; then
		pport=$(free_port)
		targets=$(awk -v p="$admin_port" '$1 == "edge" { printf "%s\x27%s:%s\x27", sep, $5, p; sep = ", " }' "$state/plan")
		cat >"$state/prometheus.yml" <<YML
global: {scrape_interval: 2s}
scrape_configs:
  - job_name: edges
    static_configs:
      - targets: [$targets]
YML
		start prometheus "$prom" --config.file "$state/prometheus.yml" --storage.tsdb.path "$state/prometheus" \
			--web.listen-address "127.0.0.1:$pport" --web.enable-remote-write-receiver
		wait_http "http://127.0.0.1:$pport/-/ready" prometheus || { down; exit 1; }
		echo "prometheus $pport" >>"$state/started"
	fi
	# The outputs, in Terraform's `output -json` shape, from the topology
	# and what was started.
	python3 - "$topology" "$state/started" "$rules" "$state" "$http_port" "$admin_port" >"$state/outputs.json" <<'PY'
import json, sys
topo_path, started_path, rules, state, http_port, admin_port = sys.argv[1:]
topo = json.load(open(topo_path))
regions, prometheus = {}, None
for line in open(started_path):
    f = line.split()
    if f[0] == "region":
        name, rport, oport, workers, service, chttp, cdns = f[1:]
        r = {
            "redis": {"mode": "standalone", "url": f"redis://127.0.0.1:{rport}"},
            "origin": f"http://127.0.0.1:{oport}",
            "origin_capacity_rps": round(int(workers) / (int(service.removesuffix("ms")) / 1000)),
            "pops": {},
            "failover": topo["regions"][name]["failover"],
        }
        if chttp != "-":
            r["consul"] = {"datacenter": name, "http": f"http://127.0.0.1:{chttp}", "dns": f"127.0.0.1:{cdns}"}
        regions[name] = r
    elif f[0] == "edge":
        region, pop, name, addr = f[1:]
        edge = {"name": name, "addr": addr, "url": f"http://{addr}:{http_port}", "admin": f"http://{addr}:{admin_port}"}
        regions[region]["pops"].setdefault(pop, {"edges": []})["edges"].append(edge)
    elif f[0] == "prometheus":
        prometheus = f"http://127.0.0.1:{f[1]}"
out = {"regions": {"value": regions, "type": "object"}}
if prometheus:
    out["prometheus_url"] = {"value": prometheus, "type": "string"}
out["rules_file"] = {"value": rules, "type": "string"}
out["dns_query"] = {"value": "edge", "type": "string"}
out["state_dir"] = {"value": state, "type": "string"}
json.dump(out, sys.stdout, indent=4)
print()
PY
	for f in "$state"/pids/*; do
		kill -0 "$(cat "$f")" 2>/dev/null || { echo "fixture: $(basename "$f") exited (log: $state/logs/$(basename "$f").log)" >&2; down; exit 1; }
	done
	while read -r _ _ _ name addr _; do
		wait_http "http://$addr:$admin_port/readyz" "edge $name" || { down; exit 1; }
	done < <(grep '^edge ' "$state/plan")
	# DNS serves an edge once its /readyz check passed: wait for all of them.
	python3 -c 'import json,sys
for r in json.load(open(sys.argv[1]))["regions"]["value"].values():
    if "consul" in r: print(r["consul"]["http"] + "/v1/query/edge/execute", sum(len(p["edges"]) for p in r["pops"].values()))' "$state/outputs.json" |
		while read -r url want; do
			for _ in $(seq 100); do
				[ "$(curl -fsS "$url" 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["Nodes"]))' 2>/dev/null)" = "$want" ] && break
				sleep 0.1
			done
		done
	echo "fixture: up; STACK_OUTPUTS=$state/outputs.json" >&2
	echo "$state/outputs.json"
	;;
kill-redis)
	region="${2:?usage: $0 kill-redis REGION}"
	pidf="$state/pids/redis-$region"
	[ -f "$pidf" ] || { echo "fixture: no redis for $region" >&2; exit 1; }
	kill -9 "$(cat "$pidf")"
	rm -f "$pidf"
	echo "fixture: killed redis of $region" >&2
	;;
start-redis)
	region="${2:?usage: $0 start-redis REGION}"
	rport=$(cat "$state/redis-$region.port")
	start "redis-$region" redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no
	for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
	echo "fixture: redis of $region back on $rport" >&2
	;;
*)
	echo "usage: $0 up|down|kill-redis REGION|start-redis REGION" >&2
	exit 2
	;;
esac
