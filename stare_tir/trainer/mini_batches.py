"""Which trajectories of a step form each PPO mini-batch (algo.ppo_mini_batch_size).

verl's semantics (volcengine/verl `dp_actor.update_policy`): the rollout batch is cut into disjoint
mini-batches, one optimizer step each, in a fixed order (no shuffle), every epoch the same cut.
Here each rank cuts its own share of the batch, in batch order, into k consecutive runs of sizes
differing by at most one, so every rank takes part in every mini-batch (the learner's collectives
stay in step) and each token is trained once per epoch. k is fixed by the config: a batch that
dynamic sampling filled only in part gives k smaller mini-batches (verl would wait for a full one). Under verl's layout (algo.scope or
algo.loss_agg = verl) the mini-batches are verl's instead: balance_batch over the simulated ranks
of algo.verl_partition, each simulated rank's share cut into k runs (`verl_mini_batches`), so the
selection groups and aggregation of every mini-batch are those of the authors' runs; each real
rank then trains its own trajectories of that mini-batch. Which trajectories share a mini-batch
depends on the verl version the authors ran (algo.verl_partition.layout): verl >= 0.6.1 hands each
rank its share sorted by length, so each mini-batch holds similar lengths; verl <= 0.6.0 keeps
generation order, so each mini-batch mixes them.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from stare_tir.algos.verl_partition import verl_mini_batches
from stare_tir.learner import Learner
from stare_tir.train_config import AlgoConfig


def consecutive_runs(n: int, k: int) -> list[list[int]]:
    """0..n-1 cut into k consecutive runs whose sizes differ by at most one (the longer ones first)."""
    base, extra = divmod(n, k)
    out, start = [], 0
    for j in range(k):
        size = base + (1 if j < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


def _seq_len(t: Any) -> int:
    return len(t.prompt_ids) + len(t.response_ids)


def mini_batch_plan(
    learner: Learner, trajs: Sequence[Any], algo: AlgoConfig, k: int
) -> tuple[list[list[int]], list[list[list[list[int]]]] | None]:
    """This rank's trajectory indices per mini-batch, and under verl's layout, per mini-batch the
    simulated ranks' micro-batches as indices in that mini-batch's gathered order (the order
    `shaping.token_view` gathers it: rank by rank, each rank's members in batch order); else None.
    Collective under verl's layout (the sequence lengths are gathered)."""
    if algo.scope != "verl" and algo.loss_agg != "verl":
        return consecutive_runs(len(trajs), k), None
    lens, mine = learner.all_gather_flat(torch.tensor([float(_seq_len(t)) for t in trajs]))
    vp = algo.verl_partition
    layout = verl_mini_batches(
        [int(x) for x in lens.tolist()],
        vp.ranks,
        vp.token_budget,
        k,
        layout=vp.layout,
        sequence_parallel=vp.sequence_parallel,
        micro_batch_size=vp.micro_batch_size,
    )
    members, layouts = [], []
    for per_rank in layout:
        in_mb = sorted(i for micro in per_rank for mb in micro for i in mb)
        position = {g: p for p, g in enumerate(in_mb)}
        members.append([g - mine.start for g in in_mb if mine.start <= g < mine.stop])
        layouts.append([[[position[i] for i in mb] for mb in micro] for micro in per_rank])
    return members, layouts
