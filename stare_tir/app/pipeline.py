"""The whole job behind `scripts/train_tir.py`: cold-start SFT -> RL -> evaluation -> summary.

The run directory belongs to this run (`stare_tir.app.run_dir`): a new run refuses one that holds
another run unless told to `--overwrite` it, and `--resume` continues the run that is there.
Start-up checks run before anything is written; then:
  <run_dir>/config.yaml          the resolved config (written once the start-up checks passed)
  <run_dir>/sft/traces.jsonl     cold-start traces (the synthetic task's are made by the sandbox)
  <run_dir>/sft/model/           SFT checkpoint (HF format), the RL stage's starting point; reused
                                 from this or a sibling run directory when made from the same
                                 inputs (`stare_tir.sft.stage`)
  <run_dir>/checkpoints/         RL checkpoints (DeepSpeed: model, optimizer, scheduler, state)
  <run_dir>/hf/step_NNNNNN/      intermediate HF exports (trainer.save_hf_every)
  <run_dir>/train.log            log of rank 0 (other ranks: train.rank<N>.log), lines rank-tagged
  <run_dir>/metrics.jsonl        one row per RL step (+ evaluation rows); keys: docs/metrics.md
  <run_dir>/final/               final policy (HF format)
  <run_dir>/plots/curves.png     reward/accuracy, entropy with target band, gate, tools, length
  <run_dir>/summary.json         before/after accuracy, entropy, tool use, seconds per phase
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from loguru import logger

from stare_tir.app.preflight import (
    check_backend,
    check_data,
    check_model,
    check_router,
    check_sandbox,
    check_sync_dir,
    check_trackers,
    gpu_recipe_without_gpu,
)
from stare_tir.app.run_dir import check_run_dir, clear_run_dir, run_markers
from stare_tir.config import save_config
from stare_tir.model import TINY_MODELS, resolve_model_path
from stare_tir.sft.stage import check_sft_traces, sft_stage
from stare_tir.tracking import first_gate_step, plot_runs, read_metrics, setup_run_logging
from stare_tir.train_config import TrainConfig


def preflight_problems(cfg: TrainConfig, found_before: int = 0) -> list[str]:
    """Every check that can fail cheaply, before any model is loaded (see stare_tir.app.preflight),
    each run even when an earlier one failed: one line per problem, all reported at once.
    found_before: problems found earlier (an unknown config key): the checks still run, but no
    "ok" is logged ahead of those errors."""
    from stare_tir.errors import StartupError

    problems: list[str] = []
    info: dict = {}

    def check(fn: Any, *a: Any) -> None:
        try:
            result = fn(*a)
        except StartupError as e:
            problems.append(str(e))
        else:
            if isinstance(result, dict) and fn is check_sandbox:
                info.update(result)

    check(check_model, cfg.model)
    check(check_trackers, cfg.trainer.tensorboard, cfg.trainer.wandb_project)
    check(check_backend, cfg.trainer.backend, cfg.rollout.sglang)
    if cfg.trainer.backend == "sglang" and not problems:  # both ask the servers check_backend found
        check(check_sync_dir, cfg.rollout.sglang)
        check(check_router, cfg.rollout.sglang)
    check(check_sandbox, cfg.sandbox)
    check(check_sft_traces, cfg)
    check(check_data, cfg.data)
    if (gpu_warning := gpu_recipe_without_gpu(cfg)) is not None:
        logger.warning(gpu_warning)
    if not cfg.sft.enabled and cfg.model.path not in TINY_MODELS and not Path(cfg.model.path).expanduser().exists():
        # The 7B configs ship model.path=Qwen/Qwen2.5-7B with SFT off: left as shipped, RL starts
        # on the base model, which the paper's recipe never does.
        logger.warning(
            f"sft.enabled=false and model.path={cfg.model.path!r} is a hub id, not a local SFT checkpoint: RL "
            "starts from that model as it is; set model.path to your SFT checkpoint, or sft.enabled=true"
        )
    if not problems and not found_before:
        logger.info(
            f"preflight: model, data and sandbox ({cfg.sandbox.backend}{', rootless' if info.get('rootless') else ''}) ok"
        )
    return problems


def preflight(cfg: TrainConfig, problems: list[str] | None = None) -> None:
    """Raise one StartupError listing `problems` (found earlier, e.g. bad config keys) and every
    problem the start-up checks find, one per line."""
    from stare_tir.errors import StartupError

    found = [*(problems or []), *preflight_problems(cfg, len(problems or []))]
    if found:
        raise StartupError("\n".join(found))


def start_run(
    cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False, problems: list[str] | None = None
) -> Path:
    """Claim the run directory: refuse a used one (unless resuming or overwriting), run the
    start-up checks (reporting `problems` found before with theirs), then clear an overwritten run
    (or what a failed start left) and write config.yaml. Rank 0 alone checks and writes the
    directory (the other ranks may start a moment later and would see rank 0's files)."""
    from stare_tir.errors import StartupError

    run_dir = Path(cfg.trainer.run_dir)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    problems = list(problems or [])
    if rank == 0:
        try:
            check_run_dir(run_dir, resume=resume, overwrite=overwrite)
        except StartupError as e:
            problems.append(str(e))
    preflight(cfg, problems)
    if rank == 0:
        if overwrite or (not resume and run_markers(run_dir)):  # what a failed start left, too
            gone = clear_run_dir(run_dir, world_size=world)
            if gone:
                logger.info(f"--overwrite: deleted {', '.join(gone)} of the previous run in {run_dir}")
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")
    setup_run_logging(run_dir, fresh=not resume)
    return run_dir


def run_pipeline(
    cfg: TrainConfig, resume: bool = False, overwrite: bool = False, problems: list[str] | None = None
) -> dict[str, Any]:
    """SFT -> RL -> summary table and plots."""
    run_dir = start_run(cfg, resume=resume, overwrite=overwrite, problems=problems)
    # The learner's stack (torch, DeepSpeed: seconds to import) only once the start-up checks passed.
    from stare_tir.trainer import train_rl
    from stare_tir.trainer.loop import Interrupted

    times: dict[str, float] = {}

    t0 = time.perf_counter()
    model_path = resolve_model_path(cfg.model)
    times["build_model"] = time.perf_counter() - t0

    sft_summary: dict | None = None
    if cfg.sft.enabled:
        t0 = time.perf_counter()
        try:
            model_path, sft_summary = sft_stage(cfg, model_path, run_dir, resume=resume)
        except KeyboardInterrupt:
            raise Interrupted(step=0, checkpoint_step=None, stage="sft") from None
        times["sft"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    rl = train_rl(cfg, model_path, run_dir, resume=resume)
    times["rl"] = time.perf_counter() - t0

    rows = read_metrics(run_dir)
    train_rows = [r for r in rows if "entropy/batch" in r]
    before = rl["eval_before"] or next((r for r in rows if r.get("step") == 0 and "eval/acc" in r), {})
    after = rl["eval_after"]
    plot = plot_runs([run_dir], run_dir / "plots" / "curves.png", band=0.05) if train_rows else None
    summary = {
        "run_dir": str(run_dir),
        "grader": cfg.env.grader,  # rewards and accuracies above were graded by this (env.grader)
        "acc_before_rl": before.get("eval/acc"),
        "acc_after_rl": after.get("eval/acc"),
        "tool_calls_before_rl": before.get("eval/tool_calls"),
        "tool_calls_after_rl": after.get("eval/tool_calls"),
        "entropy_first_step": train_rows[0]["entropy/batch"] if train_rows else None,
        "entropy_last_step": train_rows[-1]["entropy/batch"] if train_rows else None,
        "gate_on_fraction": (sum(r.get("stare/gate_on", 0.0) for r in train_rows) / len(train_rows))
        if train_rows
        else None,
        **run_milestones(rows),
        "steps": rl["steps"],
        "dropped": rl["dropped"],
        "sft": sft_summary,
        "seconds": times,
        "plot": str(plot) if plot else None,
        "final_model": str(run_dir / "final"),
    }
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 reports
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        print(format_summary(summary))
    return summary


def run_milestones(rows: list[dict]) -> dict[str, Any]:
    """When the STARE gate first opened, and the best held-out accuracy with its (first) step.

    Rows are metrics.jsonl rows; evaluation rows (step 0 before RL, periodic, final) hold eval/acc.
    """
    evals = [(r["step"], r["eval/acc"]) for r in rows if isinstance(r.get("eval/acc"), (int, float))]
    best = max(evals, key=lambda e: (e[1], -e[0])) if evals else (None, None)
    return {"gate_first_step": first_gate_step(rows), "best_acc": best[1], "best_acc_step": best[0]}


def format_summary(s: dict) -> str:
    def f(x: Any, fmt: str = "{:.3f}") -> str:
        return "-" if x is None else fmt.format(x)

    lines = [
        "",
        "                      before RL    after RL",
        f"held-out accuracy     {f(s['acc_before_rl']):>9}   {f(s['acc_after_rl']):>9}",
        f"tool calls / answer   {f(s['tool_calls_before_rl'], '{:.2f}'):>9}   {f(s['tool_calls_after_rl'], '{:.2f}'):>9}",
        f"policy entropy        {f(s['entropy_first_step']):>9}   {f(s['entropy_last_step']):>9}",
        f"best held-out accuracy {f(s.get('best_acc'))} at step {f(s.get('best_acc_step'), '{}')}",
        f"STARE gate on: {f(s['gate_on_fraction'], '{:.0%}')} of {s['steps']} steps, "
        f"first open at step {f(s.get('gate_first_step'), '{}')};  "
        f"seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in s["seconds"].items()),
        f"plots: {s['plot']}",
        f"final model: {s['final_model']}",
        "",
    ]
    return "\n".join(lines)
