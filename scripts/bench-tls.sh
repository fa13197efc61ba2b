#!/usr/bin/env bash
# TLS at the edge against Debian's nginx, side by side on loopback, with the
# same ECDSA P-256 certificate and the same origin (a static nginx server
# block): full handshakes/s and resumed handshakes/s (openssl s_time, PAR
# processes in parallel, each connection one GET), keep-alive requests/s
# over HTTP/1.1 (wrk) and over HTTP/2 (h2load). Both proxy to the origin;
# the edge with one per-client rule on its memory store (it always decides).
# Each round measures the edge then nginx (alternating which goes first),
# ROUNDS rounds; it prints every measurement, then per metric the median
# of the edge/nginx ratios within rounds.
#
# The floor, in the same rounds: keep-alive requests/s of a Go TLS server
# with none of the edge's work (scripts/tlsfloor: crypto/tls, fasthttp for
# HTTP/1.1, net/http for HTTP/2, answering "ok" itself) against nginx
# answering "ok" itself (return 200) on the same certificate; FLOOR=0
# leaves it out.
#
#   scripts/bench-tls.sh                      # 3 rounds, 5 s per measurement
#   ROUNDS=5 DURATION=10 scripts/bench-tls.sh
#   EDGE_BIN=/path/to/edge scripts/bench-tls.sh   # a binary built elsewhere (another commit)
#
# Needs nginx (nginx-light), wrk, h2load (nghttp2-client) and openssl.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-5}" # seconds per measurement
PAR="${PAR:-4}"           # parallel s_time clients
CONNS="${CONNS:-64}"      # wrk connections
H2CONNS="${H2CONNS:-16}"  # h2load connections
H2STREAMS="${H2STREAMS:-10}"
FLOOR="${FLOOR:-1}"

for b in nginx wrk h2load openssl; do
	command -v "$b" >/dev/null || { echo "bench-tls: $b is missing (apt-get install nginx-light wrk nghttp2-client openssl)" >&2; exit 1; }
done

# $work, $pids (killed at exit) and port.
. scripts/bench-common.sh
ORIGIN=$(port) NGINX_TLS=$(port) EDGE=$(port) EDGE_TLS=$(port) EDGE_ADMIN=$(port) NGINX_200=$(port) GO_200=$(port)
NAME=bench.example.com

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=$NAME" \
	-addext "subjectAltName=DNS:$NAME" -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
mkdir -p "$work/certs" "$work/nginx/logs"
cat "$work/cert.pem" "$work/key.pem" >"$work/certs/bench.pem"

cat >"$work/nginx/nginx.conf" <<EOF
worker_processes auto;
pid $work/nginx/nginx.pid;
error_log $work/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
	access_log off;
	upstream origin { server 127.0.0.1:$ORIGIN; keepalive 64; }
	server {
		listen 127.0.0.1:$ORIGIN;
		location / { return 200 "ok\n"; }
	}
	server {
		listen 127.0.0.1:$NGINX_TLS ssl http2;
		ssl_certificate $work/cert.pem;
		ssl_certificate_key $work/key.pem;
		ssl_protocols TLSv1.2 TLSv1.3;
		ssl_session_cache shared:SSL:10m;
		keepalive_requests 1000000;
		location / {
			proxy_pass http://origin;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_set_header Host \$host;
			proxy_set_header X-Forwarded-For \$remote_addr;
		}
	}
	server {
		listen 127.0.0.1:$NGINX_200 ssl http2;
		ssl_certificate $work/cert.pem;
		ssl_certificate_key $work/key.pem;
		keepalive_requests 1000000;
		location / { return 200 "ok\n"; }
	}
}
EOF
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -g 'daemon off;' &
pids+=($!)

cat >"$work/rules.yaml" <<EOF
version: 1
rules:
  - {id: per-ip, key: [ip], algorithm: fixed_window, limit: 1000000000, window: 1m}
EOF
edge_bin="${EDGE_BIN:-}"
if [ -z "$edge_bin" ]; then
	go build -o "$work/edge" ./cmd/edge
	edge_bin="$work/edge"
fi
"$edge_bin" --listen "127.0.0.1:$EDGE" --listen-tls "127.0.0.1:$EDGE_TLS" --tls-default-cert "$work/certs/bench.pem" \
	--default-host "$NAME" \
	--admin "127.0.0.1:$EDGE_ADMIN" --origin "http://127.0.0.1:$ORIGIN" --rules "$work/rules.yaml" \
	--max-conns-per-ip 0 --drain-delay 0s --log-level warn &
pids+=($!)
ready=("$NGINX_TLS" "$EDGE_TLS")
if [ "$FLOOR" = 1 ]; then
	go build -o "$work/tlsfloor" ./scripts/tlsfloor
	"$work/tlsfloor" -listen "127.0.0.1:$GO_200" -cert "$work/cert.pem" -key "$work/key.pem" &
	pids+=($!)
	ready+=("$NGINX_200" "$GO_200")
fi

