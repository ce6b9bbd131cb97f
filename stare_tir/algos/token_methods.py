"""The STARE paper's token-level baselines, each a small pure function found by name.

A method is one function and its settings dataclass, registered together under one name:

    @TOKEN_METHODS.register("kl_cov", config=KLCovConfig)
    def kl_cov(t: TokenInputs, cfg: KLCovConfig) -> TokenEffect: ...

and is then selectable by `algo.token_methods=[kl_cov]`, its settings under `algo.kl_cov.*`, with a
preset `algo.name=kl_cov` (GRPO-ds plus the method, and the settings' `preset`). Every method sees
the loss tokens (model-written tokens) of one selection group as flat tensors in a fixed order
(`TokenInputs`): the log-probability of the sampled token and the entropy at its position under the
policy of this step (from the recompute pass; equal to the update pass's own at the first update),
its advantage, and a seeded generator. It returns a `TokenEffect`:

    advantages  shaped advantages (None: unchanged)
    weights     constant factors >= 0 on the per-token loss (None: all 1); 0 silences a token while
                it stays in the loss's normaliser (verl's `corr = 0` of Clip-Cov)
    keep        tokens that stay in the loss (None: all); a removed token has exactly zero gradient
                and leaves the normaliser too ("renormalise": 80/20 rule, STAPO)
    kl_coef     per-token coefficient of |log pi - log pi_old| (KL-Cov), None: none
    selected    the tokens the method selected or changed (logged as algo/selected_frac)

With its selection empty or its coefficient 0 each method returns no change at all, so the update is
GRPO-ds's bit for bit (tests/algos/test_algos_token_methods.py). Selections are exact: counts follow
the stated formulas, ties at a threshold go to the lower position. Where a paper and its code differ,
the code is followed and the docstring says so. Selection runs once per mini-batch with the current
policy's log-probs and entropies, as verl selects inside the loss on every mini-batch: on the first
(on-policy) mini-batch those of the recompute pass, on later ones those of a no-grad pass over the
mini-batch after the earlier optimizer steps (`trainer/mini_batches.py`). The authors' code does
this inside the loss for KL-Cov, Clip-Cov, the 80/20 rule and STEER (and STARE); for the entropy
advantage and STAPO it was not checked, and they re-select the same way. Methods applied together
compose by `combine_effects`.

torch is imported inside the functions: the config and `--help` read this registry (names and
settings) without loading torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

from registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import Tensor


@dataclass
class TokenEffect:
    """What a token method does to the loss tokens of one selection group (see the module docstring)."""

    selected: Tensor  # [N] bool
    advantages: Tensor | None = None  # [N] float
    weights: Tensor | None = None  # [N] float, >= 0
    keep: Tensor | None = None  # [N] bool
    kl_coef: Tensor | None = None  # [N] float
    metrics: dict = field(default_factory=dict)


@dataclass
class TokenInputs:
    """The loss tokens of one selection group, flat and in a fixed order."""

    logprobs: Tensor  # [N] log pi of the sampled token under the current policy
    entropy: Tensor  # [N] entropy at the token's position under the current policy
    advantages: Tensor  # [N] the trajectory's advantage (as shaped by the methods before this one)
    generator: torch.Generator | None = None  # seeded per step and group (random selections)
    # [N] log pi_old, the rollout batch's stored log-probs; None: equal to logprobs (the first,
    # on-policy mini-batch of a step). Later mini-batches see the policy after earlier updates.
    old_logprobs: Tensor | None = None
    # The step's token-mean policy entropy (global batch, recompute pass) and the run's first one
    # (kept in the checkpoint); None where the trainer does not give them (unit calls).
    batch_entropy: float | None = None
    initial_entropy: float | None = None


TokenMethodFn = Callable[[TokenInputs, Any], TokenEffect]

# algo.token_methods: methods by name, each registered with its settings dataclass.
TOKEN_METHODS: Registry[TokenMethodFn] = Registry("token method")


def ceil_frac(frac: float, n: int) -> int:
    """ceil(frac * n) computed exactly in decimal (0.2 * 15 is 3, not 4), at least 1 when n > 0."""
    if n <= 0:
        return 0
    return max(1, math.ceil(Fraction(repr(float(frac))) * n))


def floor_frac(frac: float, n: int) -> int:
    """max(1, int(frac * n)) as verl computes it (float product, truncated), for n > 0."""
    return max(1, int(n * frac)) if n > 0 else 0


def top_k_positions(values: Tensor, k: int) -> Tensor:
    """Positions of exactly k largest entries (ties at the threshold go to the lower position).
    O(N): the threshold is the k-th largest value (one selection, no sort)."""
    import torch

    n = values.numel()
    if k <= 0:
        return torch.zeros(0, dtype=torch.long, device=values.device)
    if k >= n:
        return torch.arange(n, device=values.device)
    threshold = torch.kthvalue(values, n - k + 1).values  # the k-th largest
    above = torch.nonzero(values > threshold).squeeze(1)
    ties = torch.nonzero(values == threshold).squeeze(1)[: k - above.numel()]
    return torch.sort(torch.cat([above, ties])).values


def quantile(values: Tensor, q: float) -> float:
    """torch.quantile's linear-interpolation quantile by two selections instead of a sort."""
    import torch

    n = values.numel()
    pos = q * (n - 1)
    lo, frac = int(pos), pos - int(pos)
    a = torch.kthvalue(values, lo + 1).values
    if frac == 0.0 or lo + 1 >= n:
        return float(a)
    b = torch.kthvalue(values, lo + 2).values
    return float(a + (b - a) * frac)


