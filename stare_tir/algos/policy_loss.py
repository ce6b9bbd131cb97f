"""Policy-gradient surrogates (PPO/GRPO family), found by name: `clip` (clip-higher, dual clip) and
`kl_cov` (KL-Cov's unclipped surrogate), with truncated importance sampling, per-token weights
(STARE's omega, the baselines' silencing, verl's aggregation) and three aggregation modes.

Loss per token (sign: we minimise the negative surrogate):
    rho = exp(logp - old_logp)
    l   = max(-A * rho, -A * clip(rho, 1 - clip_low, 1 + clip_high))      (`clip`; `kl_cov`: -A * rho)
    l   = min(l, -A * c)                      for A < 0 when dual-clip c is set (`clip` only)
    l   = l + omega * kl_coef * |logp - old_logp|     when per-token KL coefficients are given
    l   = l * tis                             constant (no gradient)
with A replaced by omega * A when token weights omega (constants, >= 0) are given. For omega >= 0
this equals multiplying the per-token loss by omega (max/min commute with a non-negative factor),
and it costs one element-wise pass instead of an extra autograd node. omega = 0 gives a token
exactly zero gradient while it stays in the normaliser.
"""

from __future__ import annotations

import math
from typing import Callable, Literal

import torch
from torch import Tensor

Agg = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")

PolicyLossFn = Callable[..., tuple[Tensor, dict]]

POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: make a policy loss selectable by name from the config."""

    def wrap(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} registered twice")
        POLICY_LOSSES[name] = fn
        return fn

    return wrap


def get_policy_loss(name: str) -> PolicyLossFn:
    """Look a policy loss up by name; an unknown name lists the valid ones."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"policy loss {name!r} unknown; choose one of {sorted(POLICY_LOSSES)}") from None


