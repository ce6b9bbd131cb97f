"""Timing isolation between sessions: noisy neighbours (cells that leave processes behind for the
worker to kill, every cell) never push another trajectory's cell into a timeout. A cell's limit
counts from when its code can run, and the worker steps each park between its other requests, so
one session's leftovers never delay another's resume. Root here; rootless in rootless_probe.py. (Docker
sessions each have a container of their own, so no worker is shared.)"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("sandbox-local")  # timing: beside the other local tests, not in parallel
_spec = importlib.util.spec_from_file_location("sandbox_attacks", Path(__file__).with_name("attacks.py"))
_attacks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_attacks)


def test_noisy_neighbours_never_time_a_victim_out(make_box):
    from sandbox import Limits

    limits = Limits(wall_time_s=5.0, memory_mb=256, max_output_bytes=4096, disk_mb=16, max_processes=32)
    box = make_box("local", limits=limits, workers=5)
    try:
        seen = asyncio.run_coroutine_threadsafe(
            _attacks.victim_under_neighbours(box.sandbox, runs=40), box.loop
        ).result()
    finally:
        box.close()
    timeouts = [x for x in seen if x[0] != "ok"]
    assert not timeouts, f"{len(timeouts)} of {len(seen)} victim cells failed: {timeouts[:3]}"
