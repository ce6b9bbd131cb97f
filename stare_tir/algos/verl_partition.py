"""verl's partition of a training batch into per-GPU micro-batches, as a pure function.

The official STARE runs (hp-luo/STARE, a verl v0.7 fork) select STARE's tokens and average the loss
inside each GPU's micro-batch, so which tokens are selected depends on how verl cuts the batch:

1. `RayPPOTrainer._balance_batch`: every sequence's workload w = 24576 L + L^2 (L = prompt + response
   tokens, its attention-mask sum; `seqlen_balancing.calculate_workload`) is split over the R
   data-parallel ranks into R equal-size sets balanced by the Karmarkar-Karp largest differencing
   method; rank r gets set r.
2. `seqlen_balancing.rearrange_micro_batches` on each rank: m = min(n_r, ceil(sum L / budget))
   micro-batches (the largest m over ranks, all-reduced so that ranks step together), the rank's
   sequences split into m sets balanced by the same method on w, sizes free.

`verl_micro_batches` returns those micro-batches as lists of indices into the batch, rank by rank.
Indices follow the batch order (verl's: groups in generation order, each group's samples in order),
which decides ties. The differencing method below is written to make the same choices as verl's
`karmarkar_karp` (same sort keys, same heap order), so the sets are equal, not merely as balanced.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence


def workload(seq_len: int) -> int:
    """verl's attention-aware cost of one sequence, calibrated for a 7B model (hidden size 4096)."""
    return 24576 * seq_len + seq_len * seq_len


class _Part:
    """One set of a partial partition: its indices with their values, and their sum."""

    __slots__ = ("items", "total")

    def __init__(self, items: list[tuple[int, int]] | None = None) -> None:
        self.items = items or []  # (index, value), in insertion order
        self.total = sum(v for _, v in self.items)

    def key(self) -> tuple:
        return (self.total, len(self.items), self.items)


