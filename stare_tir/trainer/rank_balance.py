"""Learner ranks balanced by tokens (trainer.balance_ranks): after scoring, the step's trajectories
move between ranks so that every rank's learner passes process about as many tokens.

Each rank rolls out its round-robin share of the prompts (`trainer/batch.py`) and scores its own
groups (`step.score`: group advantages need whole groups). With skewed response lengths one rank
then holds far more tokens than another, and every collective of the recompute pass, the update
and the diagnostics waits for it. verl balances the same way (ray_trainer.py `_balance_batch`):
every rank learns every rank's sequence lengths, all compute the same Karmarkar-Karp partition
(`algos.verl_partition.balanced_partition`, deterministic), and the trajectories move to their
set's rank, carrying their advantage and overlong penalty (pickled, all-gathered over the
learner's process group).

Cost of a trajectory: its prompt + response tokens. Each learner pass runs the model forward (and
backward) over every token of the row, and the learner packs micro-batches by that same count
(`learner.micro_batch`), so with token-budget packing its time and micro-batch count follow it.
verl's newer workload (24576 L + L^2 for a 7B model) adds attention's quadratic term; below a few
times the hidden size per sequence (and with flash attention) the linear term dominates.

Set sizes are free (verl's equal_size=False): the loss is normalised by global counts (every
micro-batch loss divided by the tokens, or sequences, of all ranks, `Learner.train_step`), and
the gradients are summed over ranks, so which rank holds a trajectory does not change the loss;
equal counts would only balance tokens worse. What does follow the placement: the order in which
the trajectories are gathered rank by rank (`shaping.token_view`), which decides a random method's
draws per selection group and ties in verl's simulated partition; algo.scope=micro_batch groups
by each rank's own micro-batches; and with several PPO mini-batches each rank cuts its own share.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from loguru import logger

from stare_tir.algos.verl_partition import balanced_partition
from stare_tir.learner import Learner
from stare_tir.trainer.shaping import StepBatch

# StepBatch's per-trajectory lists: the ones `score` has filled move with their trajectories; the
# recompute pass fills the rest afterwards, on the trajectories' new ranks.
MOVED = ("trajs", "advantages", "penalties")
FILLED_LATER = ("old_logprobs", "entropies")

Place = tuple[int, int]  # (rank that holds the trajectory now, its index in that rank's list)


def seq_tokens(traj: Any) -> int:
    """What a trajectory costs the learner: its prompt + response tokens (module docstring)."""
    return len(traj.prompt_ids) + len(traj.response_ids)


def max_over_mean(loads: Sequence[float]) -> float:
    """The largest rank's load over the mean rank's (1.0: balanced, or nothing to balance)."""
    mean = sum(loads) / len(loads) if loads else 0.0
    return max(loads) / mean if mean > 0 else 1.0


def _match_sets_to_ranks(sets: list[list[Place]], costs: list[list[int]]) -> list[list[Place]]:
    """Hand each set to a rank, greedily keeping the most tokens where they already are (the largest
    overlap first; ties by set, then rank), so that as little as possible moves."""
    k = len(costs)
    overlap = [[0] * k for _ in sets]
    for s, members in enumerate(sets):
        for r, i in members:
            overlap[s][r] += costs[r][i]
    pairs = sorted((-overlap[s][r], s, r) for s in range(len(sets)) for r in range(k))
    owner: dict[int, int] = {}
    taken: set[int] = set()
    for _, s, r in pairs:
        if s not in owner and r not in taken:
            owner[s] = r
            taken.add(r)
    out: list[list[Place]] = [[] for _ in range(k)]
    for s, r in owner.items():
        out[r] = sets[s]
    return out


def balanced_placement(costs: list[list[int]]) -> list[list[Place]]:
    """Where every trajectory goes: per destination rank, the places (source rank, index) of its
    trajectories, in gathered order (rank by rank, each rank's in its own order). A pure function
    of `costs` (costs[r]: the token cost of each trajectory rank r holds), so every rank computes
    the same placement. Karmarkar-Karp over all ranks' costs, sets of free size; the current
    placement is kept when the partition does not lower the largest rank's tokens."""
    k = len(costs)
    places = [(r, i) for r in range(k) for i in range(len(costs[r]))]
    values = [costs[r][i] for r, i in places]
    current = [[(r, i) for i in range(len(costs[r]))] for r in range(k)]
    if k < 2 or not places:
        return current
    # Fewer trajectories than ranks: zero-cost fillers make the partition possible; dropped after.
    padded = values + [0] * max(k - len(values), 0)
    try:
        index_sets = balanced_partition(padded, k, equal_size=False)
    except ValueError as e:  # not expected for n >= k; balancing is an optimisation, not required
        logger.warning(f"rank balancing skipped this step: {e}")
        return current
    sets = [[places[j] for j in s if j < len(places)] for s in index_sets]
    placement = _match_sets_to_ranks(sets, costs)
    loads = [sum(costs[r][i] for r, i in members) for members in placement]
    if max(loads) >= max(sum(c) for c in costs):
        return current
    return [sorted(members) for members in placement]


def rebalance(learner: Learner, batch: StepBatch, enabled: bool = True) -> None:
    """Move the scored batch's trajectories between ranks so that their tokens are balanced
    (`balanced_placement`); each keeps its advantage and penalty. Collective; a no-op with one
    process. Call after `score` and before the recompute pass. Metrics (with several ranks, also
    when disabled, to show the imbalance): balance/tokens_max_mean_before and _after (the largest
    rank's prompt + response tokens over the mean), balance/moved_trajectories (over all ranks),
    time/balance."""
    if learner.world_size == 1:
        return
    n = len(batch.trajs)
    if len(batch.advantages) != n or len(batch.penalties) != n:
        raise ValueError(
            f"rank balancing needs the scored batch: {n} trajectories, {len(batch.advantages)} advantages, "
            f"{len(batch.penalties)} penalties; call it after score(run, batch)"
        )
    if any(getattr(batch, name) for name in FILLED_LATER):
        raise ValueError(
            "rank balancing moves trajectories before the recompute pass (its log-probs and entropies "
            "are not moved); call it between score(run, batch) and recompute(run, batch)"
        )
    t0 = time.perf_counter()
    costs = learner.all_gather_object([seq_tokens(t) for t in batch.trajs])
    before = max_over_mean([float(sum(c)) for c in costs])
    placement = balanced_placement(costs) if enabled else [[(r, i) for i in range(len(c))] for r, c in enumerate(costs)]
    after = max_over_mean([float(sum(costs[r][i] for r, i in members)) for members in placement])
    rank = learner.rank
    leaving = {i for dest, members in enumerate(placement) if dest != rank for r, i in members if r == rank}
    moved = sum(1 for dest, members in enumerate(placement) for r, _ in members if r != dest)
    if moved:  # decided from the placement alone: every rank agrees whether to exchange
        mine = {name: getattr(batch, name) for name in MOVED}
        outgoing = {i: tuple(mine[name][i] for name in MOVED) for i in sorted(leaving)}
        received = learner.all_gather_object(outgoing)
        rows = [received[r][i] if r != rank else tuple(mine[name][i] for name in MOVED) for r, i in placement[rank]]
        for k, name in enumerate(MOVED):
            setattr(batch, name, [row[k] for row in rows])
    batch.metrics.update(
        {
            "balance/tokens_max_mean_before": before,
            "balance/tokens_max_mean_after": after,
            "balance/moved_trajectories": float(moved),
            "time/balance": time.perf_counter() - t0,
        }
    )
