"""Settings of the token-level baselines and of verl's partition, apart from their tensor code so that
a config (and a CLI --help) loads without torch. Each default cites where it comes from; the formulas
are in `stare_tir.algos.token_methods`.
"""

from __future__ import annotations

from dataclasses import dataclass

# The registered token methods (stare_tir.algos.token_methods), each with a section of the same name
# in the algo config; listed here so that a config validates without importing torch.
TOKEN_METHOD_NAMES: tuple[str, ...] = ("kl_cov", "clip_cov", "entropy_80_20", "entropy_adv", "stapo")


@dataclass
class KLCovConfig:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617): a KL penalty on the top-k covariance tokens."""

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


@dataclass
class TopEntropyConfig:
    """The 80/20 rule (Wang et al. 2025, arXiv 2506.01939): gradient only through high-entropy tokens."""

    # Share of loss tokens kept, by highest entropy (the paper's 20%; `entropy_top_ratio=0.2`).
    top_frac: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 < self.top_frac <= 1.0:
            raise ValueError(f"top_frac={self.top_frac!r}: must be in (0, 1]")


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


@dataclass
class OverlongPenaltyConfig:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476; verl DAPORewardManager):
    r += min(-(|y| - (L_max - L_cache)) / L_cache * factor, 0), |y| every response token (model and
    tool output), L_max = rollout.max_total_tokens."""

    # On or off; None: on for algo.name=dapo, off otherwise.
    enabled: bool | None = None
    # L_cache; None: 20% of L_max (DAPO's 4096 of 20480).
    buffer_tokens: int | None = None
    # Penalty at L_max (DAPO: 1.0, the size of the reward gap).
    factor: float = 1.0

    def __post_init__(self) -> None:
        if self.buffer_tokens is not None and self.buffer_tokens < 1:
            raise ValueError(f"buffer_tokens={self.buffer_tokens!r}: must be >= 1 or null")
        if self.factor < 0.0:
            raise ValueError(f"factor={self.factor!r}: must be >= 0")


@dataclass
class VerlPartitionConfig:
    """The official runs' layout, for selection groups and aggregation that equal theirs (scope=verl,
    loss_agg=verl): verl's balance_batch over `ranks` data-parallel GPUs, then dynamic batching of
    each rank's share into micro-batches of about `token_budget` tokens (prompt + response)."""

    # GPUs of the official run (recipe/STARE scripts: 2 nodes x 8 GPUs).
    ranks: int = 16
    # actor.ppo_max_token_len_per_gpu of the official scripts: (1024 + 3072) * 2.
    token_budget: int = 8192

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError(f"ranks={self.ranks!r}: must be >= 1")
        if self.token_budget < 1:
            raise ValueError(f"token_budget={self.token_budget!r}: must be >= 1")
