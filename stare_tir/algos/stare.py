"""STARE: surprisal-targeted advantage reweighting with a target-entropy gate.

Among response tokens with positive advantage (T+), the top-P fraction by surprisal
s = -log pi(token) (L+) gets its advantage multiplied by W > 1: reinforcing a correct but
surprising choice raises entropy, counteracting the entropy collapse of plain GRPO. Variant C2
also multiplies the top-P surprisal tokens of T- (L-) by M < 1: penalising a surprising token
pushes probability mass onto the already likely ones and lowers entropy, so C2 softens it.
Everything else keeps weight 1. The weights act only while the batch entropy is below a target
(StareController, the state of the token method `stare`: algos/methods/stare.py); with the gate off
the trainer passes no weights and the update is exactly GRPO.

Selection is exact: |L+| = ceil(P * |T+|) (at least 1 when T+ is non-empty), ties at the
threshold broken towards the lower flat index, so results never depend on the sort algorithm.
It costs O(N) with a small constant, which matters because it runs on every token of the batch:
a spread-out sample bounds each threshold from below, one pass compacts the ~1.1 P N tokens above
the bounds, and an exact partial top-k runs on those only (no sort of the whole batch). Surprisal
must not contain NaN.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Literal

import torch
from torch import Tensor

from stare_tir.algos.stare_config import StareConfig

Variant = Literal["O1", "C2"]
Scope = Literal["batch", "micro_batch"]


def num_selected(top_p: float, n: int) -> int:
    """ceil(P * n), at least 1 when n > 0. Exact in decimal: 0.1 * 30 is 3, not 4 (float gives
    3.0000000000000004, whose ceil would be 4)."""
    if n <= 0:
        return 0
    return max(1, math.ceil(Fraction(repr(float(top_p))) * n))


# Above 8 * _SAMPLE tokens the thresholds are first estimated on a sample of _SAMPLE tokens, taken
# as _SAMPLE / _BLOCK runs of _BLOCK adjacent tokens spread evenly over the batch: a run fills one
# cache line, so the sample reads ~16x less memory than a plain stride would.
_SAMPLE = 16384
_BLOCK = 16


def _top_positions(vals: Tensor, k: int) -> Tensor:
    """Positions of exactly k largest entries of vals [n] (ties -> lower position)."""
    top, pos = torch.topk(vals, k, sorted=False)  # partial selection, no full sort
    t = top.min()  # the k-th largest value
    if int(torch.count_nonzero(vals >= t)) == k:
        return pos  # no tie straddles the threshold: the set is unique
    # Ties straddle the threshold: keep all above it, then the first ties by position, so the
    # set never depends on topk's internal order.
    above = torch.nonzero(vals > t).squeeze(1)
    ties = torch.nonzero(vals == t).squeeze(1)[: k - above.numel()]
    return torch.cat([above, ties])


def _side(a: Tensor, positive: bool, keep: Tensor | None) -> Tensor:
    """Candidate mask T+ (A > 0) or T- (A < 0), restricted to kept tokens."""
    cand = a > 0 if positive else a < 0
    if keep is not None:
        cand &= keep
    return cand


def _top_positions_banded(vals: Tensor, k: int, t_hi: Tensor | None) -> Tensor:
    """_top_positions, given t_hi, a value the k-th largest is likely not above: entries > t_hi
    are taken as they are and the exact choice runs on the rest only (a few thousand)."""
    if t_hi is None:
        return _top_positions(vals, k)
    above = torch.nonzero(vals > t_hi).squeeze(1)
    n_hi = above.numel()
    if n_hi > k:
        return _top_positions(vals, k)  # t_hi was too low: plain exact selection
    if n_hi == k:
        return above  # everything else is <= t_hi < every chosen value: no tie possible
    band = torch.nonzero(vals <= t_hi).squeeze(1)  # ascending, so position order (ties) is kept
    # the final threshold is <= t_hi, so every entry equal to it is in the band
    return torch.cat([above, band[_top_positions(vals[band], k - n_hi)]])


def _sample_positions(n: int, device: torch.device) -> Tensor:
    """[_SAMPLE] flat positions: _SAMPLE / _BLOCK runs of _BLOCK tokens, evenly spread over n."""
    n_runs = _SAMPLE // _BLOCK
    step = n // n_runs  # >= 8 * _BLOCK since n > 8 * _SAMPLE
    starts = torch.arange(n_runs, device=device) * step
    return (starts[:, None] + torch.arange(_BLOCK, device=device)).reshape(-1)


def _select_sampled(
    s: Tensor,
    a: Tensor,
    keep: Tensor | None,
    requests: list[tuple[bool, int, int]],
    pos_mask: Tensor | None = None,
) -> list[Tensor | None]:
    """Exact top-k selection for large N, for T+ and/or T- in one pass over the tokens.

    requests: (positive, k, n_cand) per side; pos_mask: the T+ mask if already built.
    For each side a sample estimates the k-th largest candidate surprisal; t_lo and
    t_hi sit ~4 sigma of sampling noise below and above it. One pass compacts every token
    >= min(t_lo) (about 1.1 k per side); each side keeps its own candidates >= its t_lo, takes
    those > t_hi and selects exactly inside [t_lo, t_hi]. Every token equal to a final
    threshold is >= t_lo, so ties resolve exactly as on the full set. A side whose sample
    cannot bound the threshold, or was unlucky (fewer than k tokens >= t_lo), gets None and
    the caller selects it on the full set, with the same result.
    """
    at = _sample_positions(s.numel(), s.device)
    s_st, a_st = s[at], a[at]
    keep_st = None if keep is None else keep[at]
    bounds: list[tuple[Tensor, Tensor | None] | None] = []
    for positive, k, n_cand in requests:
        sample = s_st[_side(a_st, positive, keep_st)]  # [m_c]
        m_c = sample.numel()
        r = math.ceil(k * m_c / n_cand)  # expected rank (from the top) of the threshold
        margin = 4 * math.isqrt(r) + 16
        if r + margin >= m_c:
            bounds.append(None)  # the threshold is too deep into the candidates to bound
            continue
        t_lo = torch.kthvalue(sample, m_c - r - margin + 1).values  # (r + margin)-th largest
        t_hi = torch.kthvalue(sample, m_c - r + margin + 1).values if r > margin else None
        bounds.append((t_lo, t_hi))
    live = [b for b in bounds if b is not None]
    if not live:
        return [None] * len(requests)
    t_min = live[0][0] if len(live) == 1 else torch.minimum(live[0][0], live[1][0])
    near_any = s >= t_min  # [N] bool
    live_sides = [req[0] for req, b in zip(requests, bounds) if b is not None]
    only_pos = live_sides == [True] and pos_mask is not None
    if only_pos:
        near_any &= pos_mask  # T+ only (O1): compact exactly its candidates >= t_lo
    sub = torch.nonzero(near_any).squeeze(1)  # [~1.1 k per side], ascending flat indices
    s_sub = s[sub]
    out: list[Tensor | None] = []
    for (positive, k, _), b in zip(requests, bounds):
        if b is None:
            out.append(None)
            continue
        if only_pos:
            cand_sub, s_cand = sub, s_sub
        else:
            near = _side(a[sub], positive, None if keep is None else keep[sub])
            near &= s_sub >= b[0]
            pos = torch.nonzero(near).squeeze(1)  # ascending, so flat-index order is kept
            cand_sub, s_cand = sub[pos], s_sub[pos]
        if cand_sub.numel() < k:
            out.append(None)  # unlucky sample: t_lo was above the true threshold
            continue
        out.append(cand_sub[_top_positions_banded(s_cand, k, b[1])])
    return out


def _stare_counts(
    surprisal: Tensor,
    advantages: Tensor,
    mask: Tensor | None,
    top_p: float,
    w: float,
    m: float,
    variant: str,
) -> tuple[Tensor, dict]:
    if variant not in ("O1", "C2"):
        raise ValueError(f"variant={variant!r}: one of 'O1', 'C2'")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p!r}: must be in (0, 1]")
    if w <= 0 or m <= 0:
        raise ValueError(f"w={w!r}, m={m!r}: weights must be > 0 to keep every gradient's sign")
    if surprisal.shape != advantages.shape:
        raise ValueError(f"surprisal {tuple(surprisal.shape)} and advantages {tuple(advantages.shape)} differ")
    shape = surprisal.shape
    s = surprisal.detach().reshape(-1)  # [N]
    a = advantages.detach().reshape(-1)  # [N]
    keep = None if mask is None else mask.reshape(-1).bool()  # [N]
    # Allocated before the temporaries so that, once they are freed, they leave one contiguous
    # hole (CPU allocators otherwise fragment and the loss that follows pays fresh page faults).
    omega = torch.ones(s.shape, dtype=torch.float32, device=s.device)  # [N]

    cand_pos = _side(a, True, keep)  # [N] bool, T+
    n_pos = int(torch.count_nonzero(cand_pos))
    # |T-| = |A != 0| - |T+|: a count, no second [N] mask
    nonzero = a if keep is None else torch.where(keep, a, 0.0)
    n_neg = int(torch.count_nonzero(nonzero)) - n_pos
    counts = {
        "tokens": s.numel() if keep is None else int(torch.count_nonzero(keep)),
        "cand_pos": n_pos,
        "cand_neg": n_neg,
        "sel_pos": num_selected(top_p, n_pos),
        "sel_neg": num_selected(top_p, n_neg) if variant == "C2" else 0,
    }
    requests = [
        (positive, counts[key], n)
        for positive, key, n in ((True, "sel_pos", n_pos), (False, "sel_neg", n_neg))
        if counts[key] > 0
    ]
    picked: list[Tensor | None] = [None] * len(requests)
    if s.numel() > 8 * _SAMPLE and requests:
        picked = _select_sampled(s, a, keep, requests, cand_pos)
    for (positive, k, _), idx in zip(requests, picked):
        if idx is None:  # small input or unlucky sample: exact selection on the full set
            cand = cand_pos if positive else _side(a, False, keep)
            idx = _top_positions(torch.where(cand, s, float("-inf")), k)  # k <= |cand|: never -inf
        omega.index_fill_(0, idx, w if positive else m)
    return omega.reshape(shape), counts


def stare_group_weights(
    surprisal: Tensor, advantages: Tensor, *, top_p: float, w: float, m: float, variant: str
) -> tuple[Tensor, dict]:
    """omega over one selection group's loss tokens ([N] each) and the group's counts (tokens,
    cand_pos, cand_neg, sel_pos, sel_neg): summed over groups, `stare_metrics` gives the metrics
    `stare_token_weights_scoped` logs. The trainer's STARE entry calls this once per group."""
    return _stare_counts(surprisal, advantages, None, top_p, w, m, variant)


