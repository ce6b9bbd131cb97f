"""The whole job behind `scripts/train_tir.py`: cold-start SFT -> RL -> evaluation -> summary.

Each stage leaves its output in the run directory, so a rerun (or `--resume`) skips what is done:
  <run_dir>/config.yaml          the resolved config
  <run_dir>/sft/traces.jsonl     cold-start traces (the synthetic task's are made by the sandbox)
  <run_dir>/sft/model/           SFT checkpoint (HF format), the RL stage's starting point
  <run_dir>/checkpoints/         RL checkpoints (DeepSpeed: model, optimizer, scheduler, state)
  <run_dir>/hf/step_NNNNNN/      intermediate HF exports (trainer.save_hf_every)
  <run_dir>/train.log            log of rank 0 (other ranks: train.rank<N>.log), lines rank-tagged
  <run_dir>/metrics.jsonl        one row per RL step (+ evaluation rows)
  <run_dir>/final/               final policy (HF format)
  <run_dir>/plots/curves.png     reward/accuracy, entropy with target band, gate, tools, length
  <run_dir>/summary.json         before/after accuracy, entropy, tool use, seconds per phase
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from loguru import logger

from envs.arithmetic import amake_sft_traces, make_problems
from sandbox import make_sandbox
from stare_tir.components import load_tokenizer, resolve_model_path
from stare_tir.config import save_config
from stare_tir.preflight import (
    StartupError,
    check_backend,
    check_data,
    check_model,
    check_registry_names,
    check_sandbox,
)
from stare_tir.sft import run_sft
from stare_tir.tracking import first_gate_step, plot_runs, read_metrics, setup_run_logging
from stare_tir.train_config import TrainConfig
from stare_tir.trainer import train_rl


def make_synthetic_traces(cfg: TrainConfig, out_path: Path) -> list[dict]:
    """Cold-start traces of the arithmetic task, their code run in a real sandbox session."""
    problems = make_problems(cfg.sft.num_traces, seed=cfg.data.seed + 1, split="train")

    async def go() -> list[dict]:
        async with make_sandbox(cfg.sandbox) as sandbox:
            return await amake_sft_traces(
                problems, sandbox, tool_fraction=cfg.sft.tool_fraction, seed=cfg.data.seed, cfg=cfg.env
            )

    traces = asyncio.run(go())
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("".join(json.dumps(t) + "\n" for t in traces))
    logger.info(
        f"sft: wrote {len(traces)} traces ({sum(t['uses_tool'] for t in traces)} with a tool call) to {out_path}"
    )
    return traces


def sft_output(cfg: TrainConfig) -> Path:
    """Where the SFT checkpoint goes: sft.output, or <trainer.run_dir>/sft/model."""
    return Path(cfg.sft.output) if cfg.sft.output else Path(cfg.trainer.run_dir) / "sft" / "model"


def check_sft_traces(cfg: TrainConfig) -> None:
    if cfg.sft.enabled and cfg.sft.traces != "arithmetic" and not Path(cfg.sft.traces).is_file():
        raise StartupError(
            f"sft.traces={cfg.sft.traces!r}: no such JSONL file (use 'arithmetic' for the "
            'synthetic task, or a path to {"messages": [...]} rows)'
        )


def preflight(cfg: TrainConfig) -> None:
    """Every check that can fail cheaply, before any model is loaded (see stare_tir.preflight)."""
    check_model(cfg.model)
    check_registry_names(cfg.algo.advantage, cfg.algo.loss_name)
    check_backend(cfg.trainer.backend, cfg.rollout.sglang.urls)
    check_sft_traces(cfg)
    check_data(cfg.data)
    info = check_sandbox(cfg.sandbox)
    logger.info(
        f"preflight: model, data and sandbox ({cfg.sandbox.backend}{', rootless' if info.get('rootless') else ''}) ok"
    )


def sft_stage(cfg: TrainConfig, base_model: str, run_dir: Path) -> tuple[str, dict]:
    """Cold-start SFT (skipped when its checkpoint exists); returns (model path, summary)."""
    out = sft_output(cfg)
    if (out / "config.json").is_file():
        logger.info(f"sft: reusing {out}")
        return str(out), {"reused": True}
    check_sft_traces(cfg)
    if cfg.sft.traces == "arithmetic":
        data: list[dict] | Path = make_synthetic_traces(cfg, run_dir / "sft" / "traces.jsonl")
    else:
        data = Path(cfg.sft.traces)
    # The policy's tokenizer (model.tokenizer, model.chat_template) is saved with the checkpoint.
    summary = run_sft(
        cfg.sft.train,
        base_model,
        data,
        out,
        tokenizer=load_tokenizer(cfg.model, base_model),
        trust_remote_code=cfg.model.trust_remote_code,
    )
    return str(out), summary


def run_pipeline(cfg: TrainConfig, resume: bool = False) -> dict[str, Any]:
    """SFT -> RL -> summary table and plots."""
    run_dir = Path(cfg.trainer.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    setup_run_logging(run_dir)
    preflight(cfg)
    times: dict[str, float] = {}

    t0 = time.perf_counter()
    model_path = resolve_model_path(cfg.model)
    times["build_model"] = time.perf_counter() - t0

    sft_summary: dict | None = None
    if cfg.sft.enabled:
        t0 = time.perf_counter()
        model_path, sft_summary = sft_stage(cfg, model_path, run_dir)
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