def _mask_at(n: int, positions: Tensor, device: torch.device) -> Tensor:
    import torch

    out = torch.zeros(n, dtype=torch.bool, device=device)
    out[positions] = True
    return out


def _covariance(advantages: Tensor, logprobs: Tensor) -> Tensor:
    """Per-token (A - mean A) (log pi - mean log pi) over the group's tokens: the covariance terms whose
    sum drives the entropy change of a policy-gradient step (Cui et al., Eq. 4)."""
    a = advantages.double()
    lp = logprobs.double()
    return (a - a.mean()) * (lp - lp.mean())


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
    cov = _covariance(advantages, logprobs)
    sel = _mask_at(n, top_k_positions(cov, floor_frac(ratio, n)), logprobs.device)
    return TokenEffect(selected=sel, kl_coef=sel.to(torch.float32) * coef)


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
    cov = _covariance(advantages, logprobs)
    cand = torch.nonzero((cov > lb) & (cov < ub)).squeeze(1)  # ascending positions
    k = min(floor_frac(ratio, n), cand.numel())
    if k == 0 or ratio == 0.0:
        return TokenEffect(selected=torch.zeros(n, dtype=torch.bool, device=device))
    pick = torch.randperm(cand.numel(), generator=generator)[:k].to(device)
    sel = _mask_at(n, cand[pick], device)
    return TokenEffect(selected=sel, weights=(~sel).to(torch.float32))


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
    keep = _mask_at(n, top_k_positions(entropy, k), device)
    return TokenEffect(selected=keep, keep=keep)


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


@dataclass
class StapoConfig:
    """STAPO (Liu et al. 2026, arXiv 2602.15620): silence positive-advantage tokens with low probability
    and low entropy ("spurious tokens"), renormalising the loss over the remaining tokens.

    The thresholds are those the authors' own summary of the paper gives (pi < 0.01; entropy below
    the 5th percentile of the batch's token entropies); the paper's text was not available to
    confirm them, so both are settings.
    """

    # tau_p: a token is a candidate when pi(token) < prob_max.
    prob_max: float = 0.01
    # tau_h as a quantile of the loss tokens' entropies (of the selection group) ...
    entropy_quantile: float = 0.05
    # ... or as an absolute value in nats (set it to use it instead of the quantile).
    entropy_max: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.prob_max <= 1.0:
            raise ValueError(f"prob_max={self.prob_max!r}: must be in [0, 1]")
        if not 0.0 <= self.entropy_quantile <= 1.0:
            raise ValueError(f"entropy_quantile={self.entropy_quantile!r}: must be in [0, 1]")
        if self.entropy_max is not None and self.entropy_max < 0.0:
            raise ValueError(f"entropy_max={self.entropy_max!r}: must be >= 0 or null")


