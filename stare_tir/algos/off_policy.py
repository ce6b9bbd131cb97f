"""Behaviour-policy correction for stale rollouts (decoupled PPO) and the mismatch it corrects.

Three policies meet in an asynchronous step: pi_behav sampled the tokens (its log-probs are the
rollout engine's, `Trajectory.rollout_logprobs`), pi_prox is the learner's recompute with the
weights being updated (the proximal policy, the ratio's denominator), pi_theta is what the update
changes. Per loss token, with r = pi_prox / pi_behav (settings: `off_policy_config.OffPolicyConfig`):

    l = w * max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high)),   rho = pi_theta / pi_prox
    tis: w = min(r, cap)              mis: w = r if lower <= r <= cap else 0
    level "sequence": r replaced by the trajectory's geometric mean exp(mean log r) on every token

The policy losses take w as a constant per-token weight (times the advantage, which for w >= 0 is
the same as times the loss), so w = 1 leaves GRPO's loss bit for bit. Log-ratios are clamped to
+-20 before exp (a wild token cannot overflow).
"""

from __future__ import annotations

import torch
from torch import Tensor

LAG_BUCKETS = ("lag0", "lag1", "lag2plus")  # token staleness in versions: 0, 1, >= 2


def behaviour_weights(
    prox_logprobs: Tensor,
    behav_logprobs: Tensor,
    mask: Tensor,
    seq_index: Tensor,
    *,
    mode: str,
    cap: float,
    lower: float = 0.0,
    level: str = "token",
) -> tuple[Tensor, dict[str, float]]:
    """Behaviour weights w [T] for flat token tensors (1 off the mask), and their metrics.

    prox_logprobs, behav_logprobs: [T] log-probs of the sampled tokens (recompute, engine).
    mask: [T] bool, loss tokens. seq_index: [T] long, the trajectory of each token (level="sequence").
    Metrics (means over this call's loss tokens): offpolicy/weight_mean; offpolicy/capped_frac, the
    share of tokens whose ratio was clipped (tis) or masked (mis).
    """
    if mode not in ("tis", "mis"):
        raise ValueError(f"mode={mode!r}: tis or mis")
    if cap <= 1.0:
        raise ValueError(f"cap={cap!r}: must be > 1")
    m = mask.bool()
    log_r = torch.where(m, (prox_logprobs - behav_logprobs).double(), torch.zeros((), dtype=torch.float64))  # [T]
    log_r = log_r.clamp(-20.0, 20.0)
    if level == "sequence":
        n_seq = int(seq_index.max()) + 1 if seq_index.numel() else 0
        sums = torch.zeros(n_seq, dtype=torch.float64).index_add_(0, seq_index, log_r)
        counts = torch.zeros(n_seq, dtype=torch.float64).index_add_(0, seq_index, m.double())
        log_r = (sums / counts.clamp(min=1.0))[seq_index]  # [T] the trajectory's mean log-ratio
    elif level != "token":
        raise ValueError(f"level={level!r}: token or sequence")
    ratio = torch.exp(log_r)
    if mode == "tis":
        outside = ratio > cap
        w = ratio.clamp(max=cap)
    else:
        outside = (ratio > cap) | (ratio < lower)
        w = torch.where(outside, torch.zeros_like(ratio), ratio)
    w = torch.where(m, w, torch.ones_like(w)).to(torch.float32)
    n = max(int(m.sum()), 1)
    metrics = {
        "offpolicy/weight_mean": float(w[m].double().sum()) / n,
        "offpolicy/capped_frac": float((outside & m).sum()) / n,
    }
    return w, metrics


def mismatch_sums_by_lag(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor, lag: Tensor) -> Tensor:
    """Engine vs recompute log-prob mismatch per token staleness bucket (`LAG_BUCKETS`), as sums
    (so that ranks add them up): [buckets, 3] = (tokens, sum |d|, sum exp(d) - 1 - d), with
    d = behaviour - recompute (the estimator of `mismatch/k3`).

    lag: [T] long, versions between the weights that sampled each token and the weights being updated.
    """
    m = mask.bool()
    d = (behav_logprobs - prox_logprobs).double().clamp(-20.0, 20.0)
    k3 = torch.exp(d) - 1.0 - d
    last = len(LAG_BUCKETS) - 1
    out = torch.zeros(len(LAG_BUCKETS), 3, dtype=torch.float64)
    for k in range(len(LAG_BUCKETS)):
        sel = m & ((lag == k) if k < last else (lag >= k))
        out[k] = torch.stack([sel.sum().double(), d[sel].abs().sum(), k3[sel].sum()])
    return out


def mismatch_metrics(sums: Tensor) -> dict[str, float]:
    """Metrics from `mismatch_sums_by_lag`'s sums: offpolicy/<bucket>/frac (share of the loss tokens)
    for every bucket; offpolicy/<bucket>/abs_mean and /k3 (means) for buckets that have tokens."""
    total = max(float(sums[:, 0].sum()), 1.0)
    metrics: dict[str, float] = {}
    for k, name in enumerate(LAG_BUCKETS):
        n, abs_sum, k3_sum = (float(x) for x in sums[k])
        metrics[f"offpolicy/{name}/frac"] = n / total
        if n > 0:
            metrics[f"offpolicy/{name}/abs_mean"] = abs_sum / n
            metrics[f"offpolicy/{name}/k3"] = k3_sum / n
    return metrics
