"""Shared helpers for the sandbox tests."""
from __future__ import annotations

import os
import time

import pytest

from sandbox import Limits

# Small limits so every adversarial test is quick; each test states what it attacks.
TEST_LIMITS = Limits(wall_time_s=3.0, memory_mb=256, max_output_bytes=4096, disk_mb=16, max_processes=32)


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
    """Processes still alive with `marker` after `timeout` (teardown is asynchronous by ms)."""
    deadline = time.monotonic() + timeout
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


class Procs:
    with_marker = staticmethod(processes_with)
    wait_gone = staticmethod(wait_gone)


@pytest.fixture
def procs() -> Procs:
    return Procs()


@pytest.fixture
def limits() -> Limits:
    return TEST_LIMITS


@pytest.fixture
def marker(request) -> str:
    return f"stare-marker-{os.getpid()}-{request.node.name}-{time.monotonic_ns()}"
