"""The two verl layouts (algo.verl_partition.layout): each reproduces its verl version's assignment of
sequences to ranks, mini-batches and micro-batches on a fixed batch, and every 7B recipe names the
layout of the verl its authors ran. CPU only.

How the pinned assignments were made: each version's own `verl/utils/seqlen_balancing.py`
(`get_seqlen_balanced_partitions`, `calculate_workload`) was executed on LENS, driven by the
orchestration written out in `_verl_layout` below (balance_batch, dispatch, `split` into mini-batches,
the all-reduced micro-batch count), and its output pasted here. The three verl <= 0.6.0 sources gave
the same assignment:
  thunlp/JustRL@cf444e9920b599c865ee6742c88dc162dcabcec2:train/verl (version 0.4.0; its
    seqlen_balancing.py is byte-identical to volcengine/verl@07584894 (v0.4.0))
  volcengine/verl@39b7250b0a7a6859f18da63210a735d874e068e8 (the KL-Cov / Clip-Cov merge)
  Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR@6f5dda6f70dbee207bea28705e5f96ce12eb98df (the 80/20 fork of
    volcengine/verl@6cf90ceb; seqlen_balancing.py byte-identical to it)
and verl >= 0.6.1 from volcengine/verl@f9c855f7 (v0.7.0), whose seqlen_balancing.py hp-luo/STARE
(@bffb9e79) carries unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stare_tir.algos.verl_partition import (
    VerlPartitionConfig,
    balanced_partition,
    rank_shares,
    verl_micro_batches,
    verl_mini_batches,
    workload,
)
from stare_tir.config import load_config
from stare_tir.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]

# 32 sequences (4 groups of 8 in generation order), prompt + response tokens; ties at 1024 and 640.
LENS = [1773, 2230, 2319, 2973, 577, 1024, 1654, 1022, 1286, 640, 1020, 577, 2429, 136, 510, 741,
        2204, 1024, 1341, 2940, 2696, 1650, 640, 1759, 2931, 2844, 1435, 1567, 401, 1487, 1024, 2628]  # fmt: skip

# verl <= 0.6.0, 4 data-parallel ranks, no sequence parallelism, 6000 tokens per GPU, 2 mini-batches.
OLD_R4_SHARES = [
    [3, 10, 11, 16, 20, 28, 29, 30],
    [0, 5, 8, 9, 14, 19, 27, 31],
    [4, 6, 7, 12, 15, 18, 23, 25],
    [1, 2, 13, 17, 21, 22, 24, 26],
]
OLD_R4_MINI = [  # [mini-batch][rank][micro-batch] -> batch indices, each sorted
    [[[3, 11], [10, 16]], [[0, 9], [5, 8]], [[4, 12], [6, 7]], [[1, 17], [2, 13]]],
    [[[20], [28, 29, 30]], [[14, 19], [27, 31]], [[15, 25], [18, 23]], [[21, 26], [22, 24]]],
]
# verl <= 0.6.0, 2 data-parallel ranks x Ulysses 2 (world 4), 12000 tokens per rank, 2 mini-batches.
OLD_R2SP2_SHARES = [
    [3, 10, 11, 16, 20, 28, 29, 30, 0, 5, 8, 9, 14, 19, 27, 31],
    [4, 6, 7, 12, 15, 18, 23, 25, 1, 2, 13, 17, 21, 22, 24, 26],
]
OLD_R2SP2_MINI = [
    [[[3, 10, 16], [11, 20, 28, 29, 30]], [[4, 7, 23, 25], [6, 12, 15, 18]]],
    [[[0, 8, 14, 31], [5, 9, 19, 27]], [[1, 17, 24], [2, 13, 21, 22, 26]]],
]
# verl >= 0.6.1 (v0.7.0), 4 ranks, 6000 tokens per GPU, 2 mini-batches.
NEW_R4_SHARES = [
    [14, 5, 29, 31, 19, 0, 8, 15],
    [4, 7, 6, 2, 3, 1, 30, 11],
    [13, 10, 21, 12, 25, 16, 26, 9],
    [28, 17, 27, 20, 24, 23, 18, 22],
]
NEW_R4_MINI = [
    [[[5, 14, 29, 31]], [[2, 4, 6, 7]], [[10, 12, 13, 21]], [[17, 20, 27, 28]]],
    [[[0, 8, 15], [19]], [[1, 30], [3, 11]], [[9, 25], [16, 26]], [[18, 23], [22, 24]]],
]


def _sorted(layout: list) -> list:
    """Micro-batches as sorted index lists, in sorted order (their order on a rank is the gradient
    accumulation order, which the loss does not see)."""
    return [[sorted(sorted(mb) for mb in per_rank) for per_rank in mini] for mini in layout]


def _verl_layout(lens, ranks, sp, budget, n_mini, old):
    """Each version's orchestration, written from its source, on the differencing method that
    `test_algos_verl_partition.py` pins to verl's `karmarkar_karp` (unchanged from v0.4.0 to v0.7.0).

    old (verl <= 0.6.0), volcengine/verl@07584894 (v0.4.0):
      ray_trainer.py L936-941: lengths = attention-mask sums; get_seqlen_balanced_partitions(lengths,
        k_partitions=world_size, equal_size=True), each partition sorted by index
        (seqlen_balancing.py L172-182); batch.reorder(concatenation).
      DP_COMPUTE_PROTO dispatch chunks the batch by world rank; fsdp_workers.update_actor
        ulysses_sharding_manager.preprocess_data all-gathers the sp chunks of a group in order.
      dp_actor.py L340: batch.split(ppo_mini_batch_size) (normalised per dp rank).
      seqlen_balancing.py L249-266: m = min(n, ceil(sum L / max_token_len)), all_reduce MAX,
        get_seqlen_balanced_partitions(L, m, equal_size=False).
    new (verl >= 0.6.1), volcengine/verl@f9c855f7 (v0.7.0):
      ray_trainer.py L1108-1137: workloads = calculate_workload(lengths); partitions over dp_size;
        each sorted by (workload, index) then partition[::2] + partition[1::2][::-1].
      seqlen_balancing.py L385-402: the same m, partitions of the workloads.
    """
    values = list(lens) if old else [workload(n) for n in lens]
    parts = balanced_partition(values, ranks * sp if old else ranks, equal_size=True)
    if not old:
        parts = [sorted(p, key=lambda x: (values[x], x)) for p in parts]
        parts = [p[::2] + p[1::2][::-1] for p in parts]
    order = [i for p in parts for i in p]
    per = len(order) // ranks
    shares = [order[r * per : (r + 1) * per] for r in range(ranks)]
    size = per // n_mini
    out = []
    for j in range(n_mini):
        chunks = [s[j * size : (j + 1) * size] for s in shares]
        m = max(min(len(c), -(-sum(lens[i] for i in c) // budget)) for c in chunks)
        out.append(
            [
                [[c[k] for k in mb] for mb in balanced_partition([values[i] for i in c], m, equal_size=False)]
                for c in chunks
            ]
        )
    return shares, out


@pytest.mark.parametrize(
    "layout, ranks, sp, budget, shares, mini",
    [
        ("seqlen_index_order", 4, 1, 6000, OLD_R4_SHARES, OLD_R4_MINI),
        ("seqlen_index_order", 2, 2, 12000, OLD_R2SP2_SHARES, OLD_R2SP2_MINI),
        ("workload_interleaved", 4, 1, 6000, NEW_R4_SHARES, NEW_R4_MINI),
    ],
)
def test_each_layout_reproduces_its_verl_versions_assignment(layout, ranks, sp, budget, shares, mini):
    assert rank_shares(LENS, ranks, layout, sequence_parallel=sp) == shares
    got = verl_mini_batches(LENS, ranks, budget, 2, layout=layout, sequence_parallel=sp)
    assert _sorted(got) == mini
    ref_shares, ref_mini = _verl_layout(LENS, ranks, sp, budget, 2, old=layout == "seqlen_index_order")
    assert ref_shares == shares and _sorted(ref_mini) == mini


def test_old_layout_mixes_lengths_the_new_one_sorts_them():
    """What the switch changes: on a batch of 16 mini-batches per rank (the 80/20 and DAPO shape),
    verl <= 0.6.0's mini-batches hold lengths as mixed as the batch; verl >= 0.6.1's go from short to
    long and back, each of similar lengths."""
    import random

    rng = random.Random(1)
    lens = [rng.randint(200, 16000) for _ in range(512)]
    spread = {}
    for layout in ("seqlen_index_order", "workload_interleaved"):
        mini = verl_mini_batches(lens, 4, 200_000, 16, layout=layout)
        means = [sum(lens[i] for r in m for mb in r for i in mb) / sum(len(mb) for r in m for mb in r) for m in mini]
        spread[layout] = max(means) / min(means)
    assert spread["seqlen_index_order"] < 1.6  # every mini-batch near the batch's mean length
    assert spread["workload_interleaved"] > 5.0  # shortest to longest


def test_fixed_micro_batches_are_consecutive_runs():
    """A run without use_dynamic_bsz (STEER's: ppo_micro_batch_size_per_gpu=8): dp_actor cuts each
    rank's mini-batch into consecutive runs of that many sequences; no token budget applies."""
    mini = verl_mini_batches(LENS, 4, 1, 2, layout="seqlen_index_order", micro_batch_size=2)
    assert mini[0][0] == [[3, 10], [11, 16]]  # OLD_R4_SHARES[0] cut into mini-batches of 4, then runs of 2
    assert mini[1][3] == [[21, 22], [24, 26]]
    assert verl_micro_batches(LENS, 4, 1, layout="seqlen_index_order", micro_batch_size=8)[0] == [OLD_R4_SHARES[0]]


def test_one_mini_batch_layouts_differ_only_in_what_is_balanced():
    old = verl_micro_batches(LENS, 4, 6000, layout="seqlen_index_order")
    assert sorted(sorted(i for mb in r for i in mb) for r in old) == sorted(sorted(s) for s in OLD_R4_SHARES)


def test_small_batches_still_get_a_layout():
    """Fewer sequences than ranks x sp (a batch dynamic sampling filled only in part; verl would
    refuse it): one set per rank, nothing lost; a batch that does not divide: unequal sets."""
    for n in (6, 30):
        per_rank = verl_micro_batches(LENS[:n], 4, 6000, layout="seqlen_index_order", sequence_parallel=2)
        assert sorted(i for r in per_rank for mb in r for i in mb) == list(range(n))


def test_config_checks_and_names_the_choices():
    with pytest.raises(ValueError, match="workload_interleaved, seqlen_index_order"):
        VerlPartitionConfig(layout="sorted")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sequence_parallel"):
        VerlPartitionConfig(sequence_parallel=0)
    with pytest.raises(ValueError, match="micro_batch_size"):
        VerlPartitionConfig(micro_batch_size=0)


# The verl each recipe's authors ran: ranks, Ulysses size, layout.
RECIPES = {
    "justrl": (32, 1, "seqlen_index_order"),  # vendored verl 0.4.0
    "kl_cov": (32, 1, "seqlen_index_order"),  # verl at the merge, 39b7250b
    "clip_cov": (32, 1, "seqlen_index_order"),
    "entropy_80_20": (16, 8, "seqlen_index_order"),  # fork of verl 6cf90ceb (< 0.6.1), 16 nodes x 8 / sp 8
    "dapo": (16, 8, "workload_interleaved"),  # the recipe at verl 246cac4 (> 0.7.0)
    "stare_official": (16, 1, "workload_interleaved"),  # hp-luo/STARE, verl 0.7.0.dev
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_names_its_authors_verl_layout(name):
    cfg = load_config(TrainConfig, ROOT / "configs" / f"retool_qwen2.5_7b_{name}.yaml", [])
    vp = cfg.algo.verl_partition
    assert (vp.ranks, vp.sequence_parallel, vp.layout) == RECIPES[name]


def test_the_trainers_mini_batches_follow_the_configured_layout():
    """trainer.mini_batches.mini_batch_plan (one rank holding the whole batch) hands each mini-batch
    the trajectories of its verl version's mini-batch, and their micro-batches as positions in it."""
    from types import SimpleNamespace

    from stare_tir.train_config import AlgoConfig
    from stare_tir.trainer.mini_batches import mini_batch_plan

    class OneRank:
        def all_gather_flat(self, t):
            return t, range(0, len(t))

    trajs = [SimpleNamespace(prompt_ids=[0] * 100, response_ids=[0] * (n - 100)) for n in LENS]
    for layout, expected in (("seqlen_index_order", OLD_R4_MINI), ("workload_interleaved", NEW_R4_MINI)):
        vp = VerlPartitionConfig(ranks=4, token_budget=6000, layout=layout)
        algo = AlgoConfig(scope="verl", loss_agg="verl", verl_partition=vp)
        members, layouts = mini_batch_plan(OneRank(), trajs, algo, 2)  # type: ignore[arg-type]
        for m, lay, want in zip(members, layouts, expected):
            assert m == sorted(i for r in want for mb in r for i in mb)
            assert _sorted([[[[m[p] for p in mb] for mb in r] for r in lay]]) == [want]


def test_steer_header_offers_its_authors_groups():
    """The overrides the STEER config's header gives reproduce STEER's groups: 1 node x 8 GPUs,
    micro-batches of 8 sequences (4 per GPU per mini-batch of 32 prompts x 8 rollouts)."""
    path = ROOT / "configs" / "retool_qwen2.5_7b_steer.yaml"
    header = path.read_text().split("\nbase:")[0]
    line = next(x for x in header.splitlines() if "algo.verl_partition.layout" in x)
    overrides = (
        header.splitlines()[header.splitlines().index(line) - 1].lstrip("# ").split() + line.lstrip("# ").split()
    )
    cfg = load_config(TrainConfig, path, overrides)
    a, vp = cfg.algo, cfg.algo.verl_partition
    assert (a.scope, a.loss_agg, vp.ranks, vp.layout, vp.micro_batch_size) == (
        "verl",
        "verl",
        8,
        "seqlen_index_order",
        8,
    )
    k = a.mini_batches(cfg.trainer.prompts_per_step)
    lens = [200 + (37 * i) % 3000 for i in range(cfg.trainer.prompts_per_step * cfg.rollout.n_per_prompt)]
    mini = verl_mini_batches(lens, vp.ranks, vp.token_budget, k, vp.layout, vp.sequence_parallel, vp.micro_batch_size)
    assert {len(mb) for m in mini for r in m for mb in r} == {8}
    assert {len(r) for m in mini for r in m} == {4}
