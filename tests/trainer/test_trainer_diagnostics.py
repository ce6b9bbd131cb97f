"""The entropy diagnostics of an RL step: the split by tool use, and the entropy after the update."""

from __future__ import annotations

import pytest
import torch

from stare_tir.rollout.trajectory import Trajectory
from stare_tir.trainer.diagnostics import entropy_after_update, entropy_by_tool_use


class OneRankLearner:
    """The collective helper of Learner for one process, and a fixed recompute answer."""

    rank, world_size = 0, 1

    def __init__(self, entropies=None) -> None:
        self.entropies = entropies

    def all_reduce_sum(self, x):
        return x.clone()

    def compute_logprobs_entropy(self, trajs):
        return [torch.zeros(len(t.response_ids)) for t in trajs], self.entropies


def _traj(n_model: int, tool_calls: int) -> Trajectory:
    t = Trajectory(prompt_ids=[1, 2], tool_calls=tool_calls)
    t.append([5] * n_model, [-0.5] * n_model, "model")
    t.append([7, 7], None, "obs")  # observation tokens carry entropy 0 and must not count
    t.append([6], [-1.0], "model")
    return t


def test_the_split_mixes_back_to_the_batch_entropy():
    trajs = [_traj(3, 1), _traj(1, 0), _traj(5, 2)]
    # per response token; the observation positions hold a large value the mask must drop
    ents = [torch.tensor([0.1, 0.2, 0.3, 9.0, 9.0, 0.4]), torch.tensor([1.0, 9.0, 9.0, 2.0])]
    ents.append(torch.tensor([0.5] * 5 + [9.0, 9.0] + [0.5]))
    got = entropy_by_tool_use(OneRankLearner(), trajs, ents)
    tool = (0.1 + 0.2 + 0.3 + 0.4 + 0.5 * 6) / 10
    assert got["entropy/tool_responses"] == pytest.approx(tool)
    assert got["entropy/direct_responses"] == pytest.approx(1.5)
    assert got["entropy/tool_token_frac"] == pytest.approx(10 / 12)
    batch = (0.1 + 0.2 + 0.3 + 0.4 + 3.0 + 3.0) / 12  # what step.batch_entropy computes
    mix = got["entropy/tool_token_frac"] * tool + (1 - got["entropy/tool_token_frac"]) * 1.5
    assert mix == pytest.approx(batch)


def test_a_side_without_tokens_is_none():
    trajs = [_traj(2, 0)]
    got = entropy_by_tool_use(OneRankLearner(), trajs, [torch.tensor([0.2, 0.4, 0.0, 0.0, 0.6])])
    assert got["entropy/tool_responses"] is None and got["entropy/tool_token_frac"] == 0.0
    assert got["entropy/direct_responses"] == pytest.approx(0.4)


def test_entropy_after_update_is_the_recompute_with_the_new_weights():
    trajs = [_traj(1, 0)]
    learner = OneRankLearner([torch.tensor([0.2, 5.0, 5.0, 0.4])])
    got = entropy_after_update(learner, trajs, entropy_before=0.5)
    assert got == pytest.approx({"entropy/after_update": 0.3, "entropy/update_change": -0.2})


def test_after_update_measures_a_real_update_of_the_learner():
    """On the tiny model with a real DeepSpeed learner: the pass runs on the updated weights (its
    entropy equals a recompute after the step, and differs from the one before it)."""
    from stare_tir.learner import Learner, LearnerConfig
    from stare_tir.model import ensure_tiny_checkpoint

    learner = Learner(str(ensure_tiny_checkpoint()), LearnerConfig(zero_stage=0, lr=3e-2, micro_batch_tokens=256))
    g = torch.Generator().manual_seed(0)
    trajs = []
    for _ in range(4):
        t = Trajectory(prompt_ids=torch.randint(3, 200, (6,), generator=g).tolist())
        t.append(torch.randint(3, 200, (12,), generator=g).tolist(), [0.0] * 12, "model")
        trajs.append(t)
    old, ents = learner.compute_logprobs_entropy(trajs)
    before = float(torch.cat(ents).mean())
    learner.train_step(trajs, [1.0, 1.0, -1.0, -1.0], None, old)
    got = entropy_after_update(learner, trajs, before)
    _, again = learner.compute_logprobs_entropy(trajs)
    assert got["entropy/after_update"] == pytest.approx(float(torch.cat(again).mean()), abs=1e-6)
    assert abs(got["entropy/update_change"]) > 1e-3
