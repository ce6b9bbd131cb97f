"""Settings of the behaviour-policy correction (`algo.off_policy`), apart from its tensor code so that a
config (and a CLI --help) loads without torch. The formulas are in `stare_tir.algos.off_policy`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class OffPolicyConfig:
    """Decoupled PPO (AReaL, Fu et al. 2025): the clip ratio is taken against the learner's recompute
    (the proximal policy, the weights being updated) and the per-token loss is multiplied by a capped
    behaviour weight pi_prox / pi_behav, pi_behav being the rollout engine's own log-probs. It matters
    when rollouts are stale (`trainer.max_staleness` >= 1) and, at any staleness, corrects the
    engine/learner numerical mismatch."""

    # "none": no behaviour weight (the ratio is still against the recompute). "tis": truncated IS,
    # w = min(r, cap) (Yao et al. 2025). "mis": masked IS, w = r inside [lower, cap], else 0: a token
    # too far off the behaviour policy gives no gradient (AReaL caps its behaviour weight this way).
    # r = pi_prox / pi_behav.
    mode: Literal["none", "tis", "mis"] = "none"
    # Upper bound of the behaviour weight (TIS clips to it, MIS masks above it). AReaL and TIS use 2-5.
    cap: float = 2.0
    # MIS only: tokens whose weight is below this are masked too (0: no lower bound).
    lower: float = 0.0
    # "token": one weight per token. "sequence": one per trajectory, the geometric mean of its tokens'
    # ratios (exp of the mean log-ratio), clipped or masked as a whole.
    level: Literal["token", "sequence"] = "token"

    def __post_init__(self) -> None:
        if self.mode not in ("none", "tis", "mis"):
            raise ValueError(f"mode={self.mode!r}: one of none, tis, mis")
        if self.level not in ("token", "sequence"):
            raise ValueError(f"level={self.level!r}: token or sequence")
        if not self.cap > 1.0:
            raise ValueError(f"cap={self.cap!r}: must be > 1 (the weight of an on-policy token is 1)")
        if not 0.0 <= self.lower < 1.0:
            raise ValueError(f"lower={self.lower!r}: must be in [0, 1)")

    @property
    def enabled(self) -> bool:
        return self.mode != "none"