@TOKEN_METHODS.register("stapo", config=StapoConfig)
def stapo(t: TokenInputs, cfg: StapoConfig) -> TokenEffect:
    """STAPO's silencing of spurious tokens (Liu et al. 2026, arXiv 2602.15620).

    A token is spurious when A > 0, pi(token) < prob_max and H < tau_h, tau_h = entropy_max or else
    the entropy_quantile-quantile of the group's token entropies (linear interpolation, as
    torch.quantile). Spurious tokens leave the loss and its normaliser ("mask and renormalise over
    valid tokens"). See `StapoConfig` for where the thresholds come from. prob_max = 0 silences none.
    """
    import torch

    logprobs, entropy, advantages = t.logprobs, t.entropy, t.advantages
    prob_max, entropy_quantile, entropy_max = cfg.prob_max, cfg.entropy_quantile, cfg.entropy_max

    n = entropy.numel()
    device = entropy.device
    if n == 0 or prob_max <= 0.0:
        return TokenEffect(selected=torch.zeros(n, dtype=torch.bool, device=device))
    h = entropy.double()
    tau_h = entropy_max if entropy_max is not None else quantile(h, entropy_quantile)
    # pi < prob_max, compared in log space (the recompute pass gives log pi)
    spurious = (advantages > 0) & (logprobs.double() < math.log(prob_max)) & (h < tau_h)
    if not bool(spurious.any()):
        return TokenEffect(selected=spurious)
    return TokenEffect(selected=spurious, keep=~spurious)


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


@dataclass
class EapoConfig:
    """EAPO (arXiv 2605.27846): positive samples weighted by the current over the initial entropy."""

    # w+ = clamp((H_t / H_0) ** alpha, w_min, w_max) on A > 0; alpha = 0 gives w+ = 1 (GRPO-ds).
    alpha: float = 1.0
    w_min: float = 0.0
    w_max: float | None = None

    def __post_init__(self) -> None:
        if self.alpha < 0.0:
            raise ValueError(f"alpha={self.alpha!r}: must be >= 0")
        if self.w_min < 0.0 or (self.w_max is not None and self.w_max < max(self.w_min, 1e-12)):
            raise ValueError(f"w_min={self.w_min!r}, w_max={self.w_max!r}: need 0 <= w_min <= w_max")


@TOKEN_METHODS.register("eapo", config=EapoConfig)
def eapo(t: TokenInputs, cfg: EapoConfig) -> TokenEffect:
    """EAPO (Zeng et al. 2026, arXiv 2605.27846, "Entropy-driven Adaptive Policy Optimization").

    The reading implemented: the paper's text and code were not available here, only its abstract:
    positive samples get a weight computed from the ratio of the current policy entropy to the
    initial entropy, reduced while entropy falls below it and amplified while it rises above it;
    positive and negative samples are split at the group's reward mean. Here: H_t = the step's
    token-mean policy entropy over the global batch (recompute pass), H_0 = the first step's (kept
    in the checkpoint), "positive" = A > 0 (GRPO's advantage is the reward minus the group mean,
    scaled), and every token of a positive sample gets w+ = clamp((H_t / H_0) ** alpha, w_min,
    w_max), alpha = 1 by default (the power law is this reading's choice; the abstract gives no
    formula). Negative samples keep weight 1. H_t = H_0 (the first step) gives w+ = 1 exactly, and
    alpha = 0 gives 1 always: GRPO-ds bit for bit. Without the entropies (None) nothing changes.
    selected = the tokens whose weight is not 1.
    """
    import torch

    n = t.advantages.numel()
    device = t.advantages.device
    none = TokenEffect(selected=torch.zeros(n, dtype=torch.bool, device=device))
    h_t, h_0 = t.batch_entropy, t.initial_entropy
    if n == 0 or h_t is None or h_0 is None or not (h_0 > 0.0 and math.isfinite(h_t)):
        return none
    w_pos = (h_t / h_0) ** cfg.alpha
    w_pos = max(w_pos, cfg.w_min)
    if cfg.w_max is not None:
        w_pos = min(w_pos, cfg.w_max)
    pos = t.advantages > 0
    w = torch.where(pos, torch.tensor(w_pos, dtype=torch.float32), torch.tensor(1.0)).to(device)
    return TokenEffect(selected=pos & (w != 1.0), weights=w, metrics={"positive_weight": w_pos})


def combine_effects(effects: list[TokenEffect], advantages: Tensor) -> TokenEffect:
    """Compose methods applied in order to the same tokens: the last shaped advantages, the product of
    weights, the intersection of kept tokens, the sum of KL coefficients, the union of selections.
    The trainer composes the methods of a run with this function (trainer/shaping.py)."""
    import torch

    out = TokenEffect(selected=torch.zeros(advantages.numel(), dtype=torch.bool, device=advantages.device))
    for e in effects:
        out.selected = out.selected | e.selected
        if e.advantages is not None:
            out.advantages = e.advantages
        if e.weights is not None:
            out.weights = e.weights if out.weights is None else out.weights * e.weights
        if e.keep is not None:
            out.keep = e.keep if out.keep is None else out.keep & e.keep
        if e.kl_coef is not None:
            out.kl_coef = e.kl_coef if out.kl_coef is None else out.kl_coef + e.kl_coef
    return out
