"""algo.name = steer, justrl and eapo each train 2 real tiny steps on CPU (SFT'd tiny model, HF rollouts,
local sandbox, DeepSpeed learner), justrl with its 4 mini-batches per step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from stare_tir.app.pipeline import sft_stage
from stare_tir.config import load_config
from stare_tir.model import resolve_model_path
from stare_tir.train_config import TrainConfig
from stare_tir.trainer import build_run, close_run, rl_step

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory, tiny_run):
    cfg = load_config(TrainConfig, ROOT / "configs" / "tiny_cpu.yaml", tiny_run())
    model, _ = sft_stage(cfg, resolve_model_path(cfg.model), tmp_path_factory.mktemp("sft"))
    return model


CASES = {
    "steer": [],
    "justrl": ["algo.dual_clip_c=10.0", "algo.ppo_mini_batch_size=1"],  # 4 prompts: 4 mini-batches
    "eapo": [],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_trains_two_tiny_steps(sft_model, tmp_path, name, tiny_run):
    cfg = load_config(TrainConfig, ROOT / "configs" / "tiny_cpu.yaml", tiny_run(f"algo.name={name}", *CASES[name]))
    run = build_run(cfg, sft_model, tmp_path / "rl")
    rows = []
    try:
        for step in range(1, 3):
            rows.append(rl_step(run, step))
        h0 = run.methods.get("eapo").initial_entropy if name == "eapo" else None
    finally:
        close_run(run)
    trained = [m for m in rows if not m.get("update/skipped_empty")]
    assert trained, f"{name}: no step updated"
    for m in trained:
        assert math.isfinite(m["update/loss"]) and math.isfinite(m["update/grad_norm"])
        assert m["update/optimizer_steps"] == (4.0 if name == "justrl" else 1.0)
    if name == "eapo":  # its state: the first step's entropy
        assert h0 is not None and h0 == pytest.approx(rows[0]["entropy/batch"])
    if name == "steer":
        assert all(0.0 <= m["algo/steer/selected_frac"] <= 1.0 for m in trained)
    if name == "eapo" and not rows[0].get("update/skipped_empty"):
        assert rows[0]["algo/eapo/positive_weight"] == 1.0  # H_t = H_0 on the first step
    if name == "justrl":
        assert all(m["update/mini_batches"] == 4.0 for m in trained)