def aggregate(
    loss_tok: Tensor,
    mask: Tensor,
    agg: Agg = "token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    token-mean: sum / global_tokens (all loss tokens of the global batch) so that summing the
        micro-batch losses gives the global token mean; without it, this micro-batch's count.
    seq-mean-token-sum: per-sequence token sums, averaged over sequences.
    seq-mean-token-mean: per-sequence token means, averaged over sequences.
    Sequences are those with at least one loss token; global_seqs (their number in the global
    batch) plays the role of global_tokens for the seq-mean modes.
    """
    m = mask.to(loss_tok.dtype)
    if agg == "token-mean":
        denom = global_tokens if global_tokens is not None else m.sum().clamp(min=1.0)
        return (loss_tok * m).sum() / denom
    if agg not in AGG_MODES:
        raise ValueError(f"agg={agg!r}: choose one of {list(AGG_MODES)}")
    tok_count = m.sum(-1)  # [B]
    seq_sum = (loss_tok * m).sum(-1)  # [B]
    if agg == "seq-mean-token-mean":
        seq_sum = seq_sum / tok_count.clamp(min=1.0)
    denom = global_seqs if global_seqs is not None else (tok_count > 0).sum().clamp(min=1)
    return seq_sum.sum() / denom


def truncated_is_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Truncated importance weights min(pi_old / pi_rollout, cap) per token (no gradient).

    Corrects the mismatch between the rollout engine's sampling distribution and the trainer's
    recomputed one (different kernels / precision). Masked positions get weight 1 (neutral).
    The ratio is capped in log space so a large mismatch never overflows.
    """
    if cap <= 0:
        raise ValueError(f"cap={cap!r}: must be > 0")
    with torch.no_grad():
        log_w = (old_logprobs - rollout_logprobs).float().clamp(max=math.log(cap))  # [B, T]
        w = torch.exp(log_w)
        return torch.where(mask.bool(), w, torch.ones_like(w))


@register_policy_loss("clip")
def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float | None = 3.0,
    token_weights: Tensor | None = None,
    tis_weights: Tensor | None = None,
    kl_coef: Tensor | None = None,
    agg: Agg = "token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[Tensor, dict]:
    """Clipped surrogate loss; all tensors [B, T], advantages already broadcast over tokens.

    clip_high > clip_low is "clip-higher" (DAPO): low-probability tokens with A > 0 may grow more.
    clip_low = 1 removes the lower clip (Clip-Cov's script runs with clip ratios 1/1).
    dual_clip_c (> 1) bounds the loss of A < 0 tokens whose ratio exploded (None disables).
    token_weights (>= 0) scale the advantages; tis_weights scale the per-token loss; kl_coef adds
    KL-Cov's penalty; all are constants. Weights of exactly 1 give bit-identical loss and
    gradients to passing None (x * 1.0 == x in IEEE arithmetic).
    Metrics are means over this call's loss tokens.
    """
    return _surrogate(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        clipped=True,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip_c=dual_clip_c,
        token_weights=token_weights,
        tis_weights=tis_weights,
        kl_coef=kl_coef,
        agg=agg,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
    )


@register_policy_loss("kl_cov")
def kl_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float | None = None,
    token_weights: Tensor | None = None,
    tis_weights: Tensor | None = None,
    kl_coef: Tensor | None = None,
    agg: Agg = "token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[Tensor, dict]:
    """KL-Cov's loss (Cui et al. 2025; verl `compute_policy_loss_kl_cov`): the unclipped surrogate
    -A * rho plus kl_coef * |logp - old_logp| on the tokens the `kl_cov` token method selected.
    Neither the clip nor the dual clip applies (clip_low, clip_high and dual_clip_c are accepted
    and ignored, as verl's does). At rho = 1 its value and gradient equal the clipped loss's bit
    for bit (clip and dual clip are inactive there), so with no token selected the first update is
    GRPO-ds's."""
    return _surrogate(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        clipped=False,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip_c=None,
        token_weights=token_weights,
        tis_weights=tis_weights,
        kl_coef=kl_coef,
        agg=agg,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
    )


def _surrogate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clipped: bool,
    clip_low: float,
    clip_high: float,
    dual_clip_c: float | None,
    token_weights: Tensor | None,
    tis_weights: Tensor | None,
    kl_coef: Tensor | None,
    agg: Agg,
    global_tokens: float | None,
    global_seqs: float | None,
) -> tuple[Tensor, dict]:
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c={dual_clip_c!r}: must be > 1 or None")
    if clip_low < 0 or clip_low > 1 or clip_high < 0:
        raise ValueError(f"clip_low={clip_low!r}, clip_high={clip_high!r}: need 0 <= clip_low <= 1, clip_high >= 0")
    # -A, built once; token weights scale it in place (omega == 1 leaves every bit unchanged).
    neg_adv = -advantages.detach()  # [B, T]
    if token_weights is not None:
        neg_adv.mul_(token_weights.detach())
    # Clamp the log-ratio so exp never overflows on a wild token; +-20 is far outside any clip.
    log_ratio = (logprobs - old_logprobs.detach()).clamp(-20.0, 20.0)  # [B, T]
    ratio = torch.exp(log_ratio)
    loss_unclipped = neg_adv * ratio
    neg = neg_adv > 0  # A < 0
    dual_active = None
    if clipped:
        loss_clipped = neg_adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
        loss_tok = torch.maximum(loss_unclipped, loss_clipped)  # [B, T]
        if dual_clip_c is not None:
            loss_dual = neg_adv * dual_clip_c
            dual_active = neg & (loss_tok > loss_dual)
            loss_tok = torch.where(dual_active, loss_dual, loss_tok)
    else:
        loss_tok = loss_unclipped
    if kl_coef is not None:
        coef = kl_coef.detach() if token_weights is None else kl_coef.detach() * token_weights.detach()
        loss_tok = loss_tok + coef * (logprobs - old_logprobs.detach()).abs()
    if tis_weights is not None:
        loss_tok = loss_tok * tis_weights.detach()
    loss = aggregate(loss_tok, mask, agg, global_tokens, global_seqs)

    with torch.no_grad():
        # All sums are stacked and read back with one .tolist(): a single device sync on GPU.
        m = mask.bool()
        mf = mask.to(ratio.dtype)
        r = ratio.detach()
        lr = log_ratio.detach()
        zero = mf.new_zeros(())
        sums = [
            mf.sum(),
            ((neg_adv < 0) & (r > 1.0 + clip_high) & m).sum() if clipped else zero,
            (neg & (r < 1.0 - clip_low) & m).sum() if clipped else zero,
            (dual_active & m).sum() if dual_active is not None else zero,
            (lr * mf).sum(),
            ((r - 1.0 - lr) * mf).sum(),
            (r * mf).sum(),
            (r * mf).max() if r.numel() else zero,
            (tis_weights * mf).sum() if tis_weights is not None else zero,
            loss.detach(),
        ]
        (n_tok, c_high, c_low, c_dual, s_lr, s_k3, s_r, r_max, s_tis, loss_v) = torch.stack(
            [x.float() for x in sums]
        ).tolist()
        d = max(n_tok, 1.0)
        metrics = {
            "pg/loss": loss_v,
            "pg/clipfrac_high": c_high / d,  # A > 0, ratio above 1 + clip_high (no gradient)
            "pg/clipfrac_low": c_low / d,  # A < 0, ratio below 1 - clip_low (no gradient)
            "pg/clipfrac_dual": c_dual / d,  # A < 0, loss capped at -c * A
            # k1 (old - new) and k3 ((rho - 1) - log rho >= 0) estimators of KL(old || new).
            "pg/approx_kl_k1": -s_lr / d,
            "pg/approx_kl": s_k3 / d,
            "pg/ratio_mean": s_r / d,
            "pg/ratio_max": r_max,
            "pg/num_tokens": n_tok,
        }
        if tis_weights is not None:
            metrics["pg/tis_mean"] = s_tis / d
    return loss, metrics
