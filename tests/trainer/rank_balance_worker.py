"""One rank of a skewed RL step (run by tests/trainer/test_rank_balance_two_ranks.py): the phases of
`rl_step` after the rollout (score, rebalance, recompute, observe, shape, update) on a fixed batch
whose round-robin split gives rank 0 every long response; rank 0 saves the weights and metrics.

    python tests/trainer/rank_balance_worker.py MODEL_DIR OUT.pt --balance {on,off}
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository
sys.path.insert(0, str(HERE.parent / "learner"))  # learner_worker: the tiny learner's settings

OVERRIDES = [
    "algo.name=grpo",
    "algo.overlong_penalty.enabled=true",  # penalties must travel with their trajectories
    "rollout.max_total_tokens=64",  # responses past 64 - 13 tokens are penalised
]
N_TRAJS, GROUP = 16, 4


def skewed_batch(vocab: int, rank: int, world: int) -> list:
    """16 trajectories in 4 groups of 4 (varied rewards); the even ones have responses of 40-60
    tokens, the odd ones 3-6, so the round-robin share of rank 0 of 2 holds every long one."""
    from stare_tir.rollout.trajectory import Trajectory

    g = random.Random(7)
    every = []
    for k in range(N_TRAJS):
        n = g.randint(40, 60) if k % 2 == 0 else g.randint(3, 6)
        t = Trajectory(prompt_ids=[g.randrange(3, vocab) for _ in range(g.randint(4, 8))], finish_reason="answer")
        t.append([g.randrange(3, vocab) for _ in range(n)], [-0.5] * n, "model")
        t.reward = float(g.random() < 0.5) + 0.1 * (k % 3)
        t.group_id = k // GROUP
        every.append(t)
    return every[rank::world]


def main() -> None:
    import learner_worker
    import torch
    from transformers import AutoConfig

    from stare_tir.algos.token_methods import RunMethods
    from stare_tir.config import load_config
    from stare_tir.train_config import TrainConfig
    from stare_tir.trainer.rank_balance import rebalance, seq_tokens
    from stare_tir.trainer.shaping import StepBatch
    from stare_tir.trainer.step import observe, recompute, score, shape, step_seed, update

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--balance", choices=("on", "off"), required=True)
    a = ap.parse_args()
    vocab = AutoConfig.from_pretrained(a.model).vocab_size
    learner = learner_worker.make_learner(a.model, 2, 64)
    cfg = load_config(TrainConfig, None, [*OVERRIDES, f"trainer.balance_ranks={str(a.balance == 'on').lower()}"])
    run = SimpleNamespace(cfg=cfg, learner=learner, methods=RunMethods())
    trajs = skewed_batch(vocab, learner.rank, learner.world_size)
    batch = StepBatch(trajs, list(trajs), {})
    score(run, batch)
    rebalance(learner, batch, cfg.trainer.balance_ranks)
    mine = sorted((t.group_id, seq_tokens(t), a, p) for t, a, p in zip(batch.trajs, batch.advantages, batch.penalties))
    recompute(run, batch)
    observe(run, batch)
    inputs = shape(run, step_seed(run, 1), batch, None)
    applied, _ = update(run, inputs, batch.metrics)
    weights = {k: v.clone() for k, v in learner.export_weights()}
    held = learner.all_gather_object(mine)  # what each rank trained on, with its advantage and penalty
    if learner.rank == 0:
        torch.save({"weights": weights, "metrics": batch.metrics, "applied": applied, "held": held}, a.out)


if __name__ == "__main__":
    main()
