"""verl's partition of a training batch into per-GPU micro-batches, as a pure function.

The official STARE runs (hp-luo/STARE, a verl v0.7 fork) and the baselines run on verl (JustRL,
KL-Cov, Clip-Cov, the 80/20 rule, STEER) select tokens and average the loss inside each GPU's
micro-batch, so which tokens are selected depends on how verl cuts the batch. Two layouts, by the
verl version the authors ran (`VerlPartitionConfig.layout`):

workload_interleaved (verl >= 0.6.1; hp-luo/STARE; volcengine/verl@f9c855f7 (v0.7.0)
  verl/trainer/ppo/ray_trainer.py `_balance_batch` L1106-1141, verl/utils/seqlen_balancing.py
  `rearrange_micro_batches` L348-422):
  1. every sequence's workload w = 24576 L + L^2 (L = prompt + response tokens, its attention-mask
     sum; `calculate_workload`) is split over the R data-parallel ranks into R equal-size sets
     balanced by the Karmarkar-Karp largest differencing method; each set is sorted by (w, index)
     and folded (even positions, then the odd ones reversed); rank r gets set r in that order.
  2. each rank cuts its share into mini-batches of consecutive positions (dp_actor.update_policy:
     `data.split(ppo_mini_batch_size)`), so with several mini-batches each holds sequences of
     similar length (the first the shortest);
  3. each mini-batch is split into m = min(n_r, ceil(sum L / budget)) micro-batches (the largest m
     over ranks, all-reduced so that ranks step together) balanced by the same method on w.
seqlen_index_order (verl <= 0.6.0; thunlp/JustRL's vendored verl 0.4.0, verl at the KL-Cov /
  Clip-Cov merge 39b7250b, the 80/20 authors' fork of verl 6cf90ceb; volcengine/verl@07584894
  (v0.4.0) verl/trainer/ppo/ray_trainer.py `_balance_batch` L932-943, seqlen_balancing.py
  `get_seqlen_balanced_partitions` L144-185 and `rearrange_micro_batches` L230-278):
  1. the sequence lengths L themselves (no workload) are split into world-size equal-size sets
     (ranks x sequence-parallel size: balance_batch used `actor_rollout_wg.world_size`), each set
     sorted by batch index (`_check_and_sort_partitions`); a data-parallel rank gets sp
     consecutive sets (dispatch chunks the reordered batch by rank; Ulysses gathers the sp chunks
     of its group in order);
  2. the same consecutive mini-batches, which now mix lengths (batch order is generation order);
  3. the same micro-batch count, balanced on L.

`verl_micro_batches` returns the micro-batches as lists of indices into the batch, rank by rank.
Indices follow the batch order (verl's: groups in generation order, each group's samples in order),
which decides ties. The differencing method below is written to make the same choices as verl's
`karmarkar_karp` (same sort keys, same heap order; the function is the same in every version
above), so the sets are equal, not merely as balanced.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Literal, Sequence

Layout = Literal["workload_interleaved", "seqlen_index_order"]
LAYOUTS: tuple[str, ...] = ("workload_interleaved", "seqlen_index_order")


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


def _balance_values(seq_lens: Sequence[int], layout: Layout) -> list[int]:
    """What verl balances: workloads (>= 0.6.1) or the lengths themselves (<= 0.6.0)."""
    if layout == "workload_interleaved":
        return [workload(int(n)) for n in seq_lens]
    if layout == "seqlen_index_order":
        return [int(n) for n in seq_lens]
    raise ValueError(f"layout={layout!r}: one of {', '.join(LAYOUTS)}")


def rank_shares(
    seq_lens: Sequence[int], ranks: int, layout: Layout = "workload_interleaved", sequence_parallel: int = 1
) -> list[list[int]]:
    """balance_batch: each data-parallel rank's indices, in the order verl hands them to the rank.

    workload_interleaved: its set sorted by (workload, index), then the even positions followed by
    the odd ones reversed. seqlen_index_order: ranks x sequence_parallel sets balanced on length,
    each in index order, rank r taking sets r*sp .. r*sp + sp - 1 one after the other. Falls back to
    sets of unequal size when the batch does not divide, and to one set per rank when it has fewer
    sequences than ranks x sp (verl would refuse either batch; a batch that dynamic sampling filled
    only in part can be one)."""
    values = _balance_values(seq_lens, layout)
    if layout == "workload_interleaved":
        sets = balanced_partition(values, ranks, equal_size=len(values) % ranks == 0)
        shares = []
        for s in sets:
            s = sorted(s, key=lambda i: (values[i], i))
            shares.append(s[::2] + s[1::2][::-1])
        return shares
    sp = sequence_parallel if len(values) >= ranks * sequence_parallel else 1
    world = ranks * sp
    sets = balanced_partition(values, world, equal_size=len(values) % world == 0)  # each in index order
    return [[i for s in sets[r * sp : (r + 1) * sp] for i in s] for r in range(ranks)]


def _check_budget(seq_lens: Sequence[int], token_budget: int) -> None:
    longest = max(int(n) for n in seq_lens)
    if longest > token_budget:
        raise ValueError(
            f"a sequence of {longest} tokens exceeds algo.verl_partition.token_budget={token_budget} "
            "(verl requires ppo_max_token_len_per_gpu >= the longest sequence); raise the budget"
        )


def _micro_batches(
    seq_lens: Sequence[int],
    chunks: list[list[int]],
    token_budget: int,
    layout: Layout,
    micro_batch_size: int | None = None,
) -> list[list[list[int]]]:
    """rearrange_micro_batches on every rank's chunk of one mini-batch: as many micro-batches on every
    rank (verl all-reduces MAX), each chunk split by the differencing method, sizes free. With
    micro_batch_size (no dynamic batching), consecutive runs of that many sequences instead."""
    if micro_batch_size is not None:
        return [[c[k : k + micro_batch_size] for k in range(0, len(c), micro_batch_size)] for c in chunks]
    n_micro = max((min(len(c), -(-sum(int(seq_lens[i]) for i in c) // token_budget)) for c in chunks if c), default=0)
    per_rank = []
    for c in chunks:
        if not c:
            per_rank.append([])
            continue
        local = balanced_partition(_balance_values([seq_lens[i] for i in c], layout), min(n_micro, len(c)), False)
        per_rank.append([[c[k] for k in mb] for mb in local])
    return per_rank


def verl_micro_batches(
    seq_lens: Sequence[int],
    ranks: int,
    token_budget: int,
    layout: Layout = "workload_interleaved",
    sequence_parallel: int = 1,
    micro_batch_size: int | None = None,
) -> list[list[list[int]]]:
    """verl's micro-batches of one on-policy update: per rank, the lists of batch indices of each
    micro-batch (use_dynamic_bsz with ppo_max_token_len_per_gpu = token_budget, one mini-batch).

    seq_lens: prompt + response tokens of each sequence, in batch order. Raises when a sequence is
    longer than the budget (verl asserts the same) or the batch has fewer sequences than ranks.
    """
    return verl_mini_batches(seq_lens, ranks, token_budget, 1, layout, sequence_parallel, micro_batch_size)[0]


def verl_mini_batches(
    seq_lens: Sequence[int],
    ranks: int,
    token_budget: int,
    n_mini: int,
    layout: Layout = "workload_interleaved",
    sequence_parallel: int = 1,
    micro_batch_size: int | None = None,
) -> list[list[list[list[int]]]]:
    """verl's layout of an update with n_mini mini-batches: per mini-batch, per rank, the batch
    indices of each micro-batch. balance_batch runs once over the whole batch (`rank_shares`); each
    rank cuts its share, in the order it was handed, into n_mini consecutive runs
    (`DataProto.split(ppo_mini_batch_size)` in dp_actor.update_policy); each run is split into
    micro-batches as rearrange_micro_batches does (micro-batch count all-reduced per mini-batch).
    n_mini = 1 gives `[verl_micro_batches(...)]`. The budget is checked only under dynamic batching
    (micro_batch_size None)."""
    if n_mini < 1:
        raise ValueError(f"n_mini={n_mini!r}: must be >= 1")
    if not seq_lens:
        return [[[] for _ in range(ranks)] for _ in range(n_mini)]
    if micro_batch_size is None:
        _check_budget(seq_lens, token_budget)
    shares = rank_shares(seq_lens, ranks, layout, sequence_parallel)
    runs = []
    for share in shares:
        size = -(-len(share) // n_mini)
        runs.append([share[j * size : (j + 1) * size] for j in range(n_mini)])
    return [
        _micro_batches(seq_lens, [r[j] for r in runs], token_budget, layout, micro_batch_size) for j in range(n_mini)
    ]


@dataclass
class VerlPartitionConfig:
    """The official runs' layout, for selection groups and aggregation that equal theirs (scope=verl,
    loss_agg=verl): verl's balance_batch over `ranks` data-parallel GPUs, then dynamic batching of
    each rank's share into micro-batches of about `token_budget` tokens (prompt + response), or
    micro-batches of `micro_batch_size` sequences where the run did not batch dynamically."""

    # Data-parallel GPUs of the official run (recipe/STARE scripts: 2 nodes x 8 GPUs); GPUs /
    # sequence_parallel.
    ranks: int = 16
    # actor.ppo_max_token_len_per_gpu of the official scripts: (1024 + 3072) * 2 (times the
    # Ulysses size where it is > 1: dp_actor multiplies the budget by it).
    token_budget: int = 8192
    # How the verl version the authors ran orders the batch (module docstring):
    # workload_interleaved (verl >= 0.6.1: hp-luo/STARE's v0.7 fork, verl's recipes today): each
    # rank's share sorted by workload and folded, so each mini-batch holds similar lengths;
    # seqlen_index_order (verl <= 0.6.0: JustRL's vendored 0.4.0, the KL-Cov / Clip-Cov merge, the
    # 80/20 fork, STEER's 0.4.1 fork): balanced on length, each share in generation order, so each
    # mini-batch mixes lengths. With one mini-batch the two differ only in what is balanced.
    layout: Layout = "workload_interleaved"
    # Ulysses sequence-parallel size of the run. seqlen_index_order balances over the world size
    # (ranks x sequence_parallel sets, each rank taking sp consecutive ones); workload_interleaved
    # over the ranks (verl >= 0.7.0, volcengine/verl#4697), where this is not read.
    sequence_parallel: int = 1
    # actor.ppo_micro_batch_size_per_gpu of a run without use_dynamic_bsz: each rank's mini-batch
    # cut into consecutive runs of this many sequences (dp_actor `mini_batch.split`), the token
    # budget unused. None: dynamic batching by token_budget (every run here but STEER's).
    micro_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError(f"ranks={self.ranks!r}: must be >= 1")
        if self.token_budget < 1:
            raise ValueError(f"token_budget={self.token_budget!r}: must be >= 1")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r}: one of {', '.join(LAYOUTS)}")
        if self.sequence_parallel < 1:
            raise ValueError(f"sequence_parallel={self.sequence_parallel!r}: must be >= 1")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size={self.micro_batch_size!r}: must be >= 1 or null")
