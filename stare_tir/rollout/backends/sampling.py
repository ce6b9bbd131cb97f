"""Token sampling for the HF backend: temperature, top-k and top-p in one vectorized step, with
per-request seeds that make a request's tokens independent of the batch it runs in."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# splitmix64 constants as signed int64 (torch has no uint64 arithmetic)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)
_STEP = 0xD1B54A32D192ED03 - (1 << 64)


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def seeded_uniform(seeds: torch.Tensor, counters: torch.Tensor, vocab: int) -> torch.Tensor:
    """Uniforms in (0, 1), [B, V] float32, a pure function of (seed, counter, vocab index).

    A counter-based generator (splitmix64 of a 64-bit key): row b of token k of a request depends
    on nothing but its seed and k, so seeded requests sample the same tokens in any batch, in a
    vectorized step (no per-row generator objects).
    """
    import torch

    idx = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    x = (seeds * _GOLDEN + counters * _STEP).unsqueeze(1) + idx.unsqueeze(0) * _GOLDEN  # [B, V]
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    x = x ^ _shr(x, 31)
    return (_shr(x, 40).to(torch.float32) + 0.5) / float(1 << 24)  # 24 bits: exact in float32


def sample_tokens(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ks: list[int],
    top_ps: list[float],
    seeds: list[int | None] | None = None,
    counters: list[int] | None = None,
    rng: torch.Generator | None = None,
) -> tuple[list[int], list[float]]:
    """One token per row of `logits` [B, V] and its logprob under the sampling distribution.

    The distribution is softmax(logits / T) restricted to the top-k tokens and then to the
    smallest prefix of mass >= top_p (renormalised). Sampling is an exponential race,
    argmax(log p - log E) with E ~ Exp(1), which draws exactly from p; seeded rows take their
    uniforms from `seeded_uniform`. T = 0 rows are greedy and report the untempered logprob.
    """
    import torch

    n, vocab = logits.shape
    dev = logits.device
    greedy = [t == 0 for t in temperatures]
    x = logits
    if any(t not in (0.0, 1.0) for t in temperatures):
        t = torch.tensor([t if t > 0 else 1.0 for t in temperatures], device=dev).unsqueeze(1)
        x = x / t  # [B, V]
    if any(0 < k < vocab for k in top_ks):
        k = torch.tensor([k if 0 < k < vocab else vocab for k in top_ks], device=dev)
        top = x.topk(int(k.max()), dim=-1).values  # [B, kmax]
        kth = top.gather(1, (k - 1).unsqueeze(1))  # [B, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if any(p < 1.0 for p in top_ps):
        p = torch.tensor(top_ps, device=dev).unsqueeze(1)
        sx, order = x.sort(dim=-1, descending=True)  # [B, V]
        probs = sx.softmax(-1)
        drop = (probs.cumsum(-1) - probs) > p  # keep the smallest prefix with mass >= p
        x = torch.full_like(x, float("-inf")).scatter(1, order, sx.masked_fill(drop, float("-inf")))
    logp = x.log_softmax(-1)  # [B, V]
    u = torch.rand((n, vocab), generator=rng, device=dev)  # [B, V] in [0, 1): never 1
    if seeds is not None and any(s is not None for s in seeds):
        rows = [i for i, s in enumerate(seeds) if s is not None]
        idx = torch.tensor(rows, device=dev)
        u[idx] = seeded_uniform(
            torch.tensor([seeds[i] for i in rows], device=dev),
            torch.tensor([counters[i] for i in rows], device=dev),
            vocab,
        )
    race = logp - torch.log(-torch.log(u))  # Gumbel-max == exponential race
    sampled = race.argmax(-1)  # [B]
    if any(greedy):
        g = torch.tensor(greedy, device=dev)
        sampled = torch.where(g, logits.argmax(-1), sampled)
        logp = torch.where(g.unsqueeze(1), logits.log_softmax(-1), logp)
    lp = logp.gather(1, sampled.unsqueeze(1)).squeeze(1)
    return sampled.tolist(), lp.tolist()
