"""EAPO (arXiv 2605.27846): positive samples weighted by the current over the initial entropy. A method
with state: the run's initial entropy H_0, recorded from the first step and kept in the checkpoint."""

from __future__ import annotations

import math
from dataclasses import dataclass

from stare_tir.algos.token_methods import TOKEN_METHODS, TokenEffect, TokenInputs


@dataclass
class EapoConfig:
    """EAPO (arXiv 2605.27846): positive samples weighted by the current over the initial entropy."""

    # w+ = clamp((H_t / H_0) ** alpha, w_min, w_max) on A > 0; alpha = 0 gives w+ = 1 (GRPO-ds).
    alpha: float = 1.0
    w_min: float = 0.0
    w_max: float | None = None

    def __post_init__(self) -> None:
        if self.alpha < 0.0:
            raise ValueError(f"alpha={self.alpha!r}: must be >= 0")
        if self.w_min < 0.0 or (self.w_max is not None and self.w_max < max(self.w_min, 1e-12)):
            raise ValueError(f"w_min={self.w_min!r}, w_max={self.w_max!r}: need 0 <= w_min <= w_max")


@TOKEN_METHODS.register("eapo", config=EapoConfig)
class Eapo:
    """EAPO (Zeng et al. 2026, arXiv 2605.27846, "Entropy-driven Adaptive Policy Optimization").

    The reading implemented: the paper's text and code were not available here, only its abstract:
    positive samples get a weight computed from the ratio of the current policy entropy to the
    initial entropy, reduced while entropy falls below it and amplified while it rises above it;
    positive and negative samples are split at the group's reward mean. Here: H_t = the step's
    token-mean policy entropy over the global batch (recompute pass, `TokenInputs.batch_entropy`),
    H_0 = the run's first finite one (this method's state: `observe` records it, the checkpoint keeps
    it), "positive" = A > 0 (GRPO's advantage is the reward minus the group mean, scaled), and every
    token of a positive sample gets w+ = clamp((H_t / H_0) ** alpha, w_min, w_max), alpha = 1 by
    default (the power law is this reading's choice; the abstract gives no formula). Negative samples
    keep weight 1. H_t = H_0 (the first step) gives w+ = 1 exactly, and alpha = 0 gives 1 always:
    GRPO-ds bit for bit. Without the entropies (None) nothing changes. selected = the tokens whose
    weight is not 1.
    """

    def __init__(self, cfg: EapoConfig | None = None) -> None:
        self.initial_entropy: float | None = None

    def observe(self, batch_entropy: float) -> None:
        """Record the run's first finite batch entropy as H_0 (later calls keep it)."""
        h = float(batch_entropy)
        if self.initial_entropy is None and math.isfinite(h):
            self.initial_entropy = h

    def __call__(self, t: TokenInputs, cfg: EapoConfig) -> TokenEffect:
        return eapo_weights(t.advantages, t.batch_entropy, self.initial_entropy, cfg)

    def state_dict(self) -> dict:
        return {"initial_entropy": self.initial_entropy}

    def load_state_dict(self, state: dict) -> None:
        h0 = state.get("initial_entropy")
        self.initial_entropy = None if h0 is None else float(h0)


def eapo_weights(advantages, h_t: float | None, h_0: float | None, cfg: EapoConfig) -> TokenEffect:
    """EAPO's effect on one selection group's tokens (advantages [N]) given H_t and H_0 (see `Eapo`)."""
    import torch

    n = advantages.numel()
    device = advantages.device
    none = TokenEffect(selected=torch.zeros(n, dtype=torch.bool, device=device))
    if n == 0 or h_t is None or h_0 is None or not (h_0 > 0.0 and math.isfinite(h_t)):
        return none
    w_pos = (h_t / h_0) ** cfg.alpha
    w_pos = max(w_pos, cfg.w_min)
    if cfg.w_max is not None:
        w_pos = min(w_pos, cfg.w_max)
    pos = advantages > 0
    w = torch.where(pos, torch.tensor(w_pos, dtype=torch.float32), torch.tensor(1.0)).to(device)
    return TokenEffect(selected=pos & (w != 1.0), weights=w, metrics={"positive_weight": w_pos})
