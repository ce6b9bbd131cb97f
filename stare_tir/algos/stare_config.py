"""STARE's settings, apart from its tensor code so that a config (and a CLI --help) loads without torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class StareConfig:
    """STARE settings (paper defaults). Composed into the trainer config as algo.stare."""

    # Reweight advantages at all; False => plain GRPO (no weights are ever passed to the loss).
    enabled: bool = True
    # "O1": boost L+ only (the paper's main variant). "C2": also attenuate L- by m.
    variant: Literal["O1", "C2"] = "O1"
    # Fraction P of T+ (and T-) selected by highest surprisal; 0.1 in the paper.
    top_p: float = 0.1
    # Weight W on L+ (> 1 boosts surprising correct tokens, raising entropy).
    w: float = 1.1
    # Weight M on L- (C2 only; < 1 softens penalties on surprising wrong tokens).
    m: float = 0.9
    # Gate: weights apply only while batch-mean response-token entropy is below this.
    target_entropy: float = 0.3
    # Adapt W/M every step by +-adapt_rate towards the target entropy (off in the paper's default).
    adaptive: bool = False
    # Step size a of the adaptive schedule.
    adapt_rate: float = 0.01
    # Upper bound for W under the adaptive schedule (the authors' code defaults to 1.5).
    w_max: float = 2.0
    # Lower bound for M under the adaptive schedule (> 0 keeps every gradient's sign).
    m_min: float = 0.5
    # Gate always on (the paper's open-loop ablation).
    open_loop: bool = False
    # Where L+ and L- are selected is algo.scope: "batch" (the paper's batch-internal quantile) or,
    # to reproduce the authors' runs, "verl" (inside each micro-batch of verl's partition).

    def __post_init__(self) -> None:
        if self.variant not in ("O1", "C2"):
            raise ValueError(f"variant={self.variant!r}: one of 'O1', 'C2'")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p!r}: must be in (0, 1]")
        if self.w_max < 1.0:
            raise ValueError(f"w_max={self.w_max!r}: must be >= 1")
        if not 1.0 <= self.w <= self.w_max:
            raise ValueError(f"w={self.w!r}: must be in [1, w_max={self.w_max}]")
        if not 0.0 < self.m_min <= 1.0:
            raise ValueError(f"m_min={self.m_min!r}: must be in (0, 1]")
        if not self.m_min <= self.m <= 1.0:
            raise ValueError(f"m={self.m!r}: must be in [m_min={self.m_min}, 1]")
        if self.target_entropy < 0.0:
            raise ValueError(f"target_entropy={self.target_entropy!r}: must be >= 0")
        if self.adapt_rate < 0.0:
            raise ValueError(f"adapt_rate={self.adapt_rate!r}: must be >= 0")
