"""verl's partition of a batch (stare_tir.algos.verl_partition): the sets verl's own code makes, and the
aggregation that reproduces verl's per-micro-batch token-mean. CPU only."""

from __future__ import annotations

import random

import pytest
import torch

from stare_tir.algos.policy_loss import Clip, LossInputs, clip_loss
from stare_tir.algos.verl_partition import balanced_partition, rank_shares, verl_micro_batches, workload

# Outputs of verl's own `seqlen_balancing.get_seqlen_balanced_partitions` / `_balance_batch` /
# `rearrange_micro_batches` (hp-luo/STARE, verl v0.7) on these inputs, run once and pinned; ties
# (equal values) are where a different differencing implementation would diverge.
VERL_EQ4 = [[6, 7], [0, 1], [3, 4], [2, 5]]
VERL_FREE3 = [[0, 3, 4], [5, 6], [1, 2, 7]]
LENS = [300, 1200, 700, 700, 2500, 90, 90, 4000, 1500, 640, 640, 2200, 300, 1800, 950, 3100]
VERL_SHARES = [[5, 14, 7, 9], [6, 1, 15, 10], [0, 8, 4, 2], [12, 13, 11, 3]]
VERL_MICRO_BATCHES = [[[7], [5, 14, 9]], [[15], [6, 1, 10]], [[4], [0, 8, 2]], [[12, 11], [13, 3]]]


def test_partitions_equal_verls_own_including_ties():
    vals = [5, 5, 5, 5, 3, 3, 9, 1]
    assert balanced_partition(vals, 4, equal_size=True) == VERL_EQ4
    assert balanced_partition(vals, 3, equal_size=False) == VERL_FREE3
    assert rank_shares(LENS, 4) == VERL_SHARES
    assert verl_micro_batches(LENS, 4, token_budget=4096) == VERL_MICRO_BATCHES


def test_partition_invariants_on_random_batches():
    rng = random.Random(0)
    for _ in range(30):
        n, k = rng.choice([(16, 4), (64, 16), (48, 8), (10, 3)])
        lens = [rng.randint(40, 3000) for _ in range(n)]
        per_rank = verl_micro_batches(lens, k, token_budget=4096)
        flat = sorted(i for mbs in per_rank for mb in mbs for i in mb)
        assert flat == list(range(n))  # every sequence in exactly one micro-batch
        assert len({len(mbs) for mbs in per_rank}) == 1  # every rank runs as many micro-batches
        if n % k == 0:
            assert {sum(len(mb) for mb in mbs) for mbs in per_rank} == {n // k}  # equal shares
        loads = [sum(workload(lens[i]) for mb in mbs for i in mb) for mbs in per_rank]
        assert max(loads) - min(loads) <= max(workload(x) for x in lens)  # balanced within one item


def test_budget_and_size_errors_say_what_to_change():
    with pytest.raises(ValueError, match=r"5000 tokens exceeds algo.verl_partition.token_budget=4096"):
        verl_micro_batches([100, 5000], 2, 4096)
    with pytest.raises(ValueError, match="cannot fill"):
        balanced_partition([1, 2], 3, equal_size=False)
    # A batch that does not divide by the ranks (a dropped sample): unequal shares, nothing lost.
    per_rank = verl_micro_batches([100] * 7, 2, 4096)
    assert sorted(i for mbs in per_rank for mb in mbs for i in mb) == list(range(7))


def test_verl_aggregation_as_token_weights_equals_verls_loss():
    """sum over micro-batches g of rows_g / N * token-mean_g == the learner's global token-mean of
    the loss weighted by c_t G (trainer.shaping.verl_aggregation_weights' formula)."""
    g = torch.Generator().manual_seed(0)
    n, t = 8, 30
    logp = -torch.rand(n, t, generator=g) * 3
    old = logp + 0.1 * torch.randn(n, t, generator=g)
    adv = torch.randn(n, 1, generator=g).expand(n, t).contiguous()
    lengths = torch.randint(5, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None] < lengths[:, None]).float()
    groups = [[0, 3, 5], [1, 2], [4], [6, 7]]
    verl = sum(
        len(mb) / n * clip_loss(LossInputs(logp[mb], old[mb], adv[mb], mask[mb], clip=Clip(low=0.2, high=0.28)))[0]
        for mb in groups
    )
    total = float(mask.sum())
    w = torch.ones(n, t)
    for mb in groups:
        w[mb] = len(mb) / n / float(mask[mb].sum()) * total
    ours, _ = clip_loss(
        LossInputs(logp, old, adv, mask, clip=Clip(low=0.2, high=0.28), token_weights=w, global_tokens=total)
    )
    assert ours.item() == pytest.approx(verl.item(), rel=1e-5)
