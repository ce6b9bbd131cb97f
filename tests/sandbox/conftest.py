"""Shared fixtures for the sandbox tests: a started sandbox per backend, process probes."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest

from sandbox import DockerConfig, Limits, SandboxConfig, SandboxError, SyncSandbox

# Small limits so every adversarial test ends fast; each test states what it attacks.
TEST_LIMITS = Limits(wall_time_s=5.0, memory_mb=256, max_output_bytes=4096, disk_mb=16, max_processes=32)


def open_sandbox(backend: str, **overrides) -> SyncSandbox:
    """A started sandbox. Docker: skips, with the reason, when no engine or image is here, except
    under CI=true, where .ci/run starts the engine and builds the image: there it fails."""
    if backend == "local" and os.geteuid() != 0:
        pytest.skip(
            "these tests expect the local sandbox's root mode (cgroups, per-session uids); "
            "its rootless mode is tested in test_sandbox_rootless.py"
        )
    # docker: a container competes for CPU as one cgroup, so under a loaded CI it runs slower still
    limits = TEST_LIMITS if backend == "local" else dataclasses.replace(TEST_LIMITS, wall_time_s=8.0)
    cfg = SandboxConfig(backend=backend, limits=limits, workers=2, backends={"docker": DockerConfig(warm=2)})
    for key, value in overrides.items():
        setattr(cfg, key, value)
    try:
        return SyncSandbox(cfg)
    except SandboxError as e:
        if backend == "docker" and os.environ.get("CI", "").lower() not in ("1", "true"):
            pytest.skip(f"no Docker engine or image here ({e}); `bash .ci/docker_up.sh` provides both")
        raise  # under CI the engine is started by .ci/run (.ci/docker_up.sh): a missing one is a failure


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("local", marks=pytest.mark.xdist_group("sandbox-local")),
        pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.xdist_group("sandbox-docker")]),
    ],
)
def box(request):
    """Both backends, each attacked by the same tests."""
    os.environ["STARE_TEST_SECRET"] = "hunter2"  # must never reach the code
    sb = open_sandbox(request.param)
    sb.backend = request.param
    yield sb
    sb.close()


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (the sandboxed code cannot name host pids)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


def wait_gone(marker: str, timeout: float = 5.0) -> list[int]:
    """Processes still alive with `marker` after `timeout` (teardown may lag by milliseconds)."""
    deadline = time.monotonic() + timeout
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


class Procs:
    with_marker = staticmethod(processes_with)
    wait_gone = staticmethod(wait_gone)


@pytest.fixture(scope="module")
def make_box():
    """open_sandbox(backend, **config_overrides) for tests that need their own configuration."""
    return open_sandbox


@pytest.fixture
def procs() -> Procs:
    return Procs()


@pytest.fixture
def marker(request) -> str:
    return f"stare-marker-{os.getpid()}-{time.monotonic_ns()}"
