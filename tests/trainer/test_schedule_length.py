"""The RL run's lr schedule spans the run in the unit it counts: a decay counted in optimizer steps
ends at the run's last optimizer step, not after its first 1 / (mini-batches x epochs) RL steps."""

from __future__ import annotations

import math

from stare_tir.config import resolve_config
from stare_tir.learner.parts import lr_lambda
from stare_tir.train_config import TrainConfig
from stare_tir.trainer.run import schedule_length


def _cfg(*overrides: str) -> TrainConfig:
    base = ["trainer.steps=5", "trainer.prompts_per_step=4", "learner.lr_scheduler=cosine"]
    return resolve_config(TrainConfig, {}, [*base, *overrides])


def test_optimizer_step_unit_counts_every_mini_batch_and_epoch():
    cfg = _cfg("algo.ppo_mini_batch_size=2", "algo.ppo_epochs=2")
    assert schedule_length(cfg) == 5 * 2 * 2
    # the cosine reaches its floor only at the run's last optimizer step
    f = lr_lambda(0, schedule_length(cfg), "cosine", 0.0)
    assert f(19) > 0.0 and math.isclose(f(20), 0.0, abs_tol=1e-12)
    # with the old length (RL steps) it was at 0 a quarter into the run
    assert math.isclose(lr_lambda(0, 5, "cosine", 0.0)(5), 0.0, abs_tol=1e-12)


def test_rl_step_unit_and_an_explicit_total_are_kept():
    assert schedule_length(_cfg("algo.ppo_mini_batch_size=2", "learner.schedule_unit=rl_step")) == 5
    assert schedule_length(_cfg("algo.ppo_mini_batch_size=2", "learner.total_steps=7")) == 7
    assert schedule_length(_cfg()) == 5  # one mini-batch, one epoch: one optimizer step per RL step