def stare_metrics(c: dict, w: float, m: float) -> dict:
    n = max(c["tokens"], 1)
    sel = c["sel_pos"] + c["sel_neg"]
    return {
        "stare/reweighted_frac": sel / n,
        "stare/mean_weight": (c["tokens"] - sel + w * c["sel_pos"] + m * c["sel_neg"]) / n,
        "stare/cand_pos_ratio": c["cand_pos"] / n,
        "stare/cand_neg_ratio": c["cand_neg"] / n,
        "stare/selected_pos": float(c["sel_pos"]),
        "stare/selected_neg": float(c["sel_neg"]),
        "stare/tokens": float(c["tokens"]),
    }


def stare_token_weights(
    surprisal: Tensor,
    advantages: Tensor,
    *,
    top_p: float = 0.1,
    w: float = 1.1,
    m: float = 0.9,
    variant: Variant = "O1",
    mask: Tensor | None = None,
) -> tuple[Tensor, dict]:
    """STARE token weights omega over the tokens of one selection scope.

    surprisal: [N] (-log pi of each sampled token; any shape works, flattened in index order).
    advantages: same shape, the trajectory advantage broadcast to its tokens.
    mask: optional, same shape; tokens with mask 0 are never candidates and are not counted.
        Without it every element is a response token (pass the flat loss-mask tokens).
    Returns omega (float32, same shape, no grad): w on L+, m on L- (variant C2), 1 elsewhere;
    and metrics: reweighted fraction, mean weight, candidate ratios |T+|/N and |T-|/N.
    """
    omega, counts = _stare_counts(surprisal, advantages, mask, top_p, w, m, variant)
    return omega, stare_metrics(counts, w, m)


