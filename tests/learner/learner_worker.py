"""A fixed two-step RL update, runnable in one process or as one rank of several.

The tests import it (one process, in the pytest worker) and launch it as a script in 2 processes
(env:// rendezvous, as torchrun would set up), then compare what rank 0 saved.

    python tests/learner/learner_worker.py MODEL_DIR OUT.pt --zero-stage 2 --budget 64 [--stare]
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


@dataclass
class Traj:
    """The Trajectory fields the learner reads."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float] = field(default_factory=list)


def make_trajs(n: int, seed: int, vocab: int, max_prompt: int = 12, max_resp: int = 30) -> list[Traj]:
    """Random token sequences of varied lengths; ~20% of response tokens are 'observations'."""
    g = random.Random(seed)
    out = []
    for _ in range(n):
        p = [g.randrange(3, vocab) for _ in range(g.randint(2, max_prompt))]
        r = [g.randrange(3, vocab) for _ in range(g.randint(2, max_resp))]
        m = [1 if g.random() < 0.8 else 0 for _ in r]
        m[0] = 1  # at least one model token
        out.append(Traj(p, r, m, [0.0] * len(r)))
    return out


def make_advantages(n: int, seed: int) -> list[float]:
    g = random.Random(seed + 1)
    return [g.choice([-1.0, -0.5, 0.5, 1.0]) for _ in range(n)]


def stare_weights(learner, trajs, logps, advs, top_p: float = 0.2, w: float = 1.5):
    """STARE-O1 omega selected over the loss tokens of ALL ranks (batch scope), this rank's share."""
    import torch

    from stare_tir.algos.stare import stare_token_weights

    masks = [torch.tensor(t.loss_mask, dtype=torch.bool) for t in trajs]
    s_local = torch.cat([-lp[m] for lp, m in zip(logps, masks)]) if trajs else torch.zeros(0)
    a_local = torch.cat([torch.full((int(m.sum()),), a) for a, m in zip(advs, masks)]) if trajs else torch.zeros(0)
    s_all, mine = learner.all_gather_flat(s_local)
    a_all, _ = learner.all_gather_flat(a_local)
    omega_all, _ = stare_token_weights(s_all, a_all, top_p=top_p, w=w)
    omega = omega_all[mine]
    out, k = [], 0
    for m in masks:
        v = torch.ones(m.numel())
        n = int(m.sum())
        v[m] = omega[k : k + n]
        k += n
        out.append(v)
    return out


def run(
    model_path: str,
    zero_stage: int = 2,
    budget: int = 64,
    stare: bool = False,
    steps: int = 2,
    n_trajs: int = 16,
    lr: float = 1e-3,
    dist_timeout_minutes: float = 120.0,
    save_after_first: str | None = None,
) -> dict:
    """Update steps on a fixed batch; returns metrics per step and the final full weights.

    save_after_first: a directory for a learner checkpoint taken after the first step.
    """
    from transformers import AutoConfig

    from stare_tir.learner.distributed import all_group_timeouts, process_group_timeout

    vocab = AutoConfig.from_pretrained(model_path).vocab_size
    learner = make_learner(model_path, zero_stage, budget, lr, dist_timeout_minutes)
    metrics = []
    for k in range(steps):
        if save_after_first and k == 1:
            learner.save_checkpoint(save_after_first)
        metrics.append(step(learner, n_trajs, vocab, stare))
    weights = {k: v.clone() for k, v in learner.export_weights()}
    return {
        "metrics": metrics,
        "weights": weights,
        "world_size": learner.world_size,
        "rank": learner.rank,
        "pg_timeout": process_group_timeout(),
        "group_timeouts": all_group_timeouts(),
    }


def make_learner(model_path: str, zero_stage: int, budget: int, lr: float = 1e-3, dist_timeout_minutes: float = 120.0):
    from stare_tir.learner import Learner, LearnerConfig

    cfg = LearnerConfig(
        zero_stage=zero_stage,
        lr=lr,
        micro_batch_tokens=budget,
        grad_clip=1.0,
        zero3_persistence_threshold=0,
        dist_timeout_minutes=dist_timeout_minutes,
    )
    return Learner(model_path, cfg)


def step(learner, n_trajs: int, vocab: int, stare: bool) -> dict:
    """One RL step on this rank's share of the fixed batch (the same batch every step)."""
    import torch

    from stare_tir.algos.policy_loss import Clip

    trajs = make_trajs(n_trajs, seed=0, vocab=vocab)
    advs = make_advantages(n_trajs, seed=0)
    local, local_adv = learner.shard(trajs), learner.shard(advs)
    logps, _ = learner.compute_logprobs_entropy(local)
    tw = stare_weights(learner, local, logps, local_adv) if stare else None
    m = learner.train_step(local, local_adv, tw, logps, clip=Clip(low=0.2, high=0.28))
    # sum of (omega - 1) over the global batch: > 0 shows STARE really reweighted tokens
    excess = sum(float((w - 1).sum()) for w in tw) if tw else 0.0
    m["omega_excess"] = float(learner.all_reduce_sum(torch.tensor([excess], dtype=torch.float64))[0])
    return m


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--zero-stage", type=int, default=2)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--stare", action="store_true")
    ap.add_argument("--dist-timeout-minutes", type=float, default=120.0)
    ap.add_argument("--save-after-first", default=None, help="checkpoint directory (after step 1)")
    a = ap.parse_args()
    res = run(
        a.model,
        a.zero_stage,
        a.budget,
        a.stare,
        dist_timeout_minutes=a.dist_timeout_minutes,
        save_after_first=a.save_after_first,
    )
    if res["rank"] == 0:
        torch.save(res, a.out)


if __name__ == "__main__":
    main()
