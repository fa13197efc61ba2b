#!/usr/bin/env bash
# Checks the packages make package built, as far as this machine allows:
# their contents and control data, the unit's hardening, the packaged
# config against `edge check`, the units with `systemd-analyze verify` where
# it is installed, and the unit's command started from the unpacked tree (no
# systemd needed) until /readyz answers, and the same for
# the rate limit service's unit (edgeguard-rls: `edge rls` with rls.env)
# until /healthcheck answers. It also checks the container recipe names a
# static build on a minimal base.
set -euo pipefail
cd "$(dirname "$0")/.."
deb=$(ls dist/edgeguard-edge_*.deb)
ctl=$(ls dist/edgeguard-regionctl_*.deb)
fail() { echo "check-package: $*" >&2; exit 1; }
# The packaged edge reads its settings from the unit's files only, as it
# does under systemd: no EDGEGUARD_ variable of the calling shell (make
# test's own EDGEGUARD_CONSUL names a Consul binary, not an agent).
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep -E '^EDGEGUARD_' || true)

contents=$(dpkg-deb -c "$deb")
for f in ./usr/bin/edgeguard-edge ./lib/systemd/system/edgeguard-edge.service ./lib/systemd/system/edgeguard-edge.socket ./lib/systemd/system/edgeguard-rls.service ./etc/edgeguard/edge.yaml ./etc/edgeguard/edge.env ./etc/edgeguard/rls.env ./etc/edgeguard/ratelimit/config/ ./etc/edgeguard/rules.yaml ./usr/share/doc/edgeguard-edge/copyright; do
	grep -q " $f\$" <<<"$contents" || fail "$deb lacks $f"
done
grep -q -- "-rw-r----- .* ./etc/edgeguard/edge.env$" <<<"$contents" || fail "edge.env must be 0640"
grep -q -- "-rw-r----- .* ./etc/edgeguard/rls.env$" <<<"$contents" || fail "rls.env must be 0640"
ctl_contents=$(dpkg-deb -c "$ctl")
grep -q " ./usr/bin/regionctl\$" <<<"$ctl_contents" || fail "$ctl lacks /usr/bin/regionctl"
conffiles=$(dpkg-deb -I "$deb" conffiles)
for f in /etc/edgeguard/edge.yaml /etc/edgeguard/edge.env /etc/edgeguard/rls.env /etc/edgeguard/rules.yaml; do
	grep -qx "$f" <<<"$conffiles" || fail "$f is not a conffile (an upgrade would overwrite it)"
done
preinst=$(dpkg-deb -I "$deb" preinst)
grep -q "useradd --system" <<<"$preinst" || fail "preinst does not create the edgeguard user"
postrm=$(dpkg-deb -I "$deb" postrm)
grep -q 'rm -rf /var/lib/edgeguard /var/log/edgeguard' <<<"$postrm" || fail "postrm does not remove the edge's state and logs on purge"

tree=$(mktemp -d)
trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$tree"' EXIT
dpkg-deb -x "$deb" "$tree"
unit="$tree/lib/systemd/system/edgeguard-edge.service"
for want in "User=edgeguard" "NoNewPrivileges=yes" "ProtectSystem=strict" "CapabilityBoundingSet=CAP_NET_BIND_SERVICE" "AmbientCapabilities=CAP_NET_BIND_SERVICE" "ExecReload=/bin/kill -HUP \$MAINPID" "Type=notify" "NotifyAccess=all" "EnvironmentFile=-/etc/edgeguard/edge.env"; do
	grep -qxF "$want" "$unit" || fail "unit lacks $want"
done
bin="$tree/usr/bin/edgeguard-edge"
[[ "$(file "$bin")" == *"statically linked"* ]] || fail "the edge binary is not static"
[[ "$("$bin" --version)" == "edge "* ]] || fail "--version"
socket="$tree/lib/systemd/system/edgeguard-edge.socket"
for want in "FileDescriptorName=public" "Service=edgeguard-edge.service"; do
	grep -qxF "$want" "$socket" || fail "socket unit lacks $want"
done
# The units as systemd reads them, where its analyzer is installed (it needs
# no running systemd), with the binary's path moved into the tree: any
# complaint fails the check.
if command -v systemd-analyze >/dev/null; then
	mkdir "$tree/units"
	for u in edgeguard-edge.service edgeguard-edge.socket edgeguard-rls.service; do
		sed "s|/usr/bin/edgeguard-edge|$bin|g" "$tree/lib/systemd/system/$u" >"$tree/units/$u"
	done
	verify=$(cd "$tree/units" && systemd-analyze verify ./edgeguard-edge.service ./edgeguard-edge.socket ./edgeguard-rls.service 2>&1) && [ -z "$verify" ] ||
		fail "systemd-analyze verify: ${verify:-failed}"
fi

