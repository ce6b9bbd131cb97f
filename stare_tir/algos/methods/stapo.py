"""STAPO (Liu et al. 2026, arXiv 2602.15620): spurious positive tokens leave the loss."""

from __future__ import annotations

import math
from dataclasses import dataclass

from stare_tir.algos.token_methods import TOKEN_METHODS, TokenEffect, TokenInputs, quantile


@dataclass
class StapoConfig:
    """STAPO (Liu et al. 2026, arXiv 2602.15620): silence positive-advantage tokens with low probability
    and low entropy ("spurious tokens"), renormalising the loss over the remaining tokens.

    The thresholds are those the authors' own summary of the paper gives (pi < 0.01; entropy below
    the 5th percentile of the batch's token entropies); the paper's text was not available to
    confirm them, so both are settings.
    """

    # tau_p: a token is a candidate when pi(token) < prob_max.
    prob_max: float = 0.01
    # tau_h as a quantile of the loss tokens' entropies (of the selection group) ...
    entropy_quantile: float = 0.05
    # ... or as an absolute value in nats (set it to use it instead of the quantile).
    entropy_max: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.prob_max <= 1.0:
            raise ValueError(f"prob_max={self.prob_max!r}: must be in [0, 1]")
        if not 0.0 <= self.entropy_quantile <= 1.0:
            raise ValueError(f"entropy_quantile={self.entropy_quantile!r}: must be in [0, 1]")
        if self.entropy_max is not None and self.entropy_max < 0.0:
            raise ValueError(f"entropy_max={self.entropy_max!r}: must be >= 0 or null")


@TOKEN_METHODS.register("stapo", config=StapoConfig)
def stapo(t: TokenInputs, cfg: StapoConfig) -> TokenEffect:
    """STAPO's silencing of spurious tokens (Liu et al. 2026, arXiv 2602.15620).

    A token is spurious when A > 0, pi(token) < prob_max and H < tau_h, tau_h = entropy_max or else
    the entropy_quantile-quantile of the group's token entropies (linear interpolation, as
    torch.quantile). Spurious tokens leave the loss and its normaliser ("mask and renormalise over
    valid tokens"). See `StapoConfig` for where the thresholds come from. prob_max = 0 silences none.
    """
    import torch

    logprobs, entropy, advantages = t.logprobs, t.entropy, t.advantages
    prob_max, entropy_quantile, entropy_max = cfg.prob_max, cfg.entropy_quantile, cfg.entropy_max

    n = entropy.numel()
    device = entropy.device
    if n == 0 or prob_max <= 0.0:
        return TokenEffect(selected=torch.zeros(n, dtype=torch.bool, device=device))
    h = entropy.double()
    tau_h = entropy_max if entropy_max is not None else quantile(h, entropy_quantile)
    # pi < prob_max, compared in log space (the recompute pass gives log pi)
    spurious = (advantages > 0) & (logprobs.double() < math.log(prob_max)) & (h < tau_h)
    if not bool(spurious.any()):
        return TokenEffect(selected=spurious)
    return TokenEffect(selected=spurious, keep=~spurious)
