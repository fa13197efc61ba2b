#!/bin/sh
set -e
chown root:edgeguard /etc/edgeguard/edge.env && chmod 0640 /etc/edgeguard/edge.env
chown root:edgeguard /etc/edgeguard/rls.env && chmod 0640 /etc/edgeguard/rls.env
install -d -o edgeguard -g edgeguard -m 0750 /var/lib/edgeguard /var/log/edgeguard
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
