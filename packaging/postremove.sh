#!/bin/sh
set -e
# purge removes what the edge wrote (its rules cache and access log); remove
# keeps them, as it keeps the configuration. The edgeguard user stays (files
# elsewhere may still belong to it), as Debian's policy suggests.
if [ "$1" = "purge" ]; then
	rm -rf /var/lib/edgeguard /var/log/edgeguard
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
