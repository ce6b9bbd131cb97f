"""Rank balancing's placement as a pure function, and `rebalance` on ranks simulated by threads
(on CPU; the real 2-process step: test_rank_balance_two_ranks.py)."""

from __future__ import annotations

import dataclasses
import random
import threading
from types import SimpleNamespace

import pytest
import torch

from stare_tir.trainer.rank_balance import (
    FILLED_LATER,
    MOVED,
    balanced_placement,
    max_over_mean,
    rebalance,
    seq_tokens,
)
from stare_tir.trainer.shaping import StepBatch


def loads(placement, costs):
    return [sum(costs[r][i] for r, i in members) for members in placement]


def assert_is_a_placement(placement, costs):
    """Every trajectory exactly once, each rank's in gathered order."""
    every = sorted(p for members in placement for p in members)
    assert every == [(r, i) for r in range(len(costs)) for i in range(len(costs[r]))]
    assert all(members == sorted(members) for members in placement)


def round_robin(lengths, world):
    return [lengths[r::world] for r in range(world)]


def test_a_skewed_round_robin_split_is_balanced_to_within_five_percent():
    g = random.Random(0)
    lengths = [g.randint(900, 1400) if k % 2 == 0 else g.randint(40, 200) for k in range(16)]
    costs = round_robin(lengths, 2)
    assert max_over_mean([sum(c) for c in costs]) > 1.5  # rank 0 rolled out every long response
    placement = balanced_placement(costs)
    assert_is_a_placement(placement, costs)
    assert max_over_mean(loads(placement, costs)) <= 1.05


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_random_batches_end_no_worse_and_within_one_trajectory_of_even(world):
    g = random.Random(world)
    for _ in range(50):
        lengths = [int(g.lognormvariate(6, 1)) + 1 for _ in range(g.randint(world, 8 * world))]
        costs = round_robin(lengths, world)
        placement = balanced_placement(costs)
        assert_is_a_placement(placement, costs)
        assert max(loads(placement, costs)) <= max(sum(c) for c in costs)
        # Not a proven bound of the differencing method, but what it reaches on such batches.
        assert max(loads(placement, costs)) <= sum(lengths) / world + max(lengths)


def test_a_balanced_split_stays_where_it_is():
    costs = [[10, 1], [1, 10]]
    assert balanced_placement(costs) == [[(0, 0), (0, 1)], [(1, 0), (1, 1)]]


def test_the_fewest_tokens_move():
    """Rank 0 keeps one long trajectory and rank 1 one short one: one trade each way, not a swap
    of both ranks' whole shares."""
    costs = [[100, 90], [10, 12]]
    placement = balanced_placement(costs)
    assert loads(placement, costs) == [110, 102]  # the best split: {100, 10} and {90, 12}
    kept = [sum(1 for r, _ in members if r == dest) for dest, members in enumerate(placement)]
    assert kept == [1, 1]


def test_fewer_trajectories_than_ranks_leave_ranks_empty():
    costs = [[5, 7], [], [], []]
    placement = balanced_placement(costs)
    assert_is_a_placement(placement, costs)
    assert sorted(loads(placement, costs)) == [0, 0, 5, 7]
    assert balanced_placement([[], []]) == [[], []]
    assert balanced_placement([[3, 4]]) == [[(0, 0), (0, 1)]]  # one rank: nothing to balance


def test_every_per_trajectory_field_of_the_step_batch_is_moved_or_filled_later():
    """A new per-trajectory list on StepBatch must be moved with its trajectory (or filled after)."""
    lists = {f.name for f in dataclasses.fields(StepBatch) if str(f.type).startswith("list")}
    assert lists - {"rolled"} == set(MOVED) | set(FILLED_LATER)


class ThreadRank:
    """One of `world` ranks simulated by threads: all_gather_object through a barrier."""

    def __init__(self, rank, world, shared, barrier):
        self.rank, self.world_size, self.shared, self.barrier = rank, world, shared, barrier
        self.gathers = 0

    def all_gather_object(self, obj):
        self.gathers += 1
        self.barrier.wait()
        self.shared[self.rank] = obj
        self.barrier.wait()
        parts = [self.shared[r] for r in range(self.world_size)]
        self.barrier.wait()
        return parts


