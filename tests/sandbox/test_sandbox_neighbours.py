"""Timing isolation between sessions: noisy neighbours (cells that leave processes behind for the
worker to kill, every cell) never push another trajectory's cell into a timeout. A cell's limit
counts from when its code can run, and the worker steps each park between its other requests, so
one session's leftovers never delay another's resume. Both backends (the Docker worker parks by
the SIGSTOP/SIGKILL loop)."""

from __future__ import annotations

import asyncio
import time

# Leaves `n` sleeping processes behind at every cell (the worker kills them when it parks it)
NOISY = "import os, time\nfor _ in range({n}):\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\n"


async def victim_under_neighbours(sandbox, runs: int, neighbours: int = 4, leftovers: int = 24) -> list:
    """`runs` cells of 0.7 s under a 1 s limit in one session while `neighbours` sessions each
    leave `leftovers` processes per cell, as fast as they can."""
    stop = asyncio.Event()

    async def noisy() -> None:
        async with sandbox.session() as s:
            while not stop.is_set():
                await s.run(NOISY.format(n=leftovers))

    async def victim() -> list:
        out = []
        async with sandbox.session() as s:
            await s.run("import time")
            for _ in range(runs):
                t = time.monotonic()
                r = await s.run("import time; time.sleep(0.7)", timeout=1.0)
                out.append((r.status.value, time.monotonic() - t, r.error))
        return out

    tasks = [asyncio.ensure_future(noisy()) for _ in range(neighbours)]
    await asyncio.sleep(1.0)  # the neighbours are under way
    try:
        return await victim()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_noisy_neighbours_never_time_a_victim_out(make_box):
    from sandbox import Limits

    limits = Limits(wall_time_s=5.0, memory_mb=256, max_output_bytes=4096, disk_mb=16, max_processes=32)
    box = make_box("local", limits=limits, workers=5)
    try:
        seen = asyncio.run_coroutine_threadsafe(victim_under_neighbours(box.sandbox, runs=40), box.loop).result()
    finally:
        box.close()
    timeouts = [x for x in seen if x[0] != "ok"]
    assert not timeouts, f"{len(timeouts)} of {len(seen)} victim cells failed: {timeouts[:3]}"
