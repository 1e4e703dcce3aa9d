#!/usr/bin/env bash
# Servers the remote-cache tests start on loopback (redis-server). Best effort: without it those
# tests skip with the reason, and the rest of CI still runs.
set -u
if command -v redis-server >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null 2>&1 \
    || echo "warning: could not install redis-server; the Redis tests will skip"
else
  echo "warning: redis-server is missing and cannot be installed here; the Redis tests will skip"
fi
exit 0