def stare_token_weights_scoped(
    surprisals: list[Tensor],
    advantages: list[Tensor],
    *,
    scope: Scope = "batch",
    masks: list[Tensor] | None = None,
    top_p: float = 0.1,
    w: float = 1.1,
    m: float = 0.9,
    variant: Variant = "O1",
) -> tuple[list[Tensor], dict]:
    """Weights for a list of micro-batches (any shapes), selecting over their union ("batch")
    or inside each one ("micro_batch"). With data parallelism, pass the micro-batches of all
    ranks (all-gathered) for scope "batch" and keep this rank's slices: every rank computes the
    same global selection."""
    if scope not in ("batch", "micro_batch"):
        raise ValueError(f"scope={scope!r}: one of 'batch', 'micro_batch'")
    if len(surprisals) != len(advantages) or (masks is not None and len(masks) != len(surprisals)):
        raise ValueError("surprisals, advantages (and masks) must have one entry per micro-batch")
    kw = dict(top_p=top_p, w=w, m=m, variant=variant)
    if scope == "batch":
        flat_s = torch.cat([s.reshape(-1) for s in surprisals])  # [sum N_i]
        flat_a = torch.cat([a.reshape(-1) for a in advantages])
        flat_m = None if masks is None else torch.cat([x.reshape(-1) for x in masks])
        omega, counts = _stare_counts(flat_s, flat_a, flat_m, **kw)
        parts = torch.split(omega, [s.numel() for s in surprisals])
        return [p.reshape(s.shape) for p, s in zip(parts, surprisals)], stare_metrics(counts, w, m)
    out, total = [], None
    for i, (s, a) in enumerate(zip(surprisals, advantages)):
        omega, counts = _stare_counts(s, a, None if masks is None else masks[i], **kw)
        out.append(omega)
        total = counts if total is None else {k: total[k] + counts[k] for k in total}
    if total is None:
        total = {"tokens": 0, "cand_pos": 0, "cand_neg": 0, "sel_pos": 0, "sel_neg": 0}
    return out, stare_metrics(total, w, m)


