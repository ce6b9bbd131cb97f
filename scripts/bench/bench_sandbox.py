"""Sandbox latency and throughput, measured side by side with a `python -c` subprocess per call.

    python scripts/bench_sandbox.py [--n 300] [--gap-ms 5] [--docker auto|on|off]

Cases: (a) `print(1+1)`, (b) `import sympy; print(sympy.factorint(2**64+1))`. Each sandbox call is
a fresh session (`sandbox.run`): a new isolated interpreter every time. Latency is measured on
sequential calls `--gap-ms` apart (as code calls are spread between an LLM's turns; the gap lets
the sandbox prepare its next interpreter) for both the sandbox and the baseline; the same figures
back to back (gap 0, bound by throughput) are printed too. Throughput: 2*n concurrent calls.
A cell of one open session is timed too, with the part spent stopping the session after it.
Timing isolation: a victim session's `print(1)` cells alone and beside 4 noisy neighbour sessions
(each leaving 60 processes per cell for the worker to kill): p50/p95, `neighbour_p95_ratio`, and
how many of the victim's 0.7 s cells under a 1 s limit time out (`victim_timeouts`).
Last line: RESULT trivial_speedup=.. sympy_speedup=.. trivial_calls_per_s=.. (+ more figures).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sandbox import SandboxConfig, make_sandbox  # noqa: E402
from sandbox.local._client import WorkerClient  # noqa: E402 - its park request is timed

TRIVIAL = "print(1+1)"
SYMPY = "import sympy; print(sympy.factorint(2**64+1))"
EXPECT = {TRIVIAL: "2\n", SYMPY: "{274177: 1, 67280421310721: 1}\n"}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def baseline(code: str, n: int, gap: float) -> list[float]:
    out = []
    for _ in range(n):
        time.sleep(gap)
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        out.append(time.perf_counter() - t)
        assert p.stdout == EXPECT[code], p
    return out


async def sequential(sb, code: str, n: int, gap: float = 0.0) -> list[float]:
    out = []
    for _ in range(n):
        await asyncio.sleep(gap)
        t = time.perf_counter()
        r = await sb.run(code)
        out.append(time.perf_counter() - t)
        assert r.status == "ok" and r.stdout == EXPECT[code], r
    return out


async def throughput(sb, code: str, n: int) -> float:
    t = time.perf_counter()
    results = await asyncio.gather(*(sb.run(code) for _ in range(n)))
    dt = time.perf_counter() - t
    bad = [r for r in results if r.status != "ok"]
    assert not bad, bad[:3]
    return n / dt


async def session_cells(sb, code: str, n: int) -> tuple[list[float], list[float]]:
    """Cells of one open session; also the part of each spent stopping the session after it (the
    worker's park: freeze or stop loop, leftover check), timed around the client's request."""
    out, parks = [], []
    real_park = WorkerClient.park

    async def timed_park(self, sid, timeout):
        t = time.perf_counter()
        try:
            return await real_park(self, sid, timeout)
        finally:
            parks.append(time.perf_counter() - t)

    WorkerClient.park = timed_park
    try:
        async with sb.session() as s:
            for _ in range(n):
                t = time.perf_counter()
                r = await s.run(code)
                out.append(time.perf_counter() - t)
                assert r.status == "ok", r
    finally:
        WorkerClient.park = real_park
    return out, parks


NOISY = "import os, time\nfor _ in range(60):\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\n"


async def victim_cells(sb, n: int, neighbours: int) -> tuple[list[float], int]:
    """Latency of a victim session's `print(1)` cells, and how many of its 0.7 s cells under a 1 s
    limit time out, while `neighbours` sessions each leave 60 processes behind at every cell."""
    stop = asyncio.Event()

    async def noisy() -> None:
        async with sb.session() as s:
            while not stop.is_set():
                await s.run(NOISY)

    tasks = [asyncio.ensure_future(noisy()) for _ in range(neighbours)]
    try:
        if neighbours:
            await asyncio.sleep(1.0)
        lat, timeouts = [], 0
        async with sb.session() as s:
            await s.run("import time")
            for _ in range(n):
                t = time.perf_counter()
                r = await s.run("print(1)")
                lat.append(time.perf_counter() - t)
                assert r.status == "ok", r
            for _ in range(max(10, n // 5)):
                timeouts += (await s.run("import time; time.sleep(0.7)", timeout=1.0)).status != "ok"
        return lat, timeouts
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def bench_neighbours(cfg: SandboxConfig, n: int) -> dict:
    async with make_sandbox(cfg) as sb:
        quiet, quiet_to = await victim_cells(sb, n, 0)
        noisy, noisy_to = await victim_cells(sb, n, 4)
    line("local victim cell, alone", quiet)
    line("local victim cell, 4 noisy neighbours", noisy)
    print(f"victim 0.7 s cells under a 1 s limit timed out: {quiet_to} alone, {noisy_to} with neighbours")
    return {
        "victim_p50_ms": pct(quiet, 0.5) * 1e3,
        "victim_p95_ms": pct(quiet, 0.95) * 1e3,
        "victim_noisy_p50_ms": pct(noisy, 0.5) * 1e3,
        "victim_noisy_p95_ms": pct(noisy, 0.95) * 1e3,
        "neighbour_p95_ratio": pct(noisy, 0.95) / pct(quiet, 0.95),
        "victim_timeouts": noisy_to,
        "victim_timeouts_alone": quiet_to,
    }


def line(name: str, xs: list[float]) -> None:
    print(f"{name:<40} p50 {pct(xs, 0.5) * 1e3:8.2f} ms  p99 {pct(xs, 0.99) * 1e3:8.2f} ms  (n={len(xs)})")


async def bench_backend(cfg: SandboxConfig, n: int, gap: float, label: str) -> dict:
    async with make_sandbox(cfg) as sb:
        await sequential(sb, TRIVIAL, 5)  # warm
        triv = await sequential(sb, TRIVIAL, n, gap)
        line(f"{label} (a) trivial", triv)
        sym = await sequential(sb, SYMPY, max(10, n // 5), gap)
        line(f"{label} (b) sympy", sym)
        b2b = await sequential(sb, TRIVIAL, n)
        line(f"{label} (a) trivial, back to back", b2b)
        cells, parks = await session_cells(sb, TRIVIAL, n)
        line(f"{label} (a) as a cell of one open session", cells)
        line(f"{label}   of which stopping the session after it", parks)
        cps = await throughput(sb, TRIVIAL, 2 * n)
        print(f"{label}: {cfg.workers} workers, {2 * n} concurrent trivial calls: {cps:.1f} calls/s")
    return {
        "triv": pct(triv, 0.5),
        "sym": pct(sym, 0.5),
        "cps": cps,
        "cell": pct(cells, 0.5),
        "park": pct(parks, 0.5),
        "b2b": pct(b2b, 0.5),
    }


def docker_ready(cfg: SandboxConfig) -> str:
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        client.images.get(cfg.docker.image)
        return ""
    except Exception as e:  # noqa: BLE001 - any failure means "no engine here"
        return f"{type(e).__name__}: {e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300, help="sequential calls per case (sympy: n/5)")
    ap.add_argument("--baseline-n", type=int, default=20)
    ap.add_argument("--gap-ms", type=float, default=5.0, help="pause between sequential calls")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--docker", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--neighbour-n", type=int, default=100, help="victim cells with and without neighbours")
    args = ap.parse_args()

    gap = args.gap_ms / 1e3
    b_triv = baseline(TRIVIAL, args.baseline_n, gap)
    line("baseline python -c (a) trivial", b_triv)
    b_sym = baseline(SYMPY, max(5, args.baseline_n // 2), gap)
    line("baseline python -c (b) sympy", b_sym)
    local = asyncio.run(bench_backend(SandboxConfig(workers=args.workers), args.n, gap, "local"))
    result = {
        "trivial_speedup": pct(b_triv, 0.5) / local["triv"],
        "sympy_speedup": pct(b_sym, 0.5) / local["sym"],
        "trivial_calls_per_s": local["cps"],
        "trivial_speedup_back_to_back": pct(b_triv, 0.5) / local["b2b"],
        "local_trivial_p50_ms": local["triv"] * 1e3,
        "local_cell_p50_ms": local["cell"] * 1e3,
        "local_park_p50_ms": local["park"] * 1e3,
        "baseline_trivial_p50_ms": pct(b_triv, 0.5) * 1e3,
    }
    # 4 neighbours + the victim: each holds a worker slot of its own, as trajectories do
    result.update(asyncio.run(bench_neighbours(SandboxConfig(workers=5), args.neighbour_n)))
    dcfg = SandboxConfig(backend="docker", workers=args.workers)
    why = docker_ready(dcfg) if args.docker != "off" else "disabled"
    if not why:
        dock = asyncio.run(bench_backend(dcfg, max(20, args.n // 5), gap, "docker"))
        result.update(
            docker_trivial_speedup=pct(b_triv, 0.5) / dock["triv"],
            docker_sympy_speedup=pct(b_sym, 0.5) / dock["sym"],
            docker_calls_per_s=dock["cps"],
            docker_trivial_p50_ms=dock["triv"] * 1e3,
        )
    elif args.docker == "on":
        sys.exit(f"docker requested but unavailable: {why}")
    else:
        print(f"docker: skipped ({why})")
    print("RESULT " + " ".join(f"{k}={v:.2f}" for k, v in result.items()))


if __name__ == "__main__":
    main()