# The unit's command, with the packaged config (paths moved into the tree,
# an origin and free loopback ports given, as an operator's edit would). The
# admin port is the kernel's choice, read back from the edge's own "edge
# serving" line: never the product's default port, where another edge on
# this machine may be answering.
cfg="$tree/etc/edgeguard/edge.yaml"
sed -i -e "s|^origin: \[\]|origin: [http://127.0.0.1:9]|" -e "s|^listen: .*|listen: 127.0.0.1:0|" \
	-e "s|^admin: .*|admin: 127.0.0.1:0|" -e "s|/etc/edgeguard/|$tree/etc/edgeguard/|" \
	-e "s|/var/lib/edgeguard/|$tree/|" -e "s|/var/log/edgeguard/|$tree/|" "$cfg"
"$bin" check --config "$cfg" || fail "edge check refused the packaged config"
exec_start=$(sed -n 's|^ExecStart=/usr/bin/edgeguard-edge ||p' "$unit")
[ "$exec_start" = "--config /etc/edgeguard/edge.yaml" ] || fail "unexpected ExecStart: $exec_start"
"$bin" --config "$cfg" >"$tree/edge.log" 2>&1 &
pid=$!
admin=
for _ in $(seq 300); do
	kill -0 "$pid" 2>/dev/null || { cat "$tree/edge.log"; fail "the unit's command exited"; }
	if [ -z "$admin" ]; then
		admin=$(sed -n 's|.*"msg":"edge serving".*"admin":"\([^"]*\)".*|\1|p' "$tree/edge.log" | head -n1)
	fi
	[ -n "$admin" ] && curl -fsS "http://$admin/readyz" >/dev/null 2>&1 && break
	sleep 0.1
done
[ -n "$admin" ] || { cat "$tree/edge.log"; fail "the edge never said where its admin listener is"; }
curl -fsS "http://$admin/readyz" >/dev/null || { cat "$tree/edge.log"; fail "/readyz never answered on $admin"; }
metrics=$(curl -fsS "http://$admin/metrics")
grep -q '^edgeguard_build_info{' <<<"$metrics" || fail "no build info metric"
kill -TERM "$pid"
wait "$pid" || fail "the edge did not stop cleanly on SIGTERM"
pid=

# The rate limit service's unit: its command with the packaged rls.env
# (the runtime root moved into the tree, loopback and kernel-chosen ports,
# JSON logs to read the HTTP address back), until /healthcheck answers OK;
# Redis need not answer for that (calls are decided locally meanwhile).
rls_unit="$tree/lib/systemd/system/edgeguard-rls.service"
for want in "User=edgeguard" "NoNewPrivileges=yes" "ProtectSystem=strict" "EnvironmentFile=/etc/edgeguard/rls.env" "ExecStart=/usr/bin/edgeguard-edge rls"; do
	grep -qxF "$want" "$rls_unit" || fail "rls unit lacks $want"
done
grep -q "^WantedBy=" "$rls_unit" || fail "rls unit has no [Install] target"
env_file="$tree/etc/edgeguard/rls.env"
grep -qx "RUNTIME_ROOT=/etc/edgeguard/ratelimit" "$env_file" || fail "rls.env: unexpected RUNTIME_ROOT"
[ -d "$tree/etc/edgeguard/ratelimit/config" ] || fail "no configuration directory for the rate limit service"
rls_env=()
while IFS= read -r line; do
	case "$line" in ''|'#'*) continue ;; esac
	rls_env+=("${line//\/etc\/edgeguard\//$tree/etc/edgeguard/}")
done <"$env_file"
rls_env+=(HOST=127.0.0.1 PORT=0 GRPC_HOST=127.0.0.1 GRPC_PORT=0 DEBUG_HOST=127.0.0.1 DEBUG_PORT=0 LOG_FORMAT=json)
env -i "${rls_env[@]}" "$bin" rls >"$tree/rls.log" 2>&1 &
pid=$!
http=
for _ in $(seq 300); do
	kill -0 "$pid" 2>/dev/null || { cat "$tree/rls.log"; fail "the rls unit's command exited"; }
	if [ -z "$http" ]; then
		http=$(sed -n 's|.*"msg":"rate limit service serving".*"http":"\([^"]*\)".*|\1|p' "$tree/rls.log" | head -n1)
	fi
	[ -n "$http" ] && [ "$(curl -fsS "http://$http/healthcheck" 2>/dev/null)" = OK ] && break
	sleep 0.1
done
[ -n "$http" ] || { cat "$tree/rls.log"; fail "edge rls never said where its HTTP listener is"; }
[ "$(curl -fsS "http://$http/healthcheck")" = OK ] || { cat "$tree/rls.log"; fail "/healthcheck never answered OK on $http"; }
kill -TERM "$pid"
wait "$pid" || fail "edge rls did not stop cleanly on SIGTERM"
pid=

c=packaging/Containerfile
grep -q "^FROM gcr.io/distroless/static" "$c" || fail "$c: not a minimal static base"
grep -q "CGO_ENABLED=0" "$c" || fail "$c: the binary is not static"
grep -q "^USER nonroot" "$c" || fail "$c: runs as root"
echo "check-package: ok ($(basename "$deb"), $(basename "$ctl"))"
