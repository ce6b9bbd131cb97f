"""The PPO mini-batch schedule on the real learner (CPU, gloo, 1 process, the tiny Qwen2 checkpoint):
KL-Cov's penalty acts from the second mini-batch on and never on the first, the schedule makes one
optimizer step per mini-batch with selections made again from the current policy, one mini-batch
is the plain update bit for bit, and STEER / EAPO at their neutral settings are GRPO-ds bit for bit."""

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
    """The Trajectory fields the learner and the shaping read."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float] = field(default_factory=list)
    void_turns: int = 0


def _trajs(worker, n: int, vocab: int, seed: int = 3) -> list[Traj]:
    return [
        Traj(t.prompt_ids, t.response_ids, t.loss_mask, t.rollout_logprobs) for t in worker.make_trajs(n, seed, vocab)
    ]


def _run(tiny_path: str, overrides: list[str]) -> SimpleNamespace:
    """What update/shape read of a Run: the config, a real learner, the token methods."""
    from stare_tir.learner import Learner, LearnerConfig

    cfg = load_config(TrainConfig, None, overrides)
    learner = Learner(tiny_path, LearnerConfig(zero_stage=2, lr=1e-3, micro_batch_tokens=64, grad_clip=1.0))
    return SimpleNamespace(cfg=cfg, learner=learner, methods=RunMethods())


def _weights(learner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in learner.export_weights()}


def _recompute(run, trajs, advantages) -> StepBatch:
    """The step's batch after score and recompute; the run's methods have seen its entropy."""
    from stare_tir.trainer.step import observe

    old, ent = run.learner.compute_logprobs_entropy(trajs)
    h = float(torch.cat([e[torch.tensor(t.loss_mask, dtype=torch.bool)] for t, e in zip(trajs, ent)]).mean())
    batch = StepBatch(trajs, trajs, {"entropy/batch": h}, list(advantages), [0.0] * len(trajs), old, ent)
    observe(run, batch)
    return batch


def test_kl_cov_penalty_gradient_is_zero_on_policy_and_not_after_a_step(tiny_path, worker, vocab):
    """The penalty alone (A = 0, coefficient 1 on every token): exactly zero gradient with old = the
    update's own log-probs; non-zero once the policy moved from the stored old log-probs."""
    from stare_tir.algos.policy_loss import POLICY_LOSSES

    run = _run(tiny_path, ["algo.name=kl_cov"])
    learner, kl_loss = run.learner, POLICY_LOSSES.get("kl_cov")
    trajs = _trajs(worker, 8, vocab)
    stored, _ = learner.compute_logprobs_entropy(trajs)
    zero = [0.0] * len(trajs)
    coef = [torch.ones(len(t.response_ids)) for t in trajs]
    first = learner.train_step(trajs, zero, None, None, loss_fn=kl_loss, terms={"kl_cov": coef})
    assert first["grad_norm"] == 0.0 and first["pg/kl_penalty_abs_diff"] == 0.0
    learner.train_step(trajs, worker.make_advantages(8, seed=3), None, stored, loss_fn=kl_loss)  # the policy moves
    later = learner.train_step(trajs, zero, None, stored, loss_fn=kl_loss, terms={"kl_cov": coef})
    assert later["grad_norm"] > 0.0 and later["pg/kl_penalty_abs_diff"] > 0.0


def test_kl_cov_with_8_mini_batches_penalises_from_the_second_on(tiny_path, worker, vocab):
    from stare_tir.trainer.step import update_mini_batches

    run = _run(
        tiny_path,
        ["algo.name=kl_cov", "algo.kl_cov.ratio=0.2", "trainer.prompts_per_step=8", "algo.ppo_mini_batch_size=1"],
    )
    k = run.cfg.algo.mini_batches(run.cfg.trainer.prompts_per_step)
    assert k == 8
    trajs = _trajs(worker, 16, vocab)
    batch = _recompute(run, trajs, worker.make_advantages(16, seed=3))
    metrics = batch.metrics
    calls, recomputes = [], []
    train_step, recompute = run.learner.train_step, run.learner.compute_logprobs_entropy

    def spy(trajs_, advantages, token_weights=None, old_logprobs=None, **kw):
        out = train_step(trajs_, advantages, token_weights, old_logprobs, **kw)
        calls.append((len(trajs_), old_logprobs is None, "kl_cov" in (kw.get("terms") or {}), out))
        return out

    def spy_recompute(trajs_):
        recomputes.append(len(trajs_))
        return recompute(trajs_)

    run.learner.train_step, run.learner.compute_logprobs_entropy = spy, spy_recompute
    before = run.learner.steps_applied
    applied, skipped = update_mini_batches(run, 1, batch, None, k)
    assert (applied, skipped) == (8, False) and run.learner.steps_applied - before == 8
    assert metrics["update/mini_batches"] == 8.0
    assert [c[0] for c in calls] == [2] * 8  # disjoint mini-batches covering the batch
    assert [c[1] for c in calls] == [True] + [False] * 7  # only the first is on-policy (old = own)
    assert recomputes == [2] * 7  # the later ones select again from the current policy
    assert all(c[2] for c in calls)  # every mini-batch has penalised tokens
    diffs = [c[3]["pg/kl_penalty_abs_diff"] for c in calls]
    assert diffs[0] == 0.0 and all(d > 0.0 for d in diffs[1:])


