"""Each 7B config reproduces its authors' recipe where one was read (mini-batches, selection scope,
aggregation, clips, overlong handling, optimizer schedule) and cites the script in its header."""

from __future__ import annotations

from pathlib import Path

import pytest

from stare_tir.config import load_config
from stare_tir.train_config import TrainConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# method: (optimizer steps per step, scope, loss_agg, dual clip, filter_overlong, overlong penalty,
#          warm-up steps, weight decay, cited script)
RECIPES = {
    "kl_cov": (8, "verl", "verl", 10.0, False, False, 0, 0.0, "recipe/entropy/7b_kl_cov.sh"),
    "clip_cov": (8, "verl", "verl", None, False, False, 0, 0.0, "recipe/entropy/7b_clip_cov.sh"),
    "dapo": (16, "batch", "verl", 10.0, False, True, 10, 0.1, "recipe/dapo/run_dapo_qwen2.5_32b.sh"),
    "entropy_80_20": (16, "verl", "verl", 10.0, False, True, 10, 0.1, "Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR@"),
    "steer": (16, "micro_batch", "token-mean", 10.0, False, False, 0, 0.01, "zz-haooo/STEER@"),
    "justrl": (4, "batch", "verl", 10.0, False, False, 10, 0.1, "thunlp/JustRL@"),
    "stare_official": (1, "verl", "verl", 10.0, False, False, 0, 0.01, "hp-luo/STARE@"),
}


@pytest.mark.parametrize("method", list(RECIPES))
def test_config_follows_its_authors_recipe(method):
    path = CONFIGS / f"retool_qwen2.5_7b_{method}.yaml"
    cfg = load_config(TrainConfig, path)
    a = cfg.algo
    steps, scope, agg, dual, filt, penalty, warmup, wd, cited = RECIPES[method]
    assert a.mini_batches(cfg.trainer.prompts_per_step) == steps
    assert (a.scope, a.loss_agg, a.dual_clip_c) == (scope, agg, dual)
    assert (a.filter_overlong, a.overlong_penalty.enabled) == (filt, penalty)
    assert (cfg.learner.warmup_steps, cfg.learner.weight_decay) == (warmup, wd)
    header = path.read_text().split("\nbase:")[0]
    assert cited in header and "@" in header


def test_justrl_keeps_all_equal_groups_and_has_no_kl_or_length_shaping():
    a = load_config(TrainConfig, CONFIGS / "retool_qwen2.5_7b_justrl.yaml").algo
    assert a.name == "justrl" and not a.dynamic_sampling and a.token_methods == []
    assert (a.clip_low, a.clip_high) == (0.2, 0.28) and a.policy_loss == "clip"
