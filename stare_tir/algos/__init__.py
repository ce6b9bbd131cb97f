"""Algorithmic core: pure tensor functions (advantages, policy losses, STARE, the token methods of
methods/, one per module, verl's batch partition, chunked log-probs).

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
        "OverlongPenaltyConfig",
        "broadcast_to_tokens",
        "compute_group_advantages",
        "overlong_penalty",
    ),
    "logprobs": ("logprobs_and_entropy", "logprobs_and_entropy_from_logits"),
    "off_policy": (
        "LAG_BUCKETS",
        "behaviour_weights",
        "mismatch_metrics",
        "mismatch_sums_by_lag",
    ),
    "off_policy_config": ("OffPolicyConfig",),
    "policy_loss": (
        "AGG_MODES",
        "POLICY_LOSSES",
        "Clip",
        "LossInputs",
        "aggregate",
        "clip_loss",
        "kl_cov_loss",
        "truncated_is_weights",
    ),
    "stare": (
        "StareController",
        "num_selected",
        "stare_group_weights",
        "stare_metrics",
        "stare_token_weights",
        "stare_token_weights_scoped",
    ),
    "stare_config": ("StareConfig",),
    "token_methods": (
        "TOKEN_METHODS",
        "RunMethods",
        "StatefulMethod",
        "TokenEffect",
        "TokenInputs",
        "combine_effects",
    ),
    "methods.kl_cov": ("KL_COV_TERM", "KLCovConfig"),
    "methods.clip_cov": ("ClipCovConfig",),
    "methods.entropy_80_20": ("TopEntropyConfig",),
    "methods.entropy_adv": ("EntropyAdvConfig",),
    "methods.stapo": ("StapoConfig",),
    "methods.steer": ("SteerConfig",),
    "methods.eapo": ("Eapo", "EapoConfig"),
    "methods.stare": ("Stare",),
    "verl_partition": ("VerlPartitionConfig", "balanced_partition", "rank_shares", "verl_micro_batches", "workload"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'stare_tir.algos' has no attribute {name!r}")
    return getattr(importlib.import_module(f"stare_tir.algos.{module}"), name)
