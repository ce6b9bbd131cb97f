"""The recompute-free on-policy update (algo.recompute=auto) on the real learner (CPU, gloo, 1 process,
the tiny Qwen2 checkpoint): the same loss, metrics and updated weights as the recompute pass
followed by the update (to float32 rounding), for GRPO-ds over several micro-batches (TIS on) and
for STARE with its batch-global selection in one micro-batch; one forward less; the pass kept where
a selection over several micro-batches needs every entropy first."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from stare_tir.algos.token_methods import RunMethods
from stare_tir.config import load_config
from stare_tir.train_config import TrainConfig
from stare_tir.trainer.shaping import StepBatch


@dataclass
class Traj:
    """The Trajectory fields the learner, the shaping and the metrics read."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float] = field(default_factory=list)
    void_turns: int = 0
    tool_calls: int = 0


# (overrides, learner micro-batch token budget): GRPO-ds takes several micro-batches (nothing in its
# shaping reads the values); STARE (gate open) selects over the batch, which fits one micro-batch.
CASES = {
    "grpo_ds_tis": (["algo.name=grpo_ds", "algo.tis_cap=1.5"], 96),
    "stare": (["algo.name=stare", "algo.stare.target_entropy=100", "algo.stare.top_p=0.2"], 4096),
}


def _run(tiny_path: str, overrides: list[str], micro_batch_tokens: int) -> SimpleNamespace:
    from stare_tir.learner import Learner, LearnerConfig

    cfg = load_config(TrainConfig, None, ["trainer.prompts_per_step=2", *overrides])
    # fp32 pinned: the tolerances below are float32 rounding's
    learner_cfg = LearnerConfig(zero_stage=2, dtype="fp32", lr=1e-3, micro_batch_tokens=micro_batch_tokens)
    learner = Learner(tiny_path, learner_cfg)
    return SimpleNamespace(cfg=cfg, learner=learner, methods=RunMethods())


def _batch(worker, vocab: int) -> StepBatch:
    trajs = []
    for i, t in enumerate(worker.make_trajs(8, 5, vocab)):
        rollout = [-2.0 if m else 0.0 for m in t.loss_mask]  # a sampler somewhat off the learner: TIS acts
        trajs.append(Traj(t.prompt_ids, t.response_ids, t.loss_mask, rollout, tool_calls=i % 2))
    advs = worker.make_advantages(8, seed=5)
    return StepBatch(trajs, list(trajs), {}, advs, [0.0] * len(trajs))


def _weights(learner) -> torch.Tensor:
    return torch.cat([v.reshape(-1).clone() for _, v in learner.export_weights()])


def _count_forwards(learner) -> list[int]:
    """Counts the engine forwards of `learner` (recompute, update, diagnostics alike)."""
    calls = [0]
    forward = learner._forward

    def counted(mb, with_entropy):
        calls[0] += 1
        return forward(mb, with_entropy)

    learner._forward = counted
    return calls


def _step(run, batch: StepBatch, mode: str) -> tuple[dict, int]:
    """One step's learner part, as rl_step runs it; returns the metrics and the forwards it took."""
    from stare_tir.trainer.step import PhaseTimer, observe, recompute, recompute_free, shape, update, update_on_policy

    calls = _count_forwards(run.learner)
    if mode == "always":
        recompute(run, batch)
        observe(run, batch)
        update(run, shape(run, 11, batch, None), batch.metrics)
    else:
        assert recompute_free(run, batch, None, 1)
        update_on_policy(run, 11 - run.cfg.trainer.seed * 1_000_003, batch, None, PhaseTimer())
    return batch.metrics, calls[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_recompute_free_equals_recompute_then_update(tiny_path, worker, vocab, case):
    overrides, budget = CASES[case]
    got = {}
    for mode in ("always", "auto"):
        run = _run(tiny_path, [*overrides, f"algo.recompute={mode}"], budget)
        w0 = _weights(run.learner)
        metrics, forwards = _step(run, _batch(worker, vocab), mode)
        got[mode] = (
            metrics,
            forwards,
            w0,
            _weights(run.learner),
            run.learner.micro_batch_plan(_batch(worker, vocab).trajs),
        )
    (m_a, f_a, w0, w_a, plan), (m_b, f_b, w0_b, w_b, _) = got["always"], got["auto"]
    assert torch.equal(w0, w0_b)
    n_update = len(plan)
    assert (case == "stare") == (n_update == 1)
    n_recompute = f_a - n_update
    assert n_recompute >= 1 and f_b == n_update  # the recompute pass's forwards are gone, nothing else
    for key in ("update/loss", "entropy/batch", "entropy/tool_responses", "mismatch/abs_mean", "mismatch/k3"):
        assert m_b[key] == pytest.approx(m_a[key], rel=1e-5, abs=1e-6), key
    assert m_b["update/pg/ratio_max"] == 1.0  # old = its own log-probs, detached
    if case == "stare":
        assert m_a["stare/gate_on"] == m_b["stare/gate_on"] == 1.0
        assert m_b["stare/reweighted_frac"] == m_a["stare/reweighted_frac"] > 0  # the same tokens selected
    # Adam's first step moves every weight by ~lr whatever its gradient's size, so a gradient equal to
    # rounding moves it alike: the two updates agree to a small fraction of their size.
    moved = float((w_a - w0).norm())
    assert moved > 0 and float((w_b - w_a).norm()) < 1e-3 * moved


def test_a_batch_global_selection_over_several_micro_batches_keeps_the_recompute(tiny_path, worker, vocab):
    from stare_tir.trainer.step import recompute_free

    overrides, _ = CASES["stare"]
    run = _run(tiny_path, overrides, 96)
    batch = _batch(worker, vocab)
    assert run.learner.update_micro_batches(batch.trajs) > 1
    assert not recompute_free(run, batch, None, 1)
    run.learner.cfg.micro_batch_tokens = 4096  # the same batch in one micro-batch: skipped
    assert recompute_free(run, batch, None, 1)
    assert not recompute_free(run, batch, None, 2)  # several mini-batches: later ones need stored old
    run.cfg.algo.recompute = "always"
    assert not recompute_free(run, batch, None, 1)


def test_train_step_on_policy_refuses_several_micro_batches(tiny_path, worker, vocab):
    run = _run(tiny_path, ["algo.name=grpo_ds"], 96)
    batch = _batch(worker, vocab)
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        run.learner.train_step_on_policy(batch.trajs, lambda lp, ent: {})
