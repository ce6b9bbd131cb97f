"""Clip-Cov (Cui et al. 2025, arXiv 2505.22617): random tokens inside a covariance window get weight 0."""

from __future__ import annotations

from dataclasses import dataclass

from stare_tir.algos.token_methods import TOKEN_METHODS, TokenEffect, TokenInputs, covariance, floor_frac, mask_at


@dataclass
class ClipCovConfig:
    """Clip-Cov (Cui et al. 2025): detach the gradient of random tokens with lb < Cov < ub."""

    # Share r of loss tokens silenced (verl clip_cov_ratio, 7B script: 0.0002).
    ratio: float = 0.0002
    # Covariance window of the candidates (verl clip_cov_lb / clip_cov_ub: 1 and 5).
    lb: float = 1.0
    ub: float = 5.0

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"ratio={self.ratio!r}: must be in (0, 1]")
        if not self.lb < self.ub:
            raise ValueError(f"lb={self.lb!r}, ub={self.ub!r}: need lb < ub")


@TOKEN_METHODS.register("clip_cov", config=ClipCovConfig)
def clip_cov(t: TokenInputs, cfg: ClipCovConfig) -> TokenEffect:
    """Clip-Cov (Cui et al. 2025; verl `compute_policy_loss_clip_cov`).

    Candidates: tokens with lb < Cov_t < ub (Cov_t as in KL-Cov). min(max(1, floor(ratio * N)),
    |candidates|) of them, drawn uniformly at random (`generator`: seeded per step, so a resumed
    run draws the same), get weight 0: zero gradient, still counted in the token-mean's normaliser
    (verl multiplies their loss by `corr = 0`). Defaults: ratio 2e-4, window (1, 5) (the authors'
    script). verl also excludes tokens its clip already silences; at rho = 1 there are none. The
    authors' script runs it with clip ratios 1/1, i.e. without the standard clip
    (configs/retool_qwen2.5_7b_clip_cov.yaml).
    """
    import torch

    logprobs, advantages = t.logprobs, t.advantages
    generator = t.generator
    ratio, lb, ub = cfg.ratio, cfg.lb, cfg.ub

    n = logprobs.numel()
    device = logprobs.device
    if n == 0:
        return TokenEffect(selected=torch.zeros(0, dtype=torch.bool, device=device))
    cov = covariance(advantages, logprobs)
    cand = torch.nonzero((cov > lb) & (cov < ub)).squeeze(1)  # ascending positions
    k = min(floor_frac(ratio, n), cand.numel())
    if k == 0 or ratio == 0.0:
        return TokenEffect(selected=torch.zeros(n, dtype=torch.bool, device=device))
    pick = torch.randperm(cand.numel(), generator=generator)[:k].to(device)
    sel = mask_at(n, cand[pick], device)
    return TokenEffect(selected=sel, weights=(~sel).to(torch.float32))