def traj(n_resp, tag):
    return SimpleNamespace(prompt_ids=[1, 2], response_ids=[3] * n_resp, tag=tag)


def run_ranks(shares, enabled=True):
    """`rebalance` on one thread per share (each a list of (response length, advantage, penalty))."""
    world = len(shares)
    shared, barrier, out, errors = {}, threading.Barrier(world), {}, []

    def rank(r):
        try:
            batch = StepBatch(
                trajs=[traj(n, (r, i)) for i, (n, _, _) in enumerate(shares[r])],
                rolled=[],
                metrics={},
                advantages=[a for _, a, _ in shares[r]],
                penalties=[p for _, _, p in shares[r]],
            )
            learner = ThreadRank(r, world, shared, barrier)
            rebalance(learner, batch, enabled)
            out[r] = (batch, learner.gathers)
        except BaseException as e:  # the barrier breaks for the others: report the first error
            barrier.abort()
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [out[r] for r in range(world)]


def test_trajectories_move_with_their_advantage_and_penalty():
    shares = [
        [(300, 1.0, -0.5), (280, -1.0, 0.0), (260, 0.5, -0.25), (250, -0.5, 0.0)],
        [(10, 1.0, 0.0), (12, -1.0, 0.0), (8, 0.25, 0.0), (9, -0.25, 0.0)],
    ]
    out = run_ranks(shares)
    rows = sorted(
        (t.tag, len(t.response_ids), a, p)
        for batch, _ in out
        for t, a, p in zip(batch.trajs, batch.advantages, batch.penalties)
    )
    assert rows == sorted(((r, i), n, a, p) for r, share in enumerate(shares) for i, (n, a, p) in enumerate(share))
    tokens = [sum(seq_tokens(t) for t in batch.trajs) for batch, _ in out]
    metrics = out[0][0].metrics
    assert metrics == out[1][0].metrics | {"time/balance": metrics["time/balance"]}  # every rank logs alike
    assert metrics["balance/tokens_max_mean_before"] == pytest.approx((1090 + 8) / ((1090 + 39 + 16) / 2))
    assert metrics["balance/tokens_max_mean_after"] == pytest.approx(max_over_mean(tokens))
    assert metrics["balance/tokens_max_mean_after"] < 1.05
    assert metrics["balance/moved_trajectories"] > 0
    assert all(gathers == 2 for _, gathers in out)  # the lengths, then the trajectories


def test_disabled_it_measures_and_moves_nothing():
    shares = [[(300, 1.0, 0.0), (280, -1.0, 0.0)], [(10, 1.0, 0.0), (12, -1.0, 0.0)]]
    out = run_ranks(shares, enabled=False)
    assert [[t.tag for t in batch.trajs] for batch, _ in out] == [[(0, 0), (0, 1)], [(1, 0), (1, 1)]]
    m = out[0][0].metrics
    assert m["balance/tokens_max_mean_after"] == m["balance/tokens_max_mean_before"] > 1.5
    assert m["balance/moved_trajectories"] == 0
    assert all(gathers == 1 for _, gathers in out)  # no exchange when nothing moves


def test_one_process_is_left_alone():
    batch = StepBatch([traj(5, 0)], [], {}, [1.0], [0.0])
    rebalance(SimpleNamespace(rank=0, world_size=1), batch)
    assert batch.metrics == {} and batch.advantages == [1.0]


def test_it_refuses_a_batch_before_score_or_after_recompute():
    learner = SimpleNamespace(rank=0, world_size=2)
    with pytest.raises(ValueError, match="after score"):
        rebalance(learner, StepBatch([traj(5, 0)], [], {}))
    late = StepBatch([traj(5, 0)], [], {}, [1.0], [0.0], old_logprobs=[torch.zeros(5)])
    with pytest.raises(ValueError, match="before the recompute|between score"):
        rebalance(learner, late)
