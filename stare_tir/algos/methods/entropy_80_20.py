"""The 80/20 rule (Wang et al. 2025, arXiv 2506.01939): gradient only through the high-entropy tokens."""

from __future__ import annotations

from dataclasses import dataclass

from stare_tir.algos.token_methods import TOKEN_METHODS, TokenEffect, TokenInputs, ceil_frac, mask_at, top_k_positions


@dataclass
class TopEntropyConfig:
    """The 80/20 rule (Wang et al. 2025, arXiv 2506.01939): gradient only through high-entropy tokens."""

    # Share of loss tokens kept, by highest entropy (the paper's 20%; `entropy_top_ratio=0.2`).
    top_frac: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 < self.top_frac <= 1.0:
            raise ValueError(f"top_frac={self.top_frac!r}: must be in (0, 1]")


@TOKEN_METHODS.register("entropy_80_20", config=TopEntropyConfig)
def entropy_80_20(t: TokenInputs, cfg: TopEntropyConfig) -> TokenEffect:
    """The 80/20 rule (Wang et al. 2025, arXiv 2506.01939, "Beyond the 80/20 Rule").

    Only the ceil(top_frac * N) tokens of highest entropy stay in the loss, which becomes the
    token-mean over them (the authors' verl code: `loss_mask = response_mask * entropy_top_mask`).
    The rest get exactly zero gradient. Their code takes the ceiling as int(x + 0.9999) (which absorbs
    float noise such as 0.2 * 15 = 3.0000000000000004); this is the exact decimal ceiling, the same
    count for top_frac = 0.2. Their selection runs per micro-batch (algo.scope=micro_batch or verl
    for that). top_frac = 1 keeps every token (GRPO-ds). selected = the tokens kept.
    """
    import torch

    entropy = t.entropy
    top_frac = cfg.top_frac

    n = entropy.numel()
    device = entropy.device
    if n == 0:
        return TokenEffect(selected=torch.zeros(0, dtype=torch.bool, device=device))
    k = ceil_frac(top_frac, n)
    if k == n:
        return TokenEffect(selected=torch.ones(n, dtype=torch.bool, device=device))  # keeps everything
    keep = mask_at(n, top_k_positions(entropy, k), device)
    return TokenEffect(selected=keep, keep=keep)
