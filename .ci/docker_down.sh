#!/usr/bin/env bash
# Stop the dockerd that docker_up.sh started (a pre-existing engine is left alone).
set -uo pipefail
STATE=${STARE_DOCKER_STATE:-/tmp/stare-dockerd}
[ -f "$STATE/dockerd.pid" ] || exit 0
pid=$(cat "$STATE/dockerd.pid")
if kill -0 "$pid" 2>/dev/null; then
  docker ps -aq --filter label=stare-sandbox | xargs -r docker rm -f >/dev/null 2>&1 || true
  kill "$pid"
  for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -9 "$pid" 2>/dev/null || true
fi
rm -f "$STATE/dockerd.pid"
