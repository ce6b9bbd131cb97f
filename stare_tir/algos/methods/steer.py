"""STEER (arXiv 2510.10150, zz-haooo/STEER): per-token weights from the estimated entropy change."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from stare_tir.algos.token_methods import TOKEN_METHODS, TokenEffect, TokenInputs


@dataclass
class SteerConfig:
    """STEER (arXiv 2510.10150, zz-haooo/STEER): per-token weights from the estimated entropy change."""

    # What algo.name=steer sets besides the method: min/max of Omega over each micro-batch (the
    # authors compute the weights inside the loss, per micro-batch).
    preset: ClassVar[dict] = {"scope": "micro_batch"}

    # "exponential": w = clamp(exp(-k Omega), w_min, 1), k = -ln(w_min) / max(max Omega, 0.02);
    # "linear": Omega's range mapped onto [w_max, w_min]. The authors' run script (run/run_exp.sh):
    # exponential (linear=False), token_weight_min=0.8, token_weight_max=1.0.
    mode: Literal["exponential", "linear"] = "exponential"
    w_min: float = 0.8
    w_max: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in ("exponential", "linear"):
            raise ValueError(f"mode={self.mode!r}: choose exponential or linear")
        if not 0.0 < self.w_min <= self.w_max:
            raise ValueError(f"w_min={self.w_min!r}, w_max={self.w_max!r}: need 0 < w_min <= w_max")


@TOKEN_METHODS.register("steer", config=SteerConfig)
def steer(t: TokenInputs, cfg: SteerConfig) -> TokenEffect:
    """STEER (arXiv 2510.10150; zz-haooo/STEER `compute_token_weights`).

    Omega_t = |A_t / pi_old,t * pi_t (1 - pi_t) (log pi_t + H_t)|, the first-order entropy change a
    token's update causes, with pi clamped to [1e-8, 1 - 1e-8], pi_old to [1e-8, 1] and non-finite
    values set to 0, as the authors' code does. Over the group's tokens (the authors: each
    micro-batch), exponential mode: k = -ln(w_min) / max(max Omega, 0.02), w = clamp(exp(-k Omega),
    w_min, 1); linear mode: w = w_max - (Omega - min) (w_max - w_min) / (max - min), clamped to
    [w_min, w_max] ((w_min + w_max) / 2 when all Omega are equal). The weight multiplies the token's
    clipped loss (here: its advantage, the same for w >= 0). pi and H are the current policy's; the
    authors read H from the recompute pass's stored entropies, equal to these on the first
    mini-batch. w_min = w_max = 1 gives weights of exactly 1 (GRPO-ds bit for bit).
    selected = the tokens whose weight is not 1.
    """
    import torch

    n = t.logprobs.numel()
    device = t.logprobs.device
    if n == 0:
        return TokenEffect(selected=torch.zeros(0, dtype=torch.bool, device=device))
    lp = t.logprobs.double()
    old = t.old_logprobs.double() if t.old_logprobs is not None else lp
    p = torch.exp(lp).clamp(1e-8, 1.0 - 1e-8)
    f = p * (1.0 - p) * (torch.log(p) + t.entropy.double())
    omega = t.advantages.double() / torch.exp(old).clamp(1e-8, 1.0) * f
    omega = torch.where(torch.isfinite(omega), omega, torch.zeros_like(omega)).abs()
    lo, hi = omega.min(), omega.max()
    if cfg.mode == "linear":
        if hi > lo:
            w = cfg.w_max - (omega - lo) * ((cfg.w_max - cfg.w_min) / (hi - lo))
        else:
            w = torch.full_like(omega, (cfg.w_min + cfg.w_max) / 2)
        w = w.clamp(cfg.w_min, cfg.w_max)
    else:
        k = -math.log(cfg.w_min) / torch.clamp(hi, min=0.02)
        w = torch.exp(-k * omega).clamp(cfg.w_min, 1.0)
    w = w.to(torch.float32)
    return TokenEffect(selected=w != 1.0, weights=w, metrics={"omega_max": float(hi)})
