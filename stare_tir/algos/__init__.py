"""Algorithmic core: pure tensor functions (advantages, policy loss, STARE, chunked log-probs).

No I/O, no config mutation: tensors and explicit scalars in, (result, metrics) out.
"""

from stare_tir.algos.advantage import (
    ADVANTAGE_ESTIMATORS,
    broadcast_to_tokens,
    compute_group_advantages,
    get_advantage_estimator,
    register_advantage_estimator,
)
from stare_tir.algos.logprobs import logprobs_and_entropy, logprobs_and_entropy_from_logits
from stare_tir.algos.policy_loss import (
    AGG_MODES,
    POLICY_LOSSES,
    aggregate,
    get_policy_loss,
    policy_loss,
    register_policy_loss,
    truncated_is_weights,
)
from stare_tir.algos.stare import (
    StareConfig,
    StareController,
    num_selected,
    stare_token_weights,
    stare_token_weights_scoped,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGG_MODES", "POLICY_LOSSES", "StareConfig", "StareController",
    "aggregate", "broadcast_to_tokens", "compute_group_advantages", "get_advantage_estimator",
    "get_policy_loss", "logprobs_and_entropy", "logprobs_and_entropy_from_logits", "num_selected",
    "policy_loss", "register_advantage_estimator", "register_policy_loss", "stare_token_weights",
    "stare_token_weights_scoped", "truncated_is_weights",
]