class _Partial:
    """k sets, kept in decreasing order of (sum, size, items); the heap pops the largest spread first."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[_Part]) -> None:
        self.parts = sorted(parts, key=_Part.key, reverse=True)

    @property
    def spread(self) -> int:
        return self.parts[0].total - self.parts[-1].total

    def __lt__(self, other: _Partial) -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return other.parts[0].key() < self.parts[0].key()

    def absorb(self, other: _Partial) -> None:
        """Difference two partials: this one's largest set takes the other's smallest, and so on."""
        k = len(self.parts)
        for i in range(k):
            mine, theirs = self.parts[i], other.parts[k - 1 - i]
            mine.items = mine.items + theirs.items
            mine.total += theirs.total
        self.parts = sorted(self.parts, key=_Part.key, reverse=True)


def balanced_partition(values: Sequence[int], k: int, equal_size: bool) -> list[list[int]]:
    """Split indices 0..n-1 into k sets of near-equal value sums (largest differencing method).

    equal_size: every set gets n / k indices (n must be a multiple of k). Each set is returned in
    ascending index order, the sets in verl's order. Raises if n < k or a set would be empty.
    """
    n = len(values)
    if n < k:
        raise ValueError(f"{n} items cannot fill {k} non-empty sets")
    if equal_size and n % k:
        raise ValueError(f"equal_size: {n} items do not split into {k} sets of equal size")
    order = sorted((int(v), i) for i, v in enumerate(values))
    heap: list[_Partial] = []
    if equal_size:
        for start in range(0, n, k):
            chunk = order[start : start + k]
            heapq.heappush(heap, _Partial([_Part([(i, v)]) for v, i in chunk]))
    else:
        for v, i in order:
            heapq.heappush(heap, _Partial([_Part([(i, v)])] + [_Part() for _ in range(k - 1)]))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.absorb(second)
        heapq.heappush(heap, first)
    sets = [sorted(i for i, _ in p.items) for p in heap[0].parts]
    if any(not s for s in sets):
        raise ValueError(f"a set of the {k}-way partition of {n} items came out empty")
    return sets


def rank_shares(seq_lens: Sequence[int], ranks: int) -> list[list[int]]:
    """balance_batch: each rank's indices, in the order verl hands them to the rank (its set sorted by
    (workload, index), then the even positions followed by the odd ones reversed). Falls back to
    sets of unequal size when the batch does not divide by `ranks` (verl would refuse such a batch)."""
    loads = [workload(int(n)) for n in seq_lens]
    sets = balanced_partition(loads, ranks, equal_size=len(loads) % ranks == 0)
    shares = []
    for s in sets:
        s = sorted(s, key=lambda i: (loads[i], i))
        shares.append(s[::2] + s[1::2][::-1])
    return shares


def verl_micro_batches(seq_lens: Sequence[int], ranks: int, token_budget: int) -> list[list[list[int]]]:
    """verl's micro-batches of one on-policy update: per rank, the lists of batch indices of each
    micro-batch (use_dynamic_bsz with ppo_max_token_len_per_gpu = token_budget, one mini-batch).

    seq_lens: prompt + response tokens of each sequence, in batch order. Raises when a sequence is
    longer than the budget (verl asserts the same) or the batch has fewer sequences than ranks.
    """
    if not seq_lens:
        return [[] for _ in range(ranks)]
    longest = max(int(n) for n in seq_lens)
    if longest > token_budget:
        raise ValueError(
            f"a sequence of {longest} tokens exceeds algo.verl_partition.token_budget={token_budget} "
            "(verl requires ppo_max_token_len_per_gpu >= the longest sequence); raise the budget"
        )
    shares = rank_shares(seq_lens, ranks)
    # Every rank runs as many micro-batches as the rank that needs the most (verl all-reduces MAX).
    n_micro = max(min(len(s), -(-sum(int(seq_lens[i]) for i in s) // token_budget)) for s in shares)
    out = []
    for share in shares:
        loads = [workload(int(seq_lens[i])) for i in share]
        local = balanced_partition(loads, min(n_micro, len(share)), equal_size=False)
        out.append([[share[j] for j in mb] for mb in local])
    return out


def verl_mini_batches(
    seq_lens: Sequence[int], ranks: int, token_budget: int, n_mini: int
) -> list[list[list[list[int]]]]:
    """verl's layout of an update with n_mini mini-batches: per mini-batch, per rank, the batch
    indices of each micro-batch. balance_batch runs once over the whole batch (`rank_shares`); each
    rank cuts its share, in the order it was handed, into n_mini consecutive runs
    (`DataProto.split(ppo_mini_batch_size)` in dp_actor.update_policy); each run is split into
    micro-batches as `verl_micro_batches` does (micro-batch count all-reduced per mini-batch).
    n_mini = 1 gives `[verl_micro_batches(...)]`."""
    if n_mini < 1:
        raise ValueError(f"n_mini={n_mini!r}: must be >= 1")
    if not seq_lens:
        return [[[] for _ in range(ranks)] for _ in range(n_mini)]
    longest = max(int(n) for n in seq_lens)
    if longest > token_budget:
        raise ValueError(
            f"a sequence of {longest} tokens exceeds algo.verl_partition.token_budget={token_budget} "
            "(verl requires ppo_max_token_len_per_gpu >= the longest sequence); raise the budget"
        )
    shares = rank_shares(seq_lens, ranks)
    runs = []
    for share in shares:
        size = -(-len(share) // n_mini)
        runs.append([share[j * size : (j + 1) * size] for j in range(n_mini)])
    out = []
    for j in range(n_mini):
        chunks = [r[j] for r in runs]
        n_micro = max(
            (min(len(c), -(-sum(int(seq_lens[i]) for i in c) // token_budget)) for c in chunks if c), default=0
        )
        per_rank = []
        for c in chunks:
            if not c:
                per_rank.append([])
                continue
            loads = [workload(int(seq_lens[i])) for i in c]
            local = balanced_partition(loads, min(n_micro, len(c)), equal_size=False)
            per_rank.append([[c[k] for k in mb] for mb in local])
        out.append(per_rank)
    return out


@dataclass
class VerlPartitionConfig:
    """The official runs' layout, for selection groups and aggregation that equal theirs (scope=verl,
    loss_agg=verl): verl's balance_batch over `ranks` data-parallel GPUs, then dynamic batching of
    each rank's share into micro-batches of about `token_budget` tokens (prompt + response)."""

    # GPUs of the official run (recipe/STARE scripts: 2 nodes x 8 GPUs).
    ranks: int = 16
    # actor.ppo_max_token_len_per_gpu of the official scripts: (1024 + 3072) * 2.
    token_budget: int = 8192

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError(f"ranks={self.ranks!r}: must be >= 1")
        if self.token_budget < 1:
            raise ValueError(f"token_budget={self.token_budget!r}: must be >= 1")
