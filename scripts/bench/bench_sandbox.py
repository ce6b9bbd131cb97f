"""Sandbox latency and throughput, measured side by side with a `python -c` subprocess per call.

    python scripts/bench_sandbox.py [--n 300] [--gap-ms 5] [--docker auto|on|off]

Cases: (a) `print(1+1)`, (b) `import sympy; print(sympy.factorint(2**64+1))`. Each sandbox call is
a fresh session (`sandbox.run`): a new isolated interpreter every time. Latency is measured on
sequential calls `--gap-ms` apart (as code calls are spread between an LLM's turns; the gap lets
the sandbox prepare its next interpreter) for both the sandbox and the baseline; the same figures
back to back (gap 0, bound by throughput) are printed too. Throughput: 2*n concurrent calls.
A cell of one open session is timed too, with the part spent stopping the session after it.
Timing isolation: a victim session's `print(1)` cells alone and beside 4 noisy neighbour sessions
(each leaving `--neighbour-leftovers` processes per cell for the worker to kill): p50/p95,
`neighbour_p95_ratio`, and how many of the victim's 0.7 s cells under a 1 s limit time out
(`victim_timeouts`). Where the victim's cells waited (`<case>_<part>_tail_ms`: the slot, the
worker's resume and park answers, the cell itself, the host loop's lag, over the slowest 5%), and
the same victim beside neighbours that spin as long without leftovers (CPU contention alone) or
sleep (`--neighbour-modes`); `--only-neighbours` runs just this part.
Last line: RESULT trivial_speedup=.. sympy_speedup=.. trivial_calls_per_s=.. (+ more figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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


NOISY = "import os, time\nfor _ in range({n}):\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\n"
# the same neighbours without leftovers: as much CPU per cell, no process for the worker to kill
# (SPIN_MS is set to the noisy cells' measured duration), and cells that use no CPU at all
SPIN = "import time\nt = time.perf_counter() + {ms} / 1e3\nwhile time.perf_counter() < t:\n    pass\n"
IDLE = "import time; time.sleep(0.05)"


class Waits:
    """Where each victim cell's time goes, timed on the host around the client's requests: the
    wait for a worker slot, the worker's answer to "resume" (the cell's clock starts then), the
    cell itself (code + reply), the worker's answer to "park"; and the host event loop's lag (a
    1 ms sleeper's overshoot), which delays all of them."""

    KEYS = ("slot", "resume", "cell", "park", "loop_lag")

    def __init__(self) -> None:
        self.on = False
        self.cur: dict[str, float] = {}
        self.rows: list[dict[str, float]] = []
        self.lags: list[float] = []
        self.their_parks: list[float] = []  # the neighbours' parks: their host time beyond their cells

    @contextlib.contextmanager
    def hooks(self, victim: set):
        """Patch the client for cells of the sessions (task ids) in `victim`."""
        from sandbox import slots as slots_mod

        real_slot, real_resume, real_park = slots_mod.Slots.slot, WorkerClient.resume, WorkerClient.park
        waits = self

        def mine() -> bool:
            return waits.on and id(asyncio.current_task()) in victim

        @contextlib.asynccontextmanager
        async def slot(self_):
            t = time.perf_counter()
            async with real_slot(self_):
                if mine():
                    waits.cur["slot"] = time.perf_counter() - t
                yield

        def resume(self_, sid):
            fut = real_resume(self_, sid)
            if mine():
                t = time.perf_counter()
                fut.add_done_callback(lambda _f: waits.cur.__setitem__("resume", time.perf_counter() - t))
            return fut

        async def park(self_, sid, timeout):
            t = time.perf_counter()
            try:
                return await real_park(self_, sid, timeout)
            finally:
                if mine():
                    waits.cur["park"] = time.perf_counter() - t
                else:
                    waits.their_parks.append(time.perf_counter() - t)

        slots_mod.Slots.slot, WorkerClient.resume, WorkerClient.park = slot, resume, park
        try:
            yield
        finally:
            slots_mod.Slots.slot, WorkerClient.resume, WorkerClient.park = real_slot, real_resume, real_park

    def start_cell(self) -> None:
        self.cur = {}
        self.lag0 = len(self.lags)

    def end_cell(self, total: float) -> None:
        row = {k: self.cur.get(k, 0.0) for k in ("slot", "resume", "park")}
        row["cell"] = max(0.0, total - sum(row.values()))
        row["loop_lag"] = max(self.lags[self.lag0 :], default=0.0)
        row["total"] = total
        self.rows.append(row)

    async def probe(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            self.lags.append(max(0.0, time.perf_counter() - t - 0.001))

    def summary(self, label: str) -> dict[str, float]:
        """Each part's mean over the slowest 5% of cells (the p95 tail) and its p50 over all."""
        rows = sorted(self.rows, key=lambda r: r["total"])
        tail = rows[int(0.95 * len(rows)) - 1 :] or rows
        out = {}
        parts = []
        for k in self.KEYS:
            p50 = pct([r[k] for r in rows], 0.5) * 1e3
            tail_ms = sum(r[k] for r in tail) / len(tail) * 1e3
            out[f"{label}_{k}_tail_ms"] = tail_ms
            parts.append(f"{k} {p50:.2f}/{tail_ms:.2f}")
        print(f"  {label}: where the victim waited, p50 / mean of the slowest 5% (ms): " + ", ".join(parts))
        return out


async def victim_cells(sb, n: int, neighbours: int, noisy_code: str, waits: Waits | None = None):
    """Latency of a victim session's `print(1)` cells, and how many of its 0.7 s cells under a 1 s
    limit time out, while `neighbours` sessions each run `noisy_code` (e.g. NOISY: leave
    processes behind) at every cell. Returns (latencies, timeouts, the neighbours' cell times)."""
    stop, probe_stop = asyncio.Event(), asyncio.Event()
    waits = waits or Waits()
    theirs: list[float] = []

    async def noisy() -> None:
        async with sb.session() as s:
            while not stop.is_set():
                t = time.perf_counter()
                r = await s.run(noisy_code)
                theirs.append(time.perf_counter() - t)
                assert r.status == "ok", r

    async def victim() -> tuple[list[float], int]:
        lat, timeouts = [], 0
        async with sb.session() as s:
            await s.run("import time")
            waits.on = True
            for _ in range(n):
                waits.start_cell()
                t = time.perf_counter()
                r = await s.run("print(1)")
                lat.append(time.perf_counter() - t)
                waits.end_cell(lat[-1])
                assert r.status == "ok", r
            waits.on = False
            for _ in range(max(10, n // 5)):
                timeouts += (await s.run("import time; time.sleep(0.7)", timeout=1.0)).status != "ok"
        return lat, timeouts

    tasks = [asyncio.ensure_future(noisy()) for _ in range(neighbours)]
    probe = asyncio.ensure_future(waits.probe(probe_stop))
    try:
        if neighbours:
            await asyncio.sleep(1.0)
        task = asyncio.ensure_future(victim())
        with waits.hooks({id(task)}):
            lat, timeouts = await task
        return lat, timeouts, theirs
    finally:
        stop.set()
        probe_stop.set()
        await asyncio.gather(*tasks, probe, return_exceptions=True)


async def bench_neighbours(cfg: SandboxConfig, n: int, modes: list[str], leftovers: int = 60) -> dict:
    """The victim alone, beside noisy neighbours, and (`modes`) beside neighbours that use the same
    CPU without leaving processes ("spin") or sleep without leaving any ("idle"): what is left
    between "spin" and "noisy" is the host's handling of the leftovers."""
    out: dict[str, float] = {}
    async with make_sandbox(cfg) as sb:
        w_alone, w_noisy = Waits(), Waits()
        quiet, quiet_to, _ = await victim_cells(sb, n, 0, "", waits=w_alone)
        noisy, noisy_to, theirs = await victim_cells(sb, n, 4, NOISY.format(n=leftovers), waits=w_noisy)
        line("local victim cell, alone", quiet)
        out.update(w_alone.summary("alone"))
        line("local victim cell, 4 noisy neighbours", noisy)
        out.update(w_noisy.summary("noisy"))
        parks = w_noisy.their_parks or [0.0]
        print(
            f"  the neighbours' own cells: p50 {pct(theirs, 0.5) * 1e3:.1f} ms, max {max(theirs) * 1e3:.1f} ms "
            f"(n={len(theirs)}), of which stopping their session (killing {leftovers} leftovers): "
            f"p50 {pct(parks, 0.5) * 1e3:.1f} ms, max {max(parks) * 1e3:.1f} ms"
        )
        out["neighbour_park_p50_ms"] = pct(parks, 0.5) * 1e3
        out["neighbour_park_max_ms"] = max(parks) * 1e3
        print(f"victim 0.7 s cells under a 1 s limit timed out: {quiet_to} alone, {noisy_to} with neighbours")
        for mode in modes:
            code = SPIN.format(ms=round(pct(theirs, 0.5) * 1e3, 1)) if mode == "spin" else IDLE
            w = Waits()
            lat, _to, _ = await victim_cells(sb, n, 4, code, waits=w)
            line(f"local victim cell, 4 {mode} neighbours", lat)
            out.update(w.summary(mode))
            out[f"{mode}_neighbour_p95_ratio"] = pct(lat, 0.95) / pct(quiet, 0.95)
    out.update(
        {
            "victim_p50_ms": pct(quiet, 0.5) * 1e3,
            "victim_p95_ms": pct(quiet, 0.95) * 1e3,
            "victim_noisy_p50_ms": pct(noisy, 0.5) * 1e3,
            "victim_noisy_p95_ms": pct(noisy, 0.95) * 1e3,
            "neighbour_p95_ratio": pct(noisy, 0.95) / pct(quiet, 0.95),
            "victim_timeouts": noisy_to,
            "victim_timeouts_alone": quiet_to,
        }
    )
    return out


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
    ap.add_argument(
        "--neighbour-modes",
        default="spin,idle",
        help="also time the victim beside neighbours that spin as long as a noisy cell, or sleep, "
        "without leftovers (comma-separated; empty: none)",
    )
    ap.add_argument("--neighbour-leftovers", type=int, default=60, help="processes each neighbour cell leaves")
    ap.add_argument("--neighbour-workers", type=int, default=5, help="slots for the 4 neighbours + the victim")
    ap.add_argument("--only-neighbours", action="store_true", help="skip everything but the neighbour part")
    args = ap.parse_args()

    result: dict[str, float] = {}
    if not args.only_neighbours:
        gap = args.gap_ms / 1e3
        b_triv = baseline(TRIVIAL, args.baseline_n, gap)
        line("baseline python -c (a) trivial", b_triv)
        b_sym = baseline(SYMPY, max(5, args.baseline_n // 2), gap)
        line("baseline python -c (b) sympy", b_sym)
        local = asyncio.run(bench_backend(SandboxConfig(workers=args.workers), args.n, gap, "local"))
        result |= {
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
    modes = [m for m in args.neighbour_modes.split(",") if m]
    ncfg = SandboxConfig(workers=args.neighbour_workers)
    result.update(asyncio.run(bench_neighbours(ncfg, args.neighbour_n, modes, args.neighbour_leftovers)))
    dcfg = SandboxConfig(backend="docker", workers=args.workers)
    why = docker_ready(dcfg) if args.docker != "off" and not args.only_neighbours else "disabled"
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
