#!/bin/sh
# The edge runs as its own system user, never root.
set -e
if ! getent group edgeguard >/dev/null; then
	groupadd --system edgeguard
fi
if ! getent passwd edgeguard >/dev/null; then
	useradd --system --gid edgeguard --home-dir /var/lib/edgeguard --no-create-home --shell /usr/sbin/nologin edgeguard
fi
