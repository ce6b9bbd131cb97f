#!/usr/bin/env bash
# Start a Docker engine (installing docker.io if needed) and build the sandbox image offline.
# Idempotent. Exits non-zero when no engine can run here; the Docker tests then skip with the reason,
# except under CI=true, where they fail.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
STATE=${STARE_DOCKER_STATE:-/tmp/stare-dockerd}

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "docker_up: dockerd is missing and cannot be installed (needs root + apt-get)" >&2; exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q docker.io >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q docker.io >/dev/null; }
fi

if ! docker info >/dev/null 2>&1; then
  mkdir -p "$STATE"
  # Sandbox containers use --network none only: no bridge or iptables needed (both may be absent in VMs).
  nohup dockerd --bridge=none --iptables=false --ip6tables=false >"$STATE/dockerd.log" 2>&1 &
  echo $! >"$STATE/dockerd.pid"
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  if ! docker info >/dev/null 2>&1; then
    echo "docker_up: dockerd did not come up; last log lines:" >&2; tail -n 20 "$STATE/dockerd.log" >&2; exit 1
  fi
fi

"$PY" -m sandbox.docker.build
