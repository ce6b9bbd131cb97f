"""The learning-rate warm-up counted as verl counts it (learner.schedule_unit = rl_step): the mean lr
factor of every RL step equals verl's for the DAPO, 80/20 and JustRL recipes; the default unit is
unchanged. CPU only, no model: the schedule on a one-parameter optimizer, stepped as the trainer
steps it (one optimizer step per mini-batch, `begin_rl_step` at the start of each RL step).

verl's schedule, read from volcengine/verl@07584894 (v0.4.0), byte for byte the same lines in
thunlp/JustRL@cf444e99:train/verl, volcengine/verl@246cac4c and the 80/20 fork
Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR@6f5dda6f:
  verl/utils/torch_functional.py `get_constant_schedule_with_warmup`: lr_lambda(current_step) =
    current_step / max(1, num_warmup_steps) below num_warmup_steps, else 1;
  verl/workers/fsdp_workers.py `update_actor`: `actor.update_policy(data)` (all mini-batches of the
    RL step, dp_actor.py `for batch_idx, data in enumerate(dataloader)`), then
    `actor_lr_scheduler.step()` once: the scheduler counts RL steps, and RL step t (0-based) trains
    every mini-batch at lr x lr_lambda(t).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from stare_tir.config import load_config
from stare_tir.learner.config import LearnerConfig
from stare_tir.learner.parts import RlStepClock, begin_rl_step, lr_lambda
from stare_tir.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def verl_factor(t: int, warmup: int) -> float:
    """get_constant_schedule_with_warmup's multiplier at scheduler step t."""
    return t / max(1.0, warmup) if t < warmup else 1.0


def mean_factor_per_rl_step(cfg: LearnerConfig, k: int, rl_steps: int) -> list[float]:
    """The lr each of the k mini-batches of every RL step trains at, averaged per step, over the peak
    lr: the learner's LambdaLR, stepped once per optimizer step, the clock advanced per RL step."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=cfg.lr)
    clock = RlStepClock()
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambda(cfg.warmup_steps, cfg.total_steps, cfg.lr_scheduler, cfg.min_lr_ratio, cfg.schedule_unit, clock)
    )
    out = []
    for t in range(rl_steps):
        begin_rl_step(sched, clock, t, cfg.schedule_unit)
        lrs = []
        for _ in range(k):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        out.append(sum(lrs) / k / cfg.lr)
    return out


# recipe -> (optimizer steps per RL step, cumulative lr over RL steps 1-10 with the warm-up counted
# in optimizer steps, over verl's): what the recipes ran here before learner.schedule_unit existed.
RECIPES = {"dapo": (16, 2.1597), "entropy_80_20": (16, 2.1597), "justrl": (4, 1.9722)}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_mean_lr_factor_per_rl_step_equals_verls(name):
    cfg = load_config(TrainConfig, ROOT / "configs" / f"retool_qwen2.5_7b_{name}.yaml", [])
    k = cfg.algo.mini_batches(cfg.trainer.prompts_per_step)
    learner = cfg.learner
    assert (k, learner.warmup_steps, learner.schedule_unit) == (RECIPES[name][0], 10, "rl_step")
    ours = mean_factor_per_rl_step(learner, k, 15)
    verl = [verl_factor(t, learner.warmup_steps) for t in range(15)]
    assert ours == pytest.approx(verl, abs=1e-12)
    assert ours[0] == 0.0  # verl's first RL step trains at lr 0

    # The bug this fixes: the same warm-up counted in optimizer steps ends within the first RL steps.
    before = mean_factor_per_rl_step(
        LearnerConfig(lr=learner.lr, warmup_steps=10, schedule_unit="optimizer_step"), k, 10
    )
    assert sum(before) / sum(verl[:10]) == pytest.approx(RECIPES[name][1], abs=1e-4)


def test_recipes_without_warmup_are_the_same_in_either_unit():
    for name in ("kl_cov", "clip_cov", "steer"):
        cfg = load_config(TrainConfig, ROOT / "configs" / f"retool_qwen2.5_7b_{name}.yaml", [])
        assert cfg.learner.warmup_steps == 0
        k = cfg.algo.mini_batches(cfg.trainer.prompts_per_step)
        for unit in ("optimizer_step", "rl_step"):
            learner = LearnerConfig(lr=cfg.learner.lr, warmup_steps=0, schedule_unit=unit)
            assert mean_factor_per_rl_step(learner, k, 5) == pytest.approx([1.0] * 5, abs=1e-12)


def test_default_unit_is_the_previous_schedule():
    """learner.schedule_unit optimizer_step (the default; `make train`'s configs/tiny_cpu.yaml) keeps
    the previous multiplier exactly, and begin_rl_step leaves it alone."""

    def previous(k: int, warmup: int, total: int, schedule: str, floor: float) -> float:
        if k < warmup:
            return (k + 1) / warmup
        if schedule == "constant":
            return 1.0
        frac = min(1.0, (k - warmup) / max(1, total - warmup))
        decay = 1.0 - frac if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))
        return floor + (1.0 - floor) * decay

    tiny = load_config(TrainConfig, ROOT / "configs" / "tiny_cpu.yaml", []).learner
    assert tiny.schedule_unit == "optimizer_step"
    for warmup, total, schedule, floor in [(5, 40, "cosine", 0.0), (3, 20, "linear", 0.1), (0, 0, "constant", 0.0)]:
        f = lr_lambda(warmup, total, schedule, floor)
        assert [f(k) for k in range(45)] == [previous(k, warmup, total, schedule, floor) for k in range(45)]
    cfg = LearnerConfig(lr=1.0, warmup_steps=5, total_steps=40, lr_scheduler="cosine")
    per_step = mean_factor_per_rl_step(cfg, 3, 12)  # begin_rl_step called, nothing changed by it
    flat = [previous(k, 5, 40, "cosine", 0.0) for k in range(36)]
    assert per_step == pytest.approx([sum(flat[3 * t : 3 * t + 3]) / 3 for t in range(12)], abs=1e-15)


def test_rl_step_decay_counts_rl_steps_and_a_checkpoint_does_not_move_the_clock():
    cfg = LearnerConfig(lr=1.0, warmup_steps=2, total_steps=6, lr_scheduler="linear", schedule_unit="rl_step")
    assert mean_factor_per_rl_step(cfg, 4, 7) == pytest.approx([0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0])
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    clock = RlStepClock()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(2, 6, "linear", 0.0, "rl_step", clock))
    begin_rl_step(sched, clock, 3, "rl_step")
    state = sched.state_dict()
    assert "clock" not in str(state)  # the step is the trainer's, not saved state
    clock.step = 0
    sched.load_state_dict(state)
    begin_rl_step(sched, clock, 4, "rl_step")  # what the loop does on resuming at step 5
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5)


def test_unit_is_checked():
    with pytest.raises(ValueError, match="optimizer_step or rl_step"):
        LearnerConfig(schedule_unit="epoch")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="clock"):
        lr_lambda(10, 0, "constant", 0.0, "rl_step")


def test_sft_refuses_the_rl_step_unit():
    from stare_tir.sft.config import SFTConfig

    with pytest.raises(ValueError, match="SFT has no RL steps"):
        SFTConfig(learner=LearnerConfig(schedule_unit="rl_step"))
