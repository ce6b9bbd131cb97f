"""One rank of a STARE step (run by tests/learner/test_learner_recompute_free_two_ranks.py): the fixed
batch of learner_worker.py, this rank's contiguous share, and either the recompute pass then the
update (argv[3] = always) or the update that shapes from its own forward (auto); rank 0 saves the
weights and the step's metrics."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

OVERRIDES = ["algo.name=stare", "algo.stare.target_entropy=100", "algo.stare.top_p=0.2", "trainer.prompts_per_step=2"]


@dataclass
class Traj:
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float] = field(default_factory=list)
    void_turns: int = 0
    tool_calls: int = 0


def main() -> None:
    import learner_worker
    import torch
    from transformers import AutoConfig

    from stare_tir.algos.token_methods import RunMethods
    from stare_tir.config import load_config
    from stare_tir.train_config import TrainConfig
    from stare_tir.trainer.shaping import StepBatch
    from stare_tir.trainer.step import PhaseTimer, observe, recompute, recompute_free, shape, update, update_on_policy

    model, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    vocab = AutoConfig.from_pretrained(model).vocab_size
    learner = learner_worker.make_learner(model, 2, 4096)  # each rank's share in one micro-batch
    cfg = load_config(TrainConfig, None, [*OVERRIDES, f"algo.recompute={mode}"])
    run = SimpleNamespace(cfg=cfg, learner=learner, methods=RunMethods())
    every = [
        Traj(t.prompt_ids, t.response_ids, t.loss_mask, t.rollout_logprobs)
        for t in learner_worker.make_trajs(8, 5, vocab)
    ]
    advs = learner_worker.make_advantages(8, seed=5)
    share = 8 // learner.world_size  # contiguous: the gathered order is the batch order
    lo, hi = learner.rank * share, (learner.rank + 1) * share
    batch = StepBatch(every[lo:hi], every[lo:hi], {}, advs[lo:hi], [0.0] * share)
    assert recompute_free(run, batch, None, 1) == (mode == "auto")
    if mode == "auto":
        update_on_policy(run, 1, batch, None, PhaseTimer())
    else:
        recompute(run, batch)
        observe(run, batch)
        update(run, shape(run, 11, batch, None), batch.metrics)
    weights = {k: v.clone() for k, v in learner.export_weights()}
    if learner.rank == 0:
        torch.save({"weights": weights, "metrics": batch.metrics}, out)


if __name__ == "__main__":
    main()
