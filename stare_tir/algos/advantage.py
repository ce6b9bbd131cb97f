"""Group-normalized advantages (GRPO and Dr. GRPO).

Every trajectory of a prompt forms a group. Its advantage is its reward minus the group mean,
optionally divided by the group standard deviation (GRPO) or not (Dr. GRPO, which argues the
std division over-weights easy/hard prompts). A group whose rewards are all equal carries no
learning signal: it gets advantage exactly 0 and is counted in the metrics, so the trainer can
report (or filter) it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from registry import Registry

if TYPE_CHECKING:  # torch is imported inside the functions: the config reads this registry torch-free
    from torch import Tensor

AdvantageFn = Callable[["Tensor", "Tensor"], tuple["Tensor", dict]]

# algo.advantage: estimators by name, each `fn(rewards [N], group_ids [N]) -> (advantages [N], metrics)`.
ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")


def compute_group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, dict]:
    """Per-trajectory advantages normalized inside each group.

    rewards: [N] float, one scalar reward per trajectory.
    group_ids: [N] long, any integer labels (need not be contiguous or sorted).
    norm_by_std: divide by the group's (unbiased) std + eps (GRPO) or not (Dr. GRPO).
    Returns advantages [N] (float32, no grad) and metrics. Groups with zero variance, including
    groups of a single trajectory, get advantage exactly 0.
    """
    import torch

    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must be 1-D of equal length, got {tuple(rewards.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    r = rewards.detach().to(torch.float32)  # [N]
    n = r.numel()
    if n == 0:
        return r.clone(), {"adv/num_groups": 0.0, "adv/zero_var_groups": 0.0, "adv/zero_var_frac": 0.0}
    # Map arbitrary labels to 0..G-1 so group statistics are plain scatter-adds.
    _, inv = torch.unique(group_ids, return_inverse=True)  # inv: [N]
    g = int(inv.max()) + 1
    count = torch.zeros(g, dtype=torch.float32).index_add_(0, inv, torch.ones_like(r))  # [G]
    mean = torch.zeros(g, dtype=torch.float32).index_add_(0, inv, r) / count  # [G]
    centered = r - mean[inv]  # [N]
    # Zero variance is decided on the raw rewards (all equal), not on a float std, so that
    # e.g. rewards {1, 1, 1} never yield tiny non-zero advantages from rounding.
    rmin = torch.full((g,), float("inf")).scatter_reduce_(0, inv, r, reduce="amin")
    rmax = torch.full((g,), float("-inf")).scatter_reduce_(0, inv, r, reduce="amax")
    zero_var = rmax == rmin  # [G]; also true for single-member groups
    if norm_by_std:
        sq = torch.zeros(g, dtype=torch.float32).index_add_(0, inv, centered * centered)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))  # unbiased, like torch.std
        adv = centered / (std[inv] + eps)
    else:
        adv = centered
    adv = torch.where(zero_var[inv], torch.zeros_like(adv), adv)
    n_zero = float(zero_var.sum())
    metrics = {
        "adv/num_groups": float(g),
        "adv/zero_var_groups": n_zero,
        "adv/zero_var_frac": n_zero / g,
        "adv/mean": float(adv.mean()),
        "adv/abs_mean": float(adv.abs().mean()),
        "adv/max": float(adv.max()),
        "adv/min": float(adv.min()),
        "adv/reward_mean": float(r.mean()),
    }
    return adv, metrics


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, dict]:
    """GRPO: (r - mean_group) / (std_group + eps)."""
    return compute_group_advantages(rewards, group_ids, norm_by_std=True)


@ADVANTAGE_ESTIMATORS.register("drgrpo")
def drgrpo_advantages(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, dict]:
    """Dr. GRPO: r - mean_group (no std division)."""
    return compute_group_advantages(rewards, group_ids, norm_by_std=False)


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, Eq. 13; verl
    `DAPORewardManager`), added to each trajectory's reward before the group advantages:

        min(-(|y| - (L_max - L_cache)) / L_cache * factor, 0)

    0 up to L_max - L_cache tokens, then falling linearly to -factor at L_max. lengths: [N] response
    tokens per trajectory (|y|); max_len: L_max; buffer: L_cache. Returns [N] float32 (<= 0).
    """
    import torch

    if not 0 < buffer <= max_len:
        raise ValueError(f"buffer={buffer!r}: the overlong buffer must be in [1, max_len={max_len}]")
    exceed = lengths.to(torch.float64) - (max_len - buffer)  # [N]
    return torch.clamp(-exceed / buffer * factor, max=0.0).to(torch.float32)


def broadcast_to_tokens(advantages: Tensor, mask: Tensor) -> Tensor:
    """Spread per-sequence advantages [B] over tokens: returns [B, T], zero where mask == 0."""
    import torch

    return advantages.to(torch.float32)[:, None] * mask.to(torch.float32)  # [B, T]


@dataclass
class OverlongPenaltyConfig:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476; verl DAPORewardManager):
    r += min(-(|y| - (L_max - L_cache)) / L_cache * factor, 0), |y| every response token (model and
    tool output), L_max = rollout.max_total_tokens."""

    # On or off. Unset (null): the preset's (on for algo.name=dapo, off otherwise).
    enabled: bool | None = None
    # L_cache; None: 20% of L_max (DAPO's 4096 of 20480).
    buffer_tokens: int | None = None
    # Penalty at L_max (DAPO: 1.0, the size of the reward gap).
    factor: float = 1.0

    def __post_init__(self) -> None:
        if self.buffer_tokens is not None and self.buffer_tokens < 1:
            raise ValueError(f"buffer_tokens={self.buffer_tokens!r}: must be >= 1 or null")
        if self.factor < 0.0:
            raise ValueError(f"factor={self.factor!r}: must be >= 0")
