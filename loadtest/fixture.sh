#!/usr/bin/env bash
# A small stand-in for the multi-region stack, for trying the scenarios on
# one machine without Terraform: two regions, each with its own
# redis-server, its own origin (fixed workers x service time) and two edges
# on their own loopback addresses 127.0.<100+R>.E (public :8080, admin
# :18391; 127.0.101.1 is region 1's first edge, clear of the stack's
# 127.0.R.E), trusting the load generator at 127.0.0.1.
#
#   loadtest/fixture.sh up     # prints the outputs file (stack output format)
#   loadtest/fixture.sh down   # stops everything it started
#   loadtest/fixture.sh kill-redis REGION    # drill: SIGKILL the region's Redis
#   loadtest/fixture.sh start-redis REGION   # bring it back (empty) on its port
#
# Regions: eu-west (PoPs ams, fra; origin 8 workers x 5 ms = 1600 req/s) and
# us-east (PoPs iad, atl; origin 2 workers x 20 ms = 100 req/s, the one
# overload.js drives past capacity). Each region also gets a Consul dev
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
	"$@" >"$state/logs/$name.log" 2>&1 &
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
	json='{"regions":{"value":{'
	sep=""
	r=0
	for spec in "eu-west:ams,fra:8:5ms" "us-east:iad,atl:2:20ms"; do
		IFS=: read -r region pops oworkers oservice <<<"$spec"
		r=$((r + 1))
		rport=$(free_port)
		echo "$rport" >"$state/redis-$region.port"
		start "redis-$region" redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no
		oport=$(free_port)
		start "origin-$region" "$state/bin/origin" --listen "127.0.0.1:$oport" --workers "$oworkers" --service-time "$oservice" --queue 100000
		for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
		consuljson=""
		if [ "${FIXTURE_CONSUL:-1}" != 0 ] && consul=$("$root/scripts/install-consul.sh" 2>/dev/null); then
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
			consuljson="\"consul\":{\"datacenter\":\"$region\",\"http\":\"http://127.0.0.1:$chttp\",\"dns\":\"127.0.0.1:$cdns\"},"
		fi
		popjson=""
		e=0
		for pop in ${pops//,/ }; do
			e=$((e + 1))
			addr="127.0.$((base + r)).$e"
			name="$region-$pop-1"
			EDGEGUARD_KEY_SALT="fixture-salt-$region" start "edge-$name" "$state/bin/edge" --region "$region" --pop "$pop" \
				--listen "$addr:8080" --admin "$addr:18391" \
				--redis "redis://127.0.0.1:$rport" \
				--trusted-proxies 127.0.0.1/32 --origin "http://127.0.0.1:$oport" \
				--rules "$root/$rules" --shedder "$root/loadtest/fixture/shedder.json" \
				--nodes-in-region 2 --nodes-in-pop 1 --workers 64 ${EDGE_FLAGS:-}
			if [ -n "$consuljson" ]; then
				curl -fsS -X PUT "http://127.0.0.1:$chttp/v1/agent/service/register" -d "{\"ID\":\"$name\",\"Name\":\"edgeguard-edge\",
					\"Address\":\"$addr\",\"Port\":8080,\"Meta\":{\"region\":\"$region\",\"pop\":\"$pop\"},
					\"Check\":{\"HTTP\":\"http://$addr:18391/readyz\",\"Interval\":\"1s\"}}" >/dev/null
			fi
			[ -n "$popjson" ] && popjson+=","
			popjson+="\"$pop\":{\"edges\":[{\"name\":\"$name\",\"addr\":\"$addr\",\"url\":\"http://$addr:8080\",\"admin\":\"http://$addr:18391\"}]}"
		done
		other="us-east"
		[ "$region" = us-east ] && other="eu-west"
		json+="$sep\"$region\":{$consuljson\"redis\":{\"mode\":\"standalone\",\"url\":\"redis://127.0.0.1:$rport\"},"
		json+="\"origin\":\"http://127.0.0.1:$oport\",\"origin_capacity_rps\":$(python3 -c "print(round($oworkers/($(echo "$oservice" | tr -d ms)/1000)))"),"
		json+="\"pops\":{$popjson},\"failover\":[\"$other\"]}"
		sep=","
	done
	json+='},"type":"object"},'
	prom="${PROMETHEUS:-$(command -v prometheus || ls -d "${EDGEGUARD_CACHE:-$HOME/.cache/edgeguard}"/prometheus-*/prometheus 2>/dev/null | tail -1 || true)}"
	if [ -n "$prom" ] && [ -x "$prom" ]; then
		pport=$(free_port)
		cat >"$state/prometheus.yml" <<YML
global: {scrape_interval: 2s}
scrape_configs:
  - job_name: edges
    static_configs:
      - targets: ['127.0.$((base + 1)).1:18391', '127.0.$((base + 1)).2:18391', '127.0.$((base + 2)).1:18391', '127.0.$((base + 2)).2:18391']
YML
		start prometheus "$prom" --config.file "$state/prometheus.yml" --storage.tsdb.path "$state/prometheus" \
			--web.listen-address "127.0.0.1:$pport" --web.enable-remote-write-receiver
		wait_http "http://127.0.0.1:$pport/-/ready" prometheus || { down; exit 1; }
		json+="\"prometheus_url\":{\"value\":\"http://127.0.0.1:$pport\",\"type\":\"string\"},"
	fi
	json+="\"rules_file\":{\"value\":\"$rules\",\"type\":\"string\"},"
	json+="\"dns_query\":{\"value\":\"edge\",\"type\":\"string\"},"
	json+="\"state_dir\":{\"value\":\"$state\",\"type\":\"string\"}}"
	echo "$json" | python3 -m json.tool >"$state/outputs.json"
	for f in "$state"/pids/*; do
		kill -0 "$(cat "$f")" 2>/dev/null || { echo "fixture: $(basename "$f") exited (log: $state/logs/$(basename "$f").log)" >&2; down; exit 1; }
	done
	for r in $((base + 1)) $((base + 2)); do
		for e in 1 2; do
			wait_http "http://127.0.$r.$e:18391/readyz" "edge 127.0.$r.$e" || { down; exit 1; }
		done
	done
	# DNS serves an edge once its /readyz check passed: wait for all of them.
	for url in $(python3 -c 'import json,sys
for r in json.load(open(sys.argv[1]))["regions"]["value"].values():
    if "consul" in r: print(r["consul"]["http"] + "/v1/query/edge/execute")' "$state/outputs.json"); do
		for _ in $(seq 100); do
			[ "$(curl -fsS "$url" 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["Nodes"]))' 2>/dev/null)" = 2 ] && break
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
