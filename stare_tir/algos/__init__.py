"""Algorithmic core: pure tensor functions (advantages, policy losses, STARE, the baselines' token
methods, verl's batch partition, chunked log-probs).

No I/O, no config mutation: tensors and explicit scalars in, (result, metrics) out.

The names below are loaded on first use (PEP 562), so importing a light submodule such as
`stare_tir.algos.stare_config` (what a config or a CLI --help needs) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "advantage": (
        "ADVANTAGE_ESTIMATORS",
        "broadcast_to_tokens",
        "compute_group_advantages",
        "get_advantage_estimator",
        "overlong_penalty",
        "register_advantage_estimator",
    ),
    "logprobs": ("logprobs_and_entropy", "logprobs_and_entropy_from_logits"),
    "off_policy": (
        "LAG_BUCKETS",
        "behaviour_weights",
        "mismatch_metrics",
        "mismatch_sums_by_lag",
    ),
    "off_policy_config": ("OffPolicyConfig",),
    # (The function `policy_loss` shares its module's name: import it from stare_tir.algos.policy_loss.)
    "policy_loss": (
        "AGG_MODES",
        "POLICY_LOSSES",
        "aggregate",
        "get_policy_loss",
        "register_policy_loss",
        "truncated_is_weights",
    ),
    "stare": ("StareController", "num_selected", "stare_token_weights", "stare_token_weights_scoped"),
    "stare_config": ("StareConfig",),
    "token_config": (
        "ClipCovConfig",
        "EntropyAdvConfig",
        "KLCovConfig",
        "OverlongPenaltyConfig",
        "StapoConfig",
        "TopEntropyConfig",
        "VerlPartitionConfig",
    ),
    "token_methods": (
        "TOKEN_METHODS",
        "TokenEffect",
        "combine_effects",
        "get_token_method",
        "register_token_method",
    ),
    "verl_partition": ("balanced_partition", "rank_shares", "verl_micro_batches", "workload"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'stare_tir.algos' has no attribute {name!r}")
    return getattr(importlib.import_module(f"stare_tir.algos.{module}"), name)
