"""One rank of a mini-batch update (run by tests/learner/test_learner_minibatch_two_ranks.py): the
fixed batch of learner_worker.py, this rank's contiguous share of it, update_mini_batches under
verl's layout; rank 0 saves the final weights and the per-call trajectory counts."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

OVERRIDES = [
    "algo.name=entropy_80_20",
    "algo.scope=verl",
    "algo.loss_agg=verl",
    "algo.verl_partition.ranks=2",
    "algo.verl_partition.token_budget=96",
    "trainer.prompts_per_step=4",
    "algo.ppo_mini_batch_size=2",
]


@dataclass
class Traj:
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float] = field(default_factory=list)
    void_turns: int = 0


def main() -> None:
    import learner_worker
    import torch
    from transformers import AutoConfig

    from stare_tir.algos.token_methods import RunMethods
    from stare_tir.config import load_config
    from stare_tir.train_config import TrainConfig
    from stare_tir.trainer.shaping import StepBatch
    from stare_tir.trainer.step import batch_entropy, observe, update_mini_batches

    model, out = sys.argv[1], sys.argv[2]
    vocab = AutoConfig.from_pretrained(model).vocab_size
    learner = learner_worker.make_learner(model, 2, 64)
    cfg = load_config(TrainConfig, None, OVERRIDES)
    run = SimpleNamespace(cfg=cfg, learner=learner, methods=RunMethods())
    every = [
        Traj(t.prompt_ids, t.response_ids, t.loss_mask, t.rollout_logprobs)
        for t in learner_worker.make_trajs(16, 5, vocab)
    ]
    advs = learner_worker.make_advantages(16, seed=5)
    share = 16 // learner.world_size  # contiguous: the gathered order is the batch order
    lo, hi = learner.rank * share, (learner.rank + 1) * share
    trajs, adv = every[lo:hi], advs[lo:hi]
    old, ent = learner.compute_logprobs_entropy(trajs)
    metrics = {"entropy/batch": batch_entropy(learner, trajs, ent)}
    batch = StepBatch(trajs, trajs, metrics, adv, [0.0] * len(trajs), old, ent)
    observe(run, batch)
    applied, _ = update_mini_batches(run, 1, batch, None, 2)
    weights = {k: v.clone() for k, v in learner.export_weights()}
    if learner.rank == 0:
        torch.save(
            {"weights": weights, "applied": applied, "selected": metrics["algo/entropy_80_20/selected_frac"]}, out
        )


if __name__ == "__main__":
    main()
