"""KL-Cov (Cui et al. 2025, arXiv 2505.22617): a KL penalty on the top-k covariance tokens, carried to
the loss as the named term `kl_cov` (policy_loss.py reads it by this name)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from stare_tir.algos.token_methods import (
    TOKEN_METHODS,
    TokenEffect,
    TokenInputs,
    covariance,
    floor_frac,
    mask_at,
    top_k_positions,
)

# The name of its per-token term (the coefficient of |log pi - log pi_old|), as the losses read it.
KL_COV_TERM = "kl_cov"


@dataclass
class KLCovConfig:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617): a KL penalty on the top-k covariance tokens."""

    # What algo.name=kl_cov sets besides the method: its own unclipped loss.
    preset: ClassVar[dict] = {"policy_loss": "kl_cov"}

    # Share k of loss tokens penalised, by highest Cov(A, log pi). 0.002 is the authors' 7B script
    # (verl recipe/entropy/7b_kl_cov.sh); verl's own default (0.0002) is their 32B setting.
    ratio: float = 0.002
    # beta, the coefficient of |log pi - log pi_old| on those tokens (ppo_kl_coef=1 in the 7B script).
    coef: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"ratio={self.ratio!r}: must be in (0, 1]")
        if self.coef < 0.0:
            raise ValueError(f"coef={self.coef!r}: must be >= 0")


@TOKEN_METHODS.register("kl_cov", config=KLCovConfig)
def kl_cov(t: TokenInputs, cfg: KLCovConfig) -> TokenEffect:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617; verl `compute_policy_loss_kl_cov`).

    The k = max(1, floor(ratio * N)) tokens with the largest Cov_t = (A_t - mean A)(log pi_t - mean log pi)
    get the penalty coef * |log pi_t - log pi_old,t| added to their loss; the loss itself is the
    unclipped surrogate -A rho (the registered policy loss `kl_cov`). Defaults: ratio 0.002 and
    coef 1 (the authors' 7B script; verl's config default ratio 0.0002 is their 32B setting). The
    count truncates (verl: `int(len * ratio)`), unlike STARE's ceil. At rho = 1 the penalty's
    gradient is 0 (d|x|/dx = 0 at 0): it acts only once the policy has moved from pi_old, i.e. from
    the second mini-batch of a step (the authors run 8: algo.ppo_mini_batch_size; the first
    mini-batch's old log-probs are the update's own, so its penalty gradient is exactly 0).
    """
    import torch

    logprobs, advantages = t.logprobs, t.advantages
    ratio, coef = cfg.ratio, cfg.coef

    n = logprobs.numel()
    if n == 0 or coef == 0.0:
        return TokenEffect(selected=torch.zeros(n, dtype=torch.bool, device=logprobs.device))
    cov = covariance(advantages, logprobs)
    sel = mask_at(n, top_k_positions(cov, floor_frac(ratio, n)), logprobs.device)
    return TokenEffect(selected=sel, terms={KL_COV_TERM: sel.to(torch.float32) * coef})
