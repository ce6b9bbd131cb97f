#!/usr/bin/env python
"""This tree's RL step against another commit's, side by side on the same config and machine.

Checks the reference commit (--ref, e.g. the last release) out beside this tree (a detached git
worktree in a temporary directory), then runs `scripts/train_tir.py` from each tree in turn,
A B A B ... (--pairs), on the same config, seed and SFT model (--sft-output: made once by the
first run, reused by the others, so no run pays for SFT), each in a fresh run directory. Both
trees run in this interpreter's environment, each with its own source first on PYTHONPATH.
From every run's metrics.jsonl it takes the RL steps after the first (--skip: warm-up) and
reports per tree the median `time/step`, each phase's median (`time/<phase>`), the generated
tokens per step, and the peak RSS of the run (the child's ru_maxrss).

Last line:
    RESULT step_ratio=<this / ref, median step> rollout_ratio=... update_ratio=...
           tokens_ratio=<this / ref, response tokens per step> rss_ratio=... load=<1-min load>

Example (the real model; ~6 min a run on 2 cores):
    python scripts/bench/bench_step_vs_ref.py --ref v0.9 --config configs/smollm2_cpu.yaml \
        --sft-output /tmp/sft_smollm2 trainer.steps=5 data.arithmetic_eval_size=4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_once(tree: Path, config: str, run_dir: Path, sft_output: str, overrides: list[str]) -> tuple[list[dict], float]:
    """One training run from `tree`; its RL step rows and the child's peak RSS in GB."""
    shutil.rmtree(run_dir, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [
        sys.executable,
        str(tree / "scripts" / "train_tir.py"),
        "--config",
        str(tree / config),
        f"trainer.run_dir={run_dir}",
        f"sft.output={sft_output}",
        *overrides,
    ]
    log = run_dir.parent / f"{run_dir.name}.log"
    with open(log, "w") as out:  # os.wait4: this child's own rusage (peak RSS, CPU seconds)
        proc = subprocess.Popen(cmd, env=env, cwd=tree, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    rc = proc.returncode
    if rc != 0:
        sys.exit(f"run from {tree} failed (rc {rc}); its output: {log}\n{log.read_text()[-4000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r.get("step", 0) >= 1 and "time/step" in r]
    return steps, usage.ru_maxrss / 1e6  # kB on Linux


def summarize(rows: list[dict]) -> dict[str, float]:
    """Medians over steps of every time/* key and of the response tokens per step."""
    keys = sorted({k for r in rows for k in r if k.startswith("time/")})
    out = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys}
    out["tokens"] = statistics.median(
        r.get("throughput/rollout_tokens_per_s", 0.0) * (r.get("time/rollout", 0.0) + r.get("async/round_s", 0.0))
        for r in rows
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", required=True, help="git commit (or tag/branch) to compare this tree against")
    parser.add_argument("--config", default="configs/smollm2_cpu.yaml", help="config path, relative to each tree")
    parser.add_argument("--sft-output", required=True, help="SFT model directory shared by every run (made once)")
    parser.add_argument("--pairs", type=int, default=2, help="A B pairs to run (alternating)")
    parser.add_argument("--skip", type=int, default=1, help="first RL steps of each run not counted (warm-up)")
    parser.add_argument("--work", default=None, help="directory for run dirs (default: a temporary one)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides for both trees")
    args = parser.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="bench_step_vs_ref_"))
    ref_tree = work / "ref"
    if not ref_tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(ref_tree), args.ref], check=True)
    trees = {"this": ROOT, "ref": ref_tree}
    rows: dict[str, list[dict]] = {"this": [], "ref": []}
    rss: dict[str, float] = {"this": 0.0, "ref": 0.0}
    try:
        for pair in range(args.pairs):
            order = ("ref", "this") if pair % 2 == 0 else ("this", "ref")  # the SFT model is made by ref's first run
            for name in order:
                t0 = time.perf_counter()
                steps, peak = run_once(
                    trees[name], args.config, work / f"{name}_{pair}", args.sft_output, args.overrides
                )
                rows[name] += [r for r in steps if r["step"] > args.skip]
                rss[name] = max(rss[name], peak)
                print(f"pair {pair} {name}: {len(steps)} steps, {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref_tree)], check=False)
    med = {name: summarize(r) for name, r in rows.items()}
    keys = sorted(set(med["this"]) | set(med["ref"]))
    print(f"{'median over steps':<28}{'ref':>10}{'this':>10}{'this/ref':>10}")
    for k in keys:
        a, b = med["ref"].get(k, 0.0), med["this"].get(k, 0.0)
        print(f"{k:<28}{a:>10.2f}{b:>10.2f}{(b / a if a else float('nan')):>10.2f}")
    print(f"{'peak RSS (GB)':<28}{rss['ref']:>10.2f}{rss['this']:>10.2f}")

    def ratio(key: str) -> float:
        a = med["ref"].get(key, 0.0)
        return med["this"].get(key, 0.0) / a if a else float("nan")

    load = os.getloadavg()[0]
    print(
        f"RESULT step_ratio={ratio('time/step'):.3f} rollout_ratio={ratio('time/rollout'):.3f} "
        f"update_ratio={ratio('time/update'):.3f} tokens_ratio={ratio('tokens'):.3f} "
        f"rss_ratio={rss['this'] / rss['ref'] if rss['ref'] else float('nan'):.3f} load={load:.2f}"
    )


if __name__ == "__main__":
    main()