class StareController:
    """Target-entropy gate and optional adaptive W/M schedule: the state of the token method `stare`
    (stare_tir/algos/methods/stare.py), checkpointed with the run.

    Call update(H) once per step with the batch-mean entropy H of response tokens (from this
    step's recompute pass). The gate is on iff H < target_entropy (always, in open loop). With
    adaptive=True, before the weights of the step are used:
        W <- clip(W + a * sign(Htgt - H), 1, Wmax);  M <- clip(M - a * sign(Htgt - H), Mmin, 1)
    """

    def __init__(
        self,
        target_entropy: float = 0.3,
        w: float = 1.1,
        m: float = 0.9,
        adaptive: bool = False,
        adapt_rate: float = 0.01,
        w_max: float = 2.0,
        m_min: float = 0.5,
        open_loop: bool = False,
    ) -> None:
        # Reuse the config's range checks so a controller is never built from bad values.
        StareConfig(
            w=w,
            m=m,
            target_entropy=target_entropy,
            adaptive=adaptive,
            adapt_rate=adapt_rate,
            w_max=w_max,
            m_min=m_min,
            open_loop=open_loop,
        )
        self.target_entropy = float(target_entropy)
        self.w = float(w)
        self.m = float(m)
        self.adaptive = adaptive
        self.adapt_rate = float(adapt_rate)
        self.w_max = float(w_max)
        self.m_min = float(m_min)
        self.open_loop = open_loop
        self.gate_on = False
        self.last_entropy: float | None = None
        self.steps = 0
        # Steps whose batch entropy was NaN or infinite: their update kept the previous state.
        self.nonfinite_entropy_steps = 0

    @classmethod
    def from_config(cls, cfg: StareConfig) -> StareController:
        return cls(
            target_entropy=cfg.target_entropy,
            w=cfg.w,
            m=cfg.m,
            adaptive=cfg.adaptive,
            adapt_rate=cfg.adapt_rate,
            w_max=cfg.w_max,
            m_min=cfg.m_min,
            open_loop=cfg.open_loop,
        )

    def update(self, batch_entropy: float) -> bool:
        """Set the gate (and adapt W/M) from this step's batch entropy; returns gate_on.

        A non-finite entropy (NaN or inf, e.g. from a diverged recompute pass) carries no
        information about the policy: the gate, W and M keep their previous values and the step
        is counted in `nonfinite_entropy_steps` (a metric), rather than killing the run. The
        update that follows is then guarded by the trainer's non-finite-step limit.
        """
        h = float(batch_entropy)
        if not math.isfinite(h):
            self.nonfinite_entropy_steps += 1
            return self.gate_on
        self.gate_on = self.open_loop or h < self.target_entropy
        if self.adaptive:
            d = self.target_entropy - h
            sgn = (d > 0) - (d < 0)
            self.w = min(max(self.w + self.adapt_rate * sgn, 1.0), self.w_max)
            self.m = min(max(self.m - self.adapt_rate * sgn, self.m_min), 1.0)
        self.last_entropy = h
        self.steps += 1
        return self.gate_on

    def metrics(self) -> dict:
        # The gate and the batch entropy are logged by the trainer (stare/gate_on, entropy/batch).
        return {
            "stare/w": self.w,
            "stare/m": self.m,
            "stare/nonfinite_entropy_steps": float(self.nonfinite_entropy_steps),
        }

    def state_dict(self) -> dict:
        return {
            "w": self.w,
            "m": self.m,
            "gate_on": self.gate_on,
            "last_entropy": self.last_entropy,
            "steps": self.steps,
            "nonfinite_entropy_steps": self.nonfinite_entropy_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        missing = {"w", "m", "gate_on", "steps"} - set(state)
        if missing:
            raise KeyError(f"StareController state lacks {sorted(missing)}")
        self.w = float(state["w"])
        self.m = float(state["m"])
        self.gate_on = bool(state["gate_on"])
        self.last_entropy = state.get("last_entropy")
        self.steps = int(state["steps"])
        self.nonfinite_entropy_steps = int(state.get("nonfinite_entropy_steps", 0))
