"""A new token-level method is one function and its settings dataclass, registered under one name: this
file adds one at run time (a throwaway name no other module knows), selects it with one config line and
trains a real tiny step with it (DeepSpeed learner, HF rollouts, local sandbox)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from stare_tir.algos.token_methods import TOKEN_METHODS, TokenEffect, TokenInputs
from stare_tir.app.pipeline import sft_stage
from stare_tir.config import ConfigError, load_config, to_dict
from stare_tir.model import resolve_model_path
from stare_tir.train_config import TrainConfig
from stare_tir.trainer import build_run, close_run, rl_step

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class DoubleLowProbConfig:
    # Weight on the selected tokens.
    scale: float = 2.0
    # A token is selected when its probability is below this.
    prob_below: float = 0.5


calls: list[float] = []


def double_low_prob(t: TokenInputs, cfg: DoubleLowProbConfig) -> TokenEffect:
    """Weight `scale` on tokens with pi < prob_below (a reweighting only)."""
    calls.append(cfg.scale)
    selected = t.logprobs < math.log(cfg.prob_below)
    return TokenEffect(selected=selected, weights=torch.where(selected, cfg.scale, 1.0).to(torch.float32))


def test_a_method_registered_at_run_time_is_a_preset_a_config_section_and_a_help_line():
    from stare_tir.app.cli import config_keys

    with TOKEN_METHODS.temporarily("double_low_prob", double_low_prob, config=DoubleLowProbConfig):
        cfg = load_config(TrainConfig, None, ["algo.token_methods=[double_low_prob]", "algo.double_low_prob.scale=3"])
        assert cfg.algo.methods["double_low_prob"] == DoubleLowProbConfig(scale=3.0)
        assert to_dict(cfg.algo)["double_low_prob"] == {"scale": 3.0, "prob_below": 0.5}
        preset = load_config(TrainConfig, None, ["algo.name=double_low_prob"]).algo
        assert preset.token_methods == ["double_low_prob"] and preset.dynamic_sampling and preset.clip_high == 0.28
        help_lines = "\n".join(config_keys(TrainConfig))
        assert "algo.double_low_prob.scale=3.0" not in help_lines  # defaults are shown, not this run's
        assert "algo.double_low_prob.scale=2.0  # Weight on the selected tokens." in help_lines
    with pytest.raises(ConfigError, match="unknown token method; choose one of"):
        load_config(TrainConfig, None, ["algo.token_methods=[double_low_prob]"])


@pytest.mark.slow
def test_a_method_registered_at_run_time_trains_a_tiny_step(tmp_path, tiny_run):
    tiny = ROOT / "configs" / "tiny_cpu.yaml"
    with TOKEN_METHODS.temporarily("double_low_prob", double_low_prob, config=DoubleLowProbConfig):
        cfg = load_config(
            TrainConfig,
            tiny,
            tiny_run("algo.name=grpo_ds", "algo.token_methods=[double_low_prob]", "algo.double_low_prob.scale=3"),
        )
        model, _ = sft_stage(cfg, resolve_model_path(cfg.model), tmp_path)
        run = build_run(cfg, model, tmp_path / "rl")
        seen: list = []
        train_step = run.learner.train_step

        def spy(trajs, advantages, token_weights=None, *args, **kwargs):
            seen.append(token_weights)
            return train_step(trajs, advantages, token_weights, *args, **kwargs)

        run.learner.train_step = spy
        before = next(run.learner.model.parameters()).detach().clone()
        try:
            for step in range(1, 4):  # a step may find no informative group; the next one will
                m = rl_step(run, step)
                if not m.get("update/skipped_empty"):
                    break
        finally:
            close_run(run)
    assert not m.get("update/skipped_empty"), "no informative group in 3 steps"
    assert calls and set(calls) == {3.0}  # called with the configured settings
    assert 0.0 < m["algo/double_low_prob/selected_frac"] <= 1.0
    weights = torch.cat(seen[-1])
    assert set(torch.unique(weights).tolist()) <= {1.0, 3.0} and (weights == 3.0).any()  # reached the loss
    assert m["update/synced"] == 1.0 and not torch.equal(before, next(run.learner.model.parameters()).detach())
