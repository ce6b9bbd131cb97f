"""How stale a step's trajectories are, and the behaviour-policy correction that makes up for it.

A version names the learner's weights (`learner.steps_applied`, what every push carries and every
token span records: `Trajectory.weight_versions`). The lag of a token is the number of versions
served after the one that sampled it, up to the weights being updated (`served`: the versions in
the order they were served, the current last); a trajectory's lag is its oldest token's. Versions
are counted as served, not as optimizer steps: with `algo.ppo_epochs` > 1 a step applies several
steps but serves one version. Measured when the step trains, so time spent waiting in a queue
counts (a batch that waited through two pushes is two versions old, however fast it was generated).

What STARE's gate measures under eta >= 1: `entropy/batch` is the recompute's entropy, i.e. the
entropy of the weights being updated (pi_prox) at the states the older behaviour policy visited,
not the behaviour policy's own entropy. `offpolicy/behaviour_surprisal` is the behaviour policy's
(an unbiased estimate from its own sampled tokens), logged beside it.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from stare_tir.algos.off_policy import behaviour_weights, mismatch_metrics, mismatch_sums_by_lag
from stare_tir.algos.off_policy_config import OffPolicyConfig
from stare_tir.learner import Learner
from stare_tir.rollout.trajectory import Trajectory
from stare_tir.trainer.shaping import UpdateInputs

ROUND_VERSION = "round_version"  # Trajectory.info key: the version when its round was scheduled


def _as_version(v: object) -> int | None:
    text = str(v)
    return int(text) if text.isdigit() else None


def oldest_version(t: Trajectory) -> int | None:
    """The oldest version that sampled a token of `t` (its round's, when the backend reported
    none); None when a token came from weights this trainer never pushed (a restarted server's
    "default")."""
    versions = [v for _, _, v in t.weight_versions] or [t.info.get(ROUND_VERSION)]
    numbers = [_as_version(v) for v in versions]
    return None if any(n is None for n in numbers) else min(numbers)


def version_lag(version: int | None, served: Sequence[int]) -> int | None:
    """Versions served after `version` (None: a version that was never served)."""
    if version is None or version not in served:
        return None
    return len(served) - 1 - max(i for i, v in enumerate(served) if v == version)


def trajectory_lag(t: Trajectory, served: Sequence[int]) -> int | None:
    """Versions between `t`'s oldest token and the weights being updated (None: unknown weights)."""
    return version_lag(oldest_version(t), served)


def token_lags(t: Trajectory, served: Sequence[int]) -> torch.Tensor:
    """[R] long: each response token's lag (tokens outside the reported spans: the trajectory's)."""
    fallback = trajectory_lag(t, served)
    lags = torch.full((len(t.response_ids),), fallback if fallback is not None else 0, dtype=torch.long)
    for lo, hi, v in t.weight_versions:
        lag = version_lag(_as_version(v), served)
        if lag is not None:
            lags[lo:hi] = lag
    return lags


def lag_metrics(learner: Learner, batch: list[Trajectory], served: Sequence[int]) -> dict[str, float]:
    """async/lag_mean and async/lag_max over the trajectories of the update (all ranks)."""
    lags = [trajectory_lag(t, served) for t in batch]
    known = [x for x in lags if x is not None]
    sums = learner.all_reduce_sum(torch.tensor([float(sum(known)), float(len(known))], dtype=torch.float64))
    top = learner.all_reduce_max(torch.tensor([float(max(known, default=0))]))
    return {"async/lag_mean": float(sums[0] / sums[1].clamp(min=1)), "async/lag_max": float(top[0])}


def off_policy_update(
    learner: Learner,
    batch: list[Trajectory],
    prox_logprobs: list[torch.Tensor],
    inputs: UpdateInputs,
    cfg: OffPolicyConfig,
    served: Sequence[int],
    per_lag: bool,
) -> tuple[UpdateInputs, dict[str, float]]:
    """The update's inputs with decoupled PPO's behaviour weights folded into the token weights
    (cfg.mode tis/mis; unchanged for "none"), and the off-policy metrics over all ranks:
    offpolicy/weight_mean, offpolicy/capped_frac (with a correction); per_lag (asynchronous runs):
    the mismatch per staleness bucket and offpolicy/behaviour_surprisal.

    prox_logprobs: the recompute pass's log-probs (the proximal policy); the behaviour log-probs are
    each trajectory's `rollout_logprobs`, the engine's. The loss mask is the trajectory's own (a
    token a method removed from the loss gets a weight it never uses)."""
    sizes = [len(t.response_ids) for t in batch]
    prox = torch.cat([lp.reshape(-1).double() for lp in prox_logprobs]) if batch else torch.zeros(0)
    behav = torch.tensor([x for t in batch for x in t.rollout_logprobs], dtype=torch.float64)
    mask = torch.tensor([m for t in batch for m in t.loss_mask], dtype=torch.bool)
    metrics: dict[str, float] = {}
    n_local = float(mask.sum())
    if cfg.enabled:
        seq = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(sizes)]) if batch else mask.long()
        w, local = behaviour_weights(
            prox, behav, mask, seq, mode=cfg.mode, cap=cfg.cap, lower=cfg.lower, level=cfg.level
        )
        red = learner.all_reduce_sum(torch.tensor([local[k] * n_local for k in sorted(local)] + [n_local]))
        metrics.update({k: float(red[i] / red[-1].clamp(min=1)) for i, k in enumerate(sorted(local))})
        per_traj = list(torch.split(w, sizes))
        weights = per_traj if inputs.token_weights is None else [a * b for a, b in zip(inputs.token_weights, per_traj)]
        inputs = dataclasses.replace(inputs, token_weights=weights)
    if per_lag:
        lag = torch.cat([token_lags(t, served) for t in batch]) if batch else mask.long()
        sums = learner.all_reduce_sum(mismatch_sums_by_lag(prox, behav, mask, lag))
        metrics.update(mismatch_metrics(sums))
        s = learner.all_reduce_sum(torch.tensor([float(-behav[mask].sum()), n_local], dtype=torch.float64))
        metrics["offpolicy/behaviour_surprisal"] = float(s[0] / s[1].clamp(min=1))
    return inputs, metrics
