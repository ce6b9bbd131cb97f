"""Policy-gradient surrogates (PPO/GRPO family), found by name: `clip` (clip-higher, dual clip) and
`kl_cov` (KL-Cov's unclipped surrogate), with truncated importance sampling, per-token weights
(STARE's omega, the baselines' silencing, verl's aggregation) and three aggregation modes.

Every loss is `fn(x: LossInputs) -> (loss, metrics)`: one micro-batch's tensors and settings in one
dataclass. Loss per token (sign: we minimise the negative surrogate):
    rho = exp(logp - old_logp)
    l   = max(-A * rho, -A * clip(rho, 1 - clip.low, 1 + clip.high))      (`clip`; `kl_cov`: -A * rho)
    l   = min(l, -A * c)                      for A < 0 when dual-clip c is set (`clip` only)
    l   = l + omega * beta * |logp - old_logp|    where KL-Cov's term (`terms["kl_cov"]`) is given
    l   = l * tis                             constant (no gradient)
with A replaced by omega * A when token weights omega (constants, >= 0) are given. For omega >= 0
this equals multiplying the per-token loss by omega (max/min commute with a non-negative factor),
and it costs one element-wise pass instead of an extra autograd node. omega = 0 gives a token
exactly zero gradient while it stays in the normaliser.

torch is imported inside the functions: the config validates `algo.policy_loss` against this
registry without loading torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal

from registry import Registry
from stare_tir.algos.methods.kl_cov import KL_COV_TERM

if TYPE_CHECKING:
    from torch import Tensor

Agg = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


@dataclass(frozen=True)
class Clip:
    """The trust region of the clipped surrogate (algo.clip_low, algo.clip_high, algo.dual_clip_c).

    high > low is "clip-higher" (DAPO): low-probability tokens with A > 0 may grow more. low = 1
    removes the lower clip (Clip-Cov's script runs with clip ratios 1/1). dual_c (> 1) bounds the
    loss of A < 0 tokens whose ratio exploded (None disables)."""

    low: float = 0.2
    high: float = 0.2
    dual_c: float | None = 3.0

    def __post_init__(self) -> None:
        if self.dual_c is not None and self.dual_c <= 1.0:
            raise ValueError(f"dual_c={self.dual_c!r}: must be > 1 or None")
        if self.low < 0 or self.low > 1 or self.high < 0:
            raise ValueError(f"low={self.low!r}, high={self.high!r}: need 0 <= low <= 1, high >= 0")


@dataclass
class LossInputs:
    """What a policy loss sees of one micro-batch: per-token tensors [B, T] (advantages already
    broadcast over tokens) and how to aggregate them. token_weights, tis_weights and the terms are
    constants (no gradient); weights of exactly 1 give bit-identical loss and gradients to None
    (x * 1.0 == x in IEEE arithmetic)."""

    logprobs: Tensor  # [B, T] log pi of the sampled tokens, with gradient
    old_logprobs: Tensor  # [B, T] log pi_old (the ratio's denominator)
    advantages: Tensor  # [B, T]
    mask: Tensor  # [B, T] loss tokens
    clip: Clip = Clip()
    token_weights: Tensor | None = None  # [B, T] omega >= 0 (STARE, the token methods, verl's aggregation)
    tis_weights: Tensor | None = None  # [B, T] truncated importance weights
    # Named per-token terms [B, T] of the token methods; a loss reads its own by name (KL-Cov's
    # coefficient of |log pi - log pi_old| is `terms["kl_cov"]`, KL_COV_TERM).
    terms: dict[str, Tensor] = field(default_factory=dict)
    agg: Agg = "token-mean"
    global_tokens: float | None = None  # loss tokens of the global batch (token-mean's normaliser)
    global_seqs: float | None = None  # sequences of the global batch (seq-mean modes)


PolicyLossFn = Callable[[LossInputs], tuple["Tensor", dict]]

# algo.policy_loss: losses by name.
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


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
    import torch

    if cap <= 0:
        raise ValueError(f"cap={cap!r}: must be > 0")
    with torch.no_grad():
        log_w = (old_logprobs - rollout_logprobs).float().clamp(max=math.log(cap))  # [B, T]
        w = torch.exp(log_w)
        return torch.where(mask.bool(), w, torch.ones_like(w))


@POLICY_LOSSES.register("clip")
def clip_loss(x: LossInputs) -> tuple[Tensor, dict]:
    """The clipped surrogate with clip-higher and dual clip (`Clip`), token weights, truncated IS and
    KL-Cov's penalty where given. Metrics are means over this call's loss tokens."""
    return _surrogate(x, clipped=True)


@POLICY_LOSSES.register("kl_cov")
def kl_cov_loss(x: LossInputs) -> tuple[Tensor, dict]:
    """KL-Cov's loss (Cui et al. 2025; verl `compute_policy_loss_kl_cov`): the unclipped surrogate
    -A * rho plus beta * |logp - old_logp| on the tokens the `kl_cov` token method selected (its
    term `kl_cov`: beta there, 0 elsewhere).
    Neither the clip nor the dual clip applies (verl's does not read them either). At rho = 1 its
    value and gradient equal the clipped loss's bit for bit (clip and dual clip are inactive there),
    so with no token selected the first update is GRPO-ds's."""
    return _surrogate(x, clipped=False)


def _surrogate(x: LossInputs, *, clipped: bool) -> tuple[Tensor, dict]:
    import torch

    logprobs, old_logprobs, mask = x.logprobs, x.old_logprobs, x.mask
    token_weights, tis_weights = x.token_weights, x.tis_weights
    beta = x.terms.get(KL_COV_TERM)  # [B, T] KL-Cov's coefficient on its tokens, 0 elsewhere
    clip_low, clip_high = x.clip.low, x.clip.high
    dual_clip_c = x.clip.dual_c if clipped else None
    # -A, built once; token weights scale it in place (omega == 1 leaves every bit unchanged).
    neg_adv = -x.advantages.detach()  # [B, T]
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
    if beta is not None:
        coef = beta.detach() if token_weights is None else beta.detach() * token_weights.detach()
        loss_tok = loss_tok + coef * (logprobs - old_logprobs.detach()).abs()
    if tis_weights is not None:
        loss_tok = loss_tok * tis_weights.detach()
    loss = aggregate(loss_tok, mask, x.agg, x.global_tokens, x.global_seqs)

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
            [s.float() for s in sums]
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
        if beta is not None:
            # |log pi - log pi_old| over the penalised tokens: the penalty's gradient is exactly 0
            # when this is 0 (d|x|/dx = 0 at x = 0), i.e. on an on-policy update.
            pen = (beta.detach() > 0) & m
            metrics["pg/kl_penalty_abs_diff"] = float((lr.abs() * pen).sum() / pen.sum().clamp(min=1))
    return loss, metrics
