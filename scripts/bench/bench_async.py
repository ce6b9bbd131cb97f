#!/usr/bin/env python
"""Asynchronous RL side by side: the same short training at eta=0 and eta=1, in one process tree.

The rollout backend is the SGLang stand-in (tests/rollout/sglang_standin.py, a subprocess speaking
SGLang's HTTP API, with its pause/continue and update-lock behaviour) with a per-token delay chosen
so that generating a step's batch takes about as long as the learner's step (measured first, on
this machine, unless --token-delay-s is given). Runs, each from the tiny base model, `algo.name=grpo`
(every step updates), 4 PPO passes per batch, weights pushed over HTTP (tensor mode):

    calibrate  eta=0, 2 steps at 0.1 s/token (the delay dominates): the learner's and the rollout's
               seconds per step; the delay is scaled so that the rollout takes the learner's time
               (the rollout's fixed part, its own CPU work, makes it come out 1.2-1.5x longer here)
    eta0       the synchronous loop (`rl_step`, as `train_rl` runs eta=0), timed
    eta1       `AsyncRollouts(run, 1)`: the next batch generates while the learner trains, timed
               (eta0 and eta1 alternate, --repeats pairs: a machine shared with other jobs does not
               favour either side)
    layout     with --pin (and 2+ cores) the learner's thread runs on the first core and everything
               else (stand-in, producer thread, sandboxes, grading) on the others, as in the
               disaggregated layout, where the two sides do not share devices; both arms alike
    ref        the synchronous loop again, now with the stand-in deterministic (seeds honoured,
               log-probs batch-invariant, as --enable-deterministic-inference)
    lockstep   the asynchronous machinery with eta=0 (`AsyncRollouts(run, 0)`), deterministic: must
               give ref's metrics bit for bit (timing keys aside), which is what eta0_identical says

The last line is
    RESULT speedup_eta1=<eta0 wall / eta1 wall> max_lag=<largest async/lag_max at eta=1>
           eta0_identical=<1|0> gen_s=<rollout s/step at eta0> learn_s=<learner s/step at eta0>
           token_delay_s=<s> steps=<n> learner_threads=<n> pinned=<1|0>
Done when speedup_eta1 >= 1.4, max_lag <= 1 and eta0_identical=1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "rollout"))

SKIP = ("time/", "throughput/", "engine/", "grade/seconds")  # wall-clock keys differ run to run
PHASES = ("time/step", "time/rollout", "time/recompute", "time/update", "time/sync")


def config(url: str, run_dir: Path, steps: int, overrides: list[str]):
    from stare_tir.config import load_config
    from stare_tir.train_config import TrainConfig

    return load_config(
        TrainConfig,
        ROOT / "configs" / "tiny_cpu.yaml",
        [
            "model.path=tiny",
            "sft.enabled=false",
            "algo.name=grpo",
            "trainer.backend=sglang",
            f"rollout.sglang.urls={json.dumps([url])}",
            "rollout.sglang.weight_sync=tensor",
            "rollout.sglang.send_seed=true",
            "rollout.progress=false",
            "data.arithmetic_train_size=512",
            "data.arithmetic_eval_size=2",
            "trainer.prompts_per_step=8",
            "rollout.n_per_prompt=4",
            "rollout.max_total_tokens=64",
            "rollout.max_new_tokens_per_turn=32",
            "trainer.eval_every=0",
            f"trainer.steps={steps}",
            f"trainer.run_dir={run_dir}",
            "learner.zero_stage=0",
            # Four passes over each batch: the tiny model's single update is short next to the
            # stand-in's own CPU work per rollout on a 2-core machine; four make a learner step about
            # as long as a batch's generation, the setting this bench is about. Both runs use them.
            "algo.ppo_epochs=4",
            *overrides,
        ],
    )


def pin(cores: set[int] | None) -> None:
    """Run the calling thread (and what it starts from now on) on `cores`; None leaves it as is."""
    if cores:
        os.sched_setaffinity(0, cores)  # Linux: pid 0 is the calling thread


def train(cfg, eta: int | None, layout: tuple[set[int], set[int]] | None = None) -> tuple[list[dict], float]:
    """`cfg.trainer.steps` RL steps in this process: (metrics rows, wall seconds of the steps).
    `layout` (learner cores, rollout cores): everything is built on the rollout cores (the engine's
    thread, sandboxes, grading), then this thread learns on the learner cores."""
    learner_cores, rollout_cores = layout or (None, None)
    from stare_tir.model import resolve_model_path
    from stare_tir.trainer import build_run, close_run, rl_step, sync_weights
    from stare_tir.trainer.async_rollouts import AsyncRollouts

    run = build_run(cfg, resolve_model_path(cfg.model), Path(cfg.trainer.run_dir))
    try:
        sync_weights(run)  # the server serves the learner's start weights (version 0)
        rollouts = AsyncRollouts(run, eta) if eta is not None else None
        rows = []
        pin(learner_cores)
        t0 = time.perf_counter()
        for step in range(1, cfg.trainer.steps + 1):
            rows.append(rl_step(run, step, rollouts))
            run.step = step
        return rows, time.perf_counter() - t0
    finally:
        pin(rollout_cores)
        close_run(run)


def learner_s(rows: list[dict]) -> float:
    return sum(r["time/recompute"] + r["time/update"] + r["time/sync"] for r in rows) / len(rows)


def same(a: list[dict], b: list[dict]) -> tuple[bool, str]:
    """Every metric of `a` (timing keys aside) equal in `b`, step by step."""
    for step, (ra, rb) in enumerate(zip(a, b), start=1):
        for key, va in ra.items():
            if key.startswith(SKIP):
                continue
            vb = rb.get(key)
            both_nan = isinstance(va, float) and isinstance(vb, float) and math.isnan(va) and math.isnan(vb)
            if va != vb and not both_nan:
                return False, f"step {step} {key}: {va!r} != {vb!r}"
    return len(a) == len(b), ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12, help="timed RL steps per run (default: 12)")
    p.add_argument("--repeats", type=int, default=2, help="eta0/eta1 run pairs, alternated (default: 2)")
    p.add_argument("--identity-steps", type=int, default=3, help="steps of the eta0/lockstep pair (default: 3)")
    p.add_argument("--token-delay-s", type=float, default=None, help="stand-in seconds per token (default: calibrated)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the stand-in (default: 1)")
    p.add_argument(
        "--learner-threads",
        type=int,
        default=1,
        help="torch threads of the learner, both arms (default: 1: one core learns, the other serves the "
        "stand-in, sandboxes and grading, as a GPU learner leaves the CPUs to the rollout side)",
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="extra dotted config overrides")
    p.add_argument(
        "--pin",
        action="store_true",
        help="split the cores (2+): the learner's thread gets the first, the rest (stand-in, producer "
        "thread, sandboxes, grading) the others, as the disaggregated layout splits devices",
    )
    args = p.parse_args()

    cores = sorted(os.sched_getaffinity(0))
    layout = None if not args.pin or len(cores) < 2 else ({cores[0]}, set(cores[1:]))
    pin(layout and layout[1])  # before torch starts threads and the stand-in starts: all rollout side

    import torch
    from sglang_standin import launch_standin

    from stare_tir.model import pretrained_tiny_base
    from stare_tir.rollout.backends._http import request_sync

    torch.set_num_threads(args.learner_threads)
    torch.manual_seed(0)
    proc, url = launch_standin(str(pretrained_tiny_base()), extra_args=["--threads", str(args.threads)])
    work = Path(tempfile.mkdtemp(prefix="bench_async_"))

    def stand_in(**settings) -> None:
        request_sync("POST", url + "/standin_fault", settings)

    try:
        delay = args.token_delay_s
        if delay is None:  # with the delay dominating, rollout seconds scale with it: match the learner's
            probe = 0.1
            stand_in(token_delay_s=probe, deterministic=False)
            rows, _ = train(config(url, work / "calibrate", 2, args.overrides), None, layout)
            gen, learn = rows[-1]["time/rollout"], learner_s(rows[-1:])
            delay = probe * learn / gen
            print(f"calibration: rollout {gen:.2f} s/step at {probe} s/token, learner {learn:.2f} s/step")
        stand_in(token_delay_s=delay, deterministic=False)
        # Alternated, so that a change in what else the machine runs does not favour one side.
        sync_rows, async_rows, sync_wall, async_wall = [], [], 0.0, 0.0
        for rep in range(args.repeats):
            rows, wall = train(config(url, work / f"eta0_{rep}", args.steps, args.overrides), None, layout)
            sync_rows, sync_wall = sync_rows + rows, sync_wall + wall
            rows, wall = train(config(url, work / f"eta1_{rep}", args.steps, args.overrides), 1, layout)
            async_rows, async_wall = async_rows + rows, async_wall + wall
        # The identity pair: seeds honoured and log-probs batch-invariant (the timed runs skip that cost).
        stand_in(deterministic=True)
        ref_rows, _ = train(config(url, work / "ref", args.identity_steps, args.overrides), None)
        lock_rows, _ = train(config(url, work / "lockstep", args.identity_steps, args.overrides), 0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)

    identical, why = same(ref_rows, lock_rows)
    gen_s = sum(r["time/rollout"] for r in sync_rows) / len(sync_rows)
    max_lag = max(r["async/lag_max"] for r in async_rows)
    for name, rows, wall in (("eta0", sync_rows, sync_wall), ("eta1", async_rows, async_wall)):
        phases = ", ".join(f"{k[5:]} {sum(r[k] for r in rows) / len(rows):.2f}" for k in PHASES)
        print(f"{name}: {wall:.1f} s for {len(rows)} steps ({args.repeats} runs); mean s/step: {phases}")
    print(
        "eta1 per step: lag " + ", ".join(f"{r['async/lag_max']:.0f}" for r in async_rows)
        + "; learner idle " + ", ".join(f"{r['async/learner_idle_s']:.2f}" for r in async_rows)
    )  # fmt: skip
    if not identical:
        print(f"eta0 vs lockstep differ: {why}")
    print(
        f"RESULT speedup_eta1={sync_wall / async_wall:.2f} max_lag={max_lag:.0f} eta0_identical={int(identical)} "
        f"gen_s={gen_s:.2f} learn_s={learner_s(sync_rows):.2f} token_delay_s={delay:.4f} "
        f"steps={args.steps}x{args.repeats} learner_threads={args.learner_threads} pinned={int(layout is not None)}"
    )


if __name__ == "__main__":
    main()
