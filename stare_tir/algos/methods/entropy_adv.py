"""Entropy-based advantage (Cheng et al. 2025, arXiv 2506.14758): A + min(alpha H, |A| / kappa)."""

from __future__ import annotations

from dataclasses import dataclass

from stare_tir.algos.token_methods import TOKEN_METHODS, TokenEffect, TokenInputs


@dataclass
class EntropyAdvConfig:
    """Entropy-based advantage (Cheng et al. 2025, arXiv 2506.14758): A + min(alpha H, |A| / kappa)."""

    # alpha = 0.4 and kappa = 2 are the GRPO values of the paper (the authors' verl scripts pass
    # entropy_advantage_alpha=0.4, entropy_advantage_kappa=2.0); kappa > 1 keeps every sign.
    alpha: float = 0.4
    kappa: float = 2.0

    def __post_init__(self) -> None:
        if self.alpha < 0.0:
            raise ValueError(f"alpha={self.alpha!r}: must be >= 0")
        if self.kappa <= 1.0:
            raise ValueError(f"kappa={self.kappa!r}: must be > 1 (the bonus then never flips a sign)")


@TOKEN_METHODS.register("entropy_adv", config=EntropyAdvConfig)
def entropy_adv(t: TokenInputs, cfg: EntropyAdvConfig) -> TokenEffect:
    """Entropy-based advantage (Cheng et al. 2025, arXiv 2506.14758).

    A' = A + min(alpha * H, |A| / kappa), H the (detached) entropy at the token's position. With
    kappa > 1 the bonus is below |A|, so every A' keeps the sign of A (and A = 0 stays 0). Defaults
    alpha 0.4, kappa 2 (the paper's GRPO setting). alpha = 0 leaves A bit for bit. selected = the
    tokens whose advantage changed.
    """
    import torch

    entropy, advantages = t.entropy, t.advantages
    alpha, kappa = cfg.alpha, cfg.kappa

    a = advantages.to(torch.float32)
    bonus = torch.minimum(alpha * entropy.to(torch.float32), a.abs() / kappa)  # [N], >= 0
    shaped = a + bonus
    return TokenEffect(selected=bonus > 0, advantages=shaped)
