"""Token log-probabilities and entropies without materializing [N, V] float32 logits.

With Qwen2.5's vocabulary (151,665) the float32 logits of 16k response tokens take ~10 GB, and
autograd would keep softmax-sized buffers for the backward pass on top. Here rows are processed
in chunks: the forward keeps only per-token scalars (log-sum-exp), and a custom backward
recomputes each chunk's logits to form the gradient. Peak extra memory is O(chunk_size * V).

Both entry points take a temperature: they return log-probabilities and entropy of
softmax(logits / T), the distribution the rollout engine samples from.
Entropy is returned without gradient (it is a statistic: STARE's gate, logging).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Softmax math runs in float32 for half types and in the input dtype otherwise (float64
    stays float64, which gradcheck needs)."""
    return torch.promote_types(dtype, torch.float32)


def _chunk_forward(z: Tensor, tgt: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """z: [c, V] float32 tempered logits (overwritten). Returns logp [c], lse [c], entropy [c]."""
    lse = torch.logsumexp(z, dim=-1)  # [c]
    logp = z.gather(1, tgt[:, None]).squeeze(1) - lse  # [c]
    ent = None
    if with_entropy:
        logq = z.sub_(lse[:, None])  # [c, V] log-probs, in place
        q = torch.exp(logq)  # [c, V]
        ent = -q.mul_(logq).sum(-1)  # H = -sum q log q
    return logp, lse, ent


def _chunk_grad(z: Tensor, lse: Tensor, tgt: Tensor, g: Tensor, temperature: float) -> Tensor:
    """Gradient of sum(g * logp) w.r.t. the raw (untempered) logits of a chunk.

    z: [c, V] float32 tempered logits (overwritten and returned). d logp / d z = onehot - softmax,
    and z = raw / T adds a factor 1/T.
    """
    gs = g.to(z.dtype) / temperature  # [c]
    p = z.sub_(lse[:, None]).exp_()  # [c, V] softmax
    p.mul_(-gs[:, None])
    p.scatter_add_(1, tgt[:, None], gs[:, None])
    return p


class _LinearLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, with_entropy):
        n = hidden.shape[0]
        acc = _acc(hidden.dtype)
        logp = hidden.new_empty(n, dtype=acc)  # [N]
        lse = hidden.new_empty(n, dtype=acc)  # [N]
        ent = hidden.new_empty(n if with_entropy else 0, dtype=acc)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = _tempered_logits(hidden[s:e], weight, bias, temperature)  # [c, V] float32
            lp, ls, en = _chunk_forward(z, targets[s:e], with_entropy)
            logp[s:e], lse[s:e] = lp, ls
            if with_entropy:
                ent[s:e] = en
            del z
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, _g_ent):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        t, cs = ctx.temperature, ctx.chunk_size
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n = hidden.shape[0]
        grad_h = torch.empty_like(hidden) if need_h else None  # [N, H]
        # Accumulate the weight gradient across chunks in float32 (or float64); one rounding at
        # the end.
        acc = _acc(weight.dtype)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_b else None
        for s in range(0, n, cs):
            e = min(s + cs, n)
            h = hidden[s:e]  # [c, H]
            z = _tempered_logits(h, weight, None if bias is None else bias.detach(), t)
            gz = _chunk_grad(z, lse[s:e], targets[s:e], g_logp[s:e], t)  # [c, V] float32
            gz_low = gz.to(weight.dtype)
            if need_h:
                grad_h[s:e] = gz_low @ weight  # [c, H]
            if need_w:
                if weight.dtype == acc:
                    grad_w.addmm_(gz.t(), h)  # [V, H]
                else:
                    grad_w += gz_low.t() @ h  # low-precision matmul (fast path), fp32 accumulation
            if need_b:
                grad_b += gz.sum(0)
            del z, gz, gz_low
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            None,
        )


def _tempered_logits(h: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """[c, H] x [V, H] -> [c, V] float32 logits / T (matmul in the parameters' dtype)."""
    z = h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())
    z = z.to(_acc(z.dtype))  # no copy when already float32
    if temperature != 1.0:
        z = z.div_(temperature)
    return z


class _LogitsLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature, chunk_size, with_entropy):
        n = logits.shape[0]
        acc = _acc(logits.dtype)
        logp = logits.new_empty(n, dtype=acc)
        lse = logits.new_empty(n, dtype=acc)
        ent = logits.new_empty(n if with_entropy else 0, dtype=acc)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = logits[s:e].detach().to(acc)
            if z.data_ptr() == logits[s:e].data_ptr():
                z = z.clone()  # float32 input: never overwrite the caller's logits
            if temperature != 1.0:
                z.div_(temperature)
            lp, ls, en = _chunk_forward(z, targets[s:e], with_entropy)
            logp[s:e], lse[s:e] = lp, ls
            if with_entropy:
                ent[s:e] = en
            del z
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, _g_ent):
        logits, targets, lse = ctx.saved_tensors
        t, cs = ctx.temperature, ctx.chunk_size
        n = logits.shape[0]
        grad = torch.empty_like(logits)  # [N, V] in the logits' dtype: the gradient's own shape
        for s in range(0, n, cs):
            e = min(s + cs, n)
            z = logits[s:e].to(_acc(logits.dtype))
            z = z.clone() if z.data_ptr() == logits[s:e].data_ptr() else z
            if t != 1.0:
                z.div_(t)
            grad[s:e] = _chunk_grad(z, lse[s:e], targets[s:e], g_logp[s:e], t)
            del z
        return grad, None, None, None, None


def _check(chunk_size: int, temperature: float) -> None:
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r}: must be >= 1")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r}: must be > 0")


def logprobs_and_entropy(
    hidden: Tensor,
    lm_head_weight: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    lm_head_bias: Tensor | None = None,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """log pi(target) and entropy of softmax((hidden @ W^T + b) / T), chunked over rows.

    hidden: [..., H]; lm_head_weight: [V, H]; targets: [...] long in [0, V).
    Returns logprobs [...] float32 (differentiable w.r.t. hidden, weight and bias) and entropy
    [...] float32 without gradient (None when with_entropy=False). Never holds more than one
    chunk of [chunk_size, V] float32 logits (plus one work buffer) at a time, forward or backward.
    """
    _check(chunk_size, temperature)
    lead = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])  # [N, H]
    tgt = targets.reshape(-1).long()  # [N]
    if h.shape[0] != tgt.shape[0]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} disagree")
    logp, ent = _LinearLogprobEntropy.apply(
        h, lm_head_weight, lm_head_bias, tgt, float(temperature), int(chunk_size), with_entropy
    )
    return logp.reshape(lead), (ent.reshape(lead) if with_entropy else None)


def logprobs_and_entropy_from_logits(
    logits: Tensor,
    targets: Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    *,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Same as logprobs_and_entropy, from already computed logits [..., V] (any float dtype).

    Only one float32 chunk exists at a time; the gradient w.r.t. logits is written chunk by
    chunk into a tensor of the logits' own shape and dtype.
    """
    _check(chunk_size, temperature)
    lead = targets.shape
    z = logits.reshape(-1, logits.shape[-1])  # [N, V]
    tgt = targets.reshape(-1).long()
    if z.shape[0] != tgt.shape[0]:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree")
    logp, ent = _LogitsLogprobEntropy.apply(z, tgt, float(temperature), int(chunk_size), with_entropy)
    return logp.reshape(lead), (ent.reshape(lead) if with_entropy else None)