for p in "${ready[@]}"; do
	for _ in $(seq 100); do
		curl -sk --resolve "$NAME:$p:127.0.0.1" -o /dev/null "https://$NAME:$p/" && break
		sleep 0.1
	done
done

# s_time MODE PORT: connections per second over PAR parallel clients, each
# connection one GET (so a TLS 1.3 ticket is read and -reuse resumes).
s_time() {
	local mode=$1 p=$2 i waits=()
	for i in $(seq "$PAR"); do
		openssl s_time -connect "127.0.0.1:$p" "$mode" -www / -time "$DURATION" >"$work/stime.$i" 2>/dev/null &
		waits+=($!)
	done
	wait "${waits[@]}" || true
	cat "$work"/stime.* | awk '/connections in [0-9.]+ real seconds/ { n += $1; t = $4 } END { if (t > 0) printf "%.0f", n / t; else print 0 }'
}
# The clients below connect to the address (no SNI): both servers answer
# with their one certificate (the edge's --tls-default-cert).
wrk_rps() {
	wrk -t2 -c"$CONNS" -d"${DURATION}s" -H "Host: $NAME" "https://127.0.0.1:$1/" --timeout 5s 2>/dev/null |
		awk '/^Requests\/sec/ { printf "%.0f", $2 }'
}
h2_rps() {
	h2load -c"$H2CONNS" -m"$H2STREAMS" -D"$DURATION" --warm-up-time=1 -H ":authority: $NAME" "https://127.0.0.1:$1/" 2>/dev/null |
		awk '/^finished in/ { gsub(",", "", $4); printf "%.0f", $4 }'
}

measure() { # server port → "full resumed h1 h2"
	printf '%s %s %s %s' "$(s_time -new "$2")" "$(s_time -reuse "$2")" "$(wrk_rps "$2")" "$(h2_rps "$2")"
}

echo "# round server full-handshakes/s resumed-handshakes/s h1-keepalive-req/s h2-req/s"
results="$work/results"
: >"$results"
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) -eq 1 ]; then order="edge nginx"; else order="nginx edge"; fi
	for s in $order; do
		p=$EDGE_TLS
		[ "$s" = nginx ] && p=$NGINX_TLS
		line="$r $s $(measure "$s" "$p")"
		echo "$line" | tee -a "$results"
	done
	[ "$FLOOR" = 1 ] || continue
	if [ $((r % 2)) -eq 1 ]; then order="go-200 nginx-200"; else order="nginx-200 go-200"; fi
	for s in $order; do
		p=$GO_200
		[ "$s" = nginx-200 ] && p=$NGINX_200
		line="$r $s - - $(wrk_rps "$p") $(h2_rps "$p")"
		echo "$line" | tee -a "$results"
	done
done

echo
echo "# the edge's own count: resumed handshakes of all successful ones"
curl -s "http://127.0.0.1:$EDGE_ADMIN/metrics" | awk '/^edgeguard_tls_handshakes_total.*result="ok"/ { ok = $2 } /^edgeguard_tls_resumptions_total/ { res = $2 } END { printf "%d of %d\n", res, ok }'

# ratios A B FIRST-METRIC: per metric from FIRST-METRIC on, the median over
# rounds of A/B, its range, and the absolute medians.
ratios() {
	awk -v a="$1" -v b="$2" -v first="$3" '
{ v[$1, $2, 1] = $3; v[$1, $2, 2] = $4; v[$1, $2, 3] = $5; v[$1, $2, 4] = $6; if ($1 > n) n = $1 }
function med(x, k,   i, j, t) {
	for (i = 2; i <= k; i++) { t = x[i]; for (j = i - 1; j >= 1 && x[j] > t; j--) x[j + 1] = x[j]; x[j + 1] = t }
	return (k % 2) ? x[(k + 1) / 2] : (x[k / 2] + x[k / 2 + 1]) / 2
}
END {
	split("full-handshakes/s resumed-handshakes/s h1-keepalive-req/s h2-req/s", name, " ")
	for (m = first; m <= 4; m++) {
		delete q; delete e; delete g
		for (r = 1; r <= n; r++) { q[r] = (v[r, b, m] > 0) ? v[r, a, m] / v[r, b, m] : 0; e[r] = v[r, a, m]; g[r] = v[r, b, m] }
		lo = q[1]; hi = q[1]; for (r = 2; r <= n; r++) { if (q[r] < lo) lo = q[r]; if (q[r] > hi) hi = q[r] }
		printf "%-22s %.2f (%.2f–%.2f)   %s %d   %s %d\n", name[m], med(q, n), lo, hi, a, med(e, n), b, med(g, n)
	}
}' "$results"
}

echo
echo "# edge/nginx ratio, median over rounds (min–max); absolute medians"
ratios edge nginx 1
if [ "$FLOOR" = 1 ]; then
	echo
	echo "# the floor: go-200/nginx-200 ratio (both answer \"ok\" themselves), median over rounds (min–max)"
	ratios go-200 nginx-200 3
fi