def test_one_mini_batch_is_the_plain_update_bit_for_bit(tiny_path, worker, vocab):
    """update_mini_batches with k = 1 and on-policy old log-probs = shape + update (rl_step sends k = 1
    to the latter; with more, the former): the schedule itself adds nothing."""
    from stare_tir.trainer.step import shape, update, update_mini_batches

    trajs = _trajs(worker, 8, vocab)
    advs = worker.make_advantages(8, seed=3)
    results = []
    for path in ("plain", "schedule"):
        run = _run(
            tiny_path, ["algo.name=entropy_80_20", "algo.ratio_one_on_policy=true", "trainer.prompts_per_step=4"]
        )
        batch = _recompute(run, trajs, advs)
        if path == "plain":
            inputs = shape(run, 1, batch, None)
            update(run, inputs, batch.metrics)
        else:
            update_mini_batches(run, 1, batch, None, 1)
        results.append((batch.metrics["update/loss"], _weights(run.learner)))
    (l0, w0), (l1, w1) = results
    assert l0 == l1 and all(torch.equal(w0[k], w1[k]) for k in w0)


def test_verl_layout_mini_batches_train_every_trajectory_once(tiny_path, worker, vocab):
    from stare_tir.trainer.mini_batches import mini_batch_plan
    from stare_tir.trainer.step import update_mini_batches

    over = ["algo.name=entropy_80_20", "algo.scope=verl", "algo.loss_agg=verl", "algo.verl_partition.ranks=2",
            "algo.verl_partition.token_budget=96", "trainer.prompts_per_step=4", "algo.ppo_mini_batch_size=2",
            "algo.ppo_epochs=2"]  # fmt: skip
    run = _run(tiny_path, over)
    trajs = _trajs(worker, 16, vocab)
    members, layouts = mini_batch_plan(run.learner, trajs, run.cfg.algo, 2)
    assert sorted(i for m in members for i in m) == list(range(16)) and layouts is not None
    for m, lay in zip(members, layouts):  # each mini-batch's layout indexes its own trajectories
        assert sorted(i for rank in lay for mb in rank for i in mb) == list(range(len(m)))
    batch = _recompute(run, trajs, worker.make_advantages(16, 3))
    applied, _ = update_mini_batches(run, 1, batch, None, 2)
    assert applied == 4  # 2 epochs x 2 mini-batches
    assert 0.0 < batch.metrics["algo/entropy_80_20/selected_frac"] < 0.5


@pytest.mark.parametrize(
    "overrides",
    [
        ["algo.name=steer", "algo.scope=batch", "algo.steer.w_min=1.0", "algo.steer.w_max=1.0"],
        [
            "algo.name=steer",
            "algo.scope=batch",
            "algo.steer.mode=linear",
            "algo.steer.w_min=1.0",
            "algo.steer.w_max=1.0",
        ],
        ["algo.name=eapo"],  # the first step: H_t = H_0
    ],
    ids=["steer_exponential", "steer_linear", "eapo_first_step"],
)
def test_neutral_steer_and_eapo_are_grpo_ds_bit_for_bit(tiny_path, worker, vocab, overrides):
    from stare_tir.trainer.step import shape, update

    trajs = _trajs(worker, 8, vocab)
    advs = worker.make_advantages(8, seed=3)
    results = []
    for over in (["algo.name=grpo_ds"], overrides):
        run = _run(tiny_path, over)
        batch = _recompute(run, trajs, advs)
        inputs = shape(run, 1, batch, None)
        update(run, inputs, batch.metrics)
        results.append((inputs, batch.metrics["update/loss"], _weights(run.learner)))
    (i0, l0, w0), (i1, l1, w1) = results
    assert i0.token_weights is None and i1.token_weights is not None  # the method ran and weighted
    assert all(bool((w == 1.0).all()) for w in i1.token_weights)
    assert l0 == l1 and all(torch.equal(w0[k], w1[k]) for k in w0)


def test_mini_batches_empty_on_every_rank_are_skipped(tiny_path, worker, vocab):
    """A batch of fewer trajectories than mini-batches (a partly filled batch) trains each once."""
    from stare_tir.trainer.step import update_mini_batches

    run = _run(tiny_path, ["algo.name=kl_cov", "trainer.prompts_per_step=4", "algo.ppo_mini_batch_size=1"])
    batch = _recompute(run, _trajs(worker, 2, vocab), [1.0, -1.0])
    applied, skipped = update_mini_batches(run, 1, batch, None, 4)
    assert (applied, skipped) == (2, False) and run.learner.steps_applied == 2
