#!/usr/bin/env python
"""Time the embedded default end to end and report accuracy before and after RL.

Runs `scripts/train_tir.py` (configs/tiny_cpu.yaml, or --config) in a fresh run directory, as a
user would, then reads its summary.json. The last line is
    RESULT wall_s=<s> acc_sft=<a> acc_rl=<b> acc_gain=<b-a> best_acc=<c> best_step=<k>
           gate_first_step=<g> sft_s=<s> rl_s=<s>
(one line). acc_sft / acc_rl: held-out accuracy before / after RL; best_acc: the best held-out
accuracy of the run (before, periodic and final evaluations) and best_step its first step;
gate_first_step: the RL step at which the STARE gate first opened (none: it never did).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny_cpu.yaml"), help="YAML config to run")
    parser.add_argument("--run-dir", default="runs/bench_train", help="run directory (wiped first)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="extra dotted config overrides")
    args = parser.parse_args()

    run_dir = Path(args.run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "train_tir.py"),
        "--config",
        args.config,
        f"trainer.run_dir={run_dir}",
        "sft.reuse=false",  # time the whole pipeline: never borrow a sibling run's SFT
        *args.overrides,
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    s = json.loads((run_dir / "summary.json").read_text())
    a, b = s["acc_before_rl"], s["acc_after_rl"]
    secs = s["seconds"]
    print("phases: " + ", ".join(f"{k}={v:.1f}s" for k, v in secs.items()))
    best, best_step, gate = s.get("best_acc"), s.get("best_acc_step"), s.get("gate_first_step")
    print(
        f"held-out accuracy: {a:.3f} after SFT -> {b:.3f} after RL ({b / max(a, 1e-9):.2f}x); "
        f"best {best:.3f} at step {best_step}; STARE gate first open at step {gate}"
    )
    print(
        f"RESULT wall_s={wall:.1f} acc_sft={a:.3f} acc_rl={b:.3f} acc_gain={b - a:+.3f} "
        f"best_acc={best:.3f} best_step={best_step} gate_first_step={'none' if gate is None else gate} "
        f"sft_s={secs.get('sft', 0.0):.1f} rl_s={secs.get('rl', 0.0):.1f}"
    )


if __name__ == "__main__":
    main()
