"""One RL step (`rl_step`): collect, score, recompute, shape, update, sync. The functions it calls
follow it in the order it calls them; the per-token diagnostics they use come first."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Iterator

import torch
from loguru import logger

from stare_tir.algos.advantage import ADVANTAGE_ESTIMATORS, overlong_penalty
from stare_tir.algos.policy_loss import POLICY_LOSSES, Clip
from stare_tir.learner import Learner
from stare_tir.rollout.engine import rollout_stats
from stare_tir.rollout.trajectory import Trajectory
from stare_tir.train_config import AlgoConfig
from stare_tir.trainer.batch import collect_batch
from stare_tir.trainer.diagnostics import entropy_after_update, entropy_by_tool_use
from stare_tir.trainer.mini_batches import mini_batch_plan
from stare_tir.trainer.rank_balance import rebalance
from stare_tir.trainer.run import Run
from stare_tir.trainer.shaping import StepBatch, UpdateInputs, prepare_update
from stare_tir.trainer.staleness import off_policy_update
from stare_tir.trainer.weight_sync import (
    release_rollout_memory,
    resume_rollout_memory,
    resync_stale_servers,
    sync_weights,
)

if TYPE_CHECKING:  # async_rollouts imports this module's package
    from stare_tir.trainer.async_rollouts import AsyncRollouts


def reward_penalties(trajs: list[Trajectory], algo: AlgoConfig, max_len: int) -> list[float]:
    """DAPO's soft overlong penalty per trajectory (algo.overlong_penalty; all 0 when it is off).
    |y| counts every response token, model and tool output, as verl's reward manager does."""
    cfg = algo.overlong_penalty
    if not cfg.enabled or not trajs:
        return [0.0] * len(trajs)
    buffer = cfg.buffer_tokens if cfg.buffer_tokens is not None else max(1, round(0.2 * max_len))
    lengths = torch.tensor([len(t.response_ids) for t in trajs], dtype=torch.float64)
    return overlong_penalty(lengths, max_len, buffer, cfg.factor).tolist()


def group_advantages(
    trajs: list[Trajectory], estimator: str, penalties: list[float] | None = None
) -> tuple[list[float], dict]:
    """Group advantages by the registered estimator `estimator` (algo.advantage), one scalar per
    trajectory: grpo normalises rewards inside each group by its std, drgrpo only centres them.
    penalties: added to the rewards first (DAPO's overlong penalty). Which groups are informative
    was decided on the rewards alone (DAPO filters on accuracy, before the penalty)."""
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)  # [N]
    if penalties is not None:
        rewards = rewards + torch.tensor(penalties, dtype=torch.float32)
    group_ids = torch.tensor([t.group_id for t in trajs], dtype=torch.long)  # [N]
    adv, metrics = ADVANTAGE_ESTIMATORS.get(estimator)(rewards, group_ids)
    return adv.tolist(), metrics


def batch_entropy(learner: Learner, trajs: list[Trajectory], entropies: list[torch.Tensor]) -> float:
    """Token-mean entropy over model-written tokens of the whole global batch (all ranks)."""
    total = torch.zeros(2, dtype=torch.float64)  # [sum of entropy, token count]
    for t, ent in zip(trajs, entropies):
        mask = torch.tensor(t.loss_mask, dtype=torch.float64)
        total[0] += float((ent.double() * mask).sum())
        total[1] += float(mask.sum())
    total = learner.all_reduce_sum(total)
    return float(total[0] / total[1].clamp(min=1))


def global_means(learner: Learner, means: dict[str, float], count: int) -> dict[str, float]:
    """Per-rank means -> means over all ranks, weighted by `count`; every rank must pass the same keys."""
    keys = sorted(means)
    if learner.world_size == 1 or not keys:
        return means
    red = learner.all_reduce_sum(torch.tensor([means[k] * count for k in keys] + [float(count)], dtype=torch.float64))
    return {**means, **{k: float(red[i] / red[-1].clamp(min=1)) for i, k in enumerate(keys)}}


def logprob_mismatch(trajs: list[Trajectory], old_logprobs: list[torch.Tensor]) -> dict[str, float]:
    """Rollout (sampler) vs recomputed (learner) log-probs on model tokens: drift to watch."""
    diffs = []
    for t, lp in zip(trajs, old_logprobs):
        mask = torch.tensor(t.loss_mask, dtype=torch.bool)
        diffs.append((torch.tensor(t.rollout_logprobs) - lp)[mask])
    d = torch.cat(diffs) if diffs else torch.zeros(0)
    if d.numel() == 0:
        return {}
    return {
        "mismatch/abs_mean": float(d.abs().mean()),
        "mismatch/max": float(d.abs().max()),
        "mismatch/k3": float((torch.exp(d) - 1 - d).mean()),
    }


class PhaseTimer:
    """Wall seconds per phase of a step, as `time/<phase>` metrics (and `time/step` for the whole).
    A phase entered again adds to its total; a phase entered inside another counts only for itself
    (the outer one's time excludes it), so the phases add up to the step."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self._inner: list[float] = []  # per open phase: seconds spent in phases nested inside it

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            elapsed = time.perf_counter() - t0
            own = elapsed - self._inner.pop()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + own
            if self._inner:
                self._inner[-1] += elapsed

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.seconds.items()} | {"time/step": time.perf_counter() - self.start}


def rl_step(run: Run, step: int, rollouts: AsyncRollouts | None = None) -> dict:
    """One RL step; returns its metrics row. rollouts (trainer.max_staleness >= 1): this step's
    first round was rolled out while earlier steps trained (`trainer/async_rollouts.py`). Every
    second of it is inside a named phase (`time/other`: the bookkeeping between the others)."""
    timer = PhaseTimer()
    with timer("rollout"):
        batch = collect(run, step, rollouts)
    metrics = batch.metrics
    with timer("other"):
        # Decided over all ranks: a rank with an empty share still joins every collective below.
        empty = run.learner.all_reduce_sum(torch.tensor([float(len(batch.trajs))])).item() == 0
    if empty:
        return skip_empty_step(run, step, batch, timer)
    run.empty_in_row = 0
    with timer("other"):
        release_rollout_memory(run)  # colocated servers free their GPU memory for the learner
    with timer("score"):
        score(run, batch)
    rebalance(run.learner, batch, run.cfg.trainer.balance_ranks)  # ranks' tokens evened out (time/balance)
    k = run.cfg.algo.mini_batches(run.cfg.trainer.prompts_per_step)
    with timer("other"):
        own_forward = recompute_free(run, batch, rollouts, k)
    metrics["update/recompute_free"] = float(own_forward)
    if own_forward:  # old log-probs and entropies from the update's forward; shaping timed inside
        with timer("update"):
            applied, skipped = update_on_policy(run, step, batch, rollouts, timer)
    else:
        with timer("recompute"):
            recompute(run, batch)
        with timer("shape"):
            observe(run, batch)
            inputs = shape(run, step_seed(run, step), batch, rollouts) if k == 1 else None
        with timer("update"):
            if inputs is not None:
                applied, skipped = update(run, inputs, metrics)
            else:  # shaped per mini-batch, inside the update
                applied, skipped = update_mini_batches(run, step, batch, rollouts, k)
    metrics["update/optimizer_steps"] = float(applied)
    every = run.cfg.trainer.diagnostics_every
    if applied and every and step % every == 0:  # the update's own entropy change (one no-grad pass)
        with timer("diagnostics"):
            metrics.update(entropy_after_update(run.learner, batch.trajs, metrics["entropy/batch"]))
    with timer("other"):
        count_nonfinite(run, step, skipped, metrics)
    with timer("sync"):
        if applied:  # unchanged weights are not pushed again (a collective skip: every rank agrees)
            sync_weights(run)
        resume_rollout_memory(run)
        metrics["update/synced"] = float(applied > 0)
    metrics.update(timer.metrics())
    n_tokens = sum(len(t.response_ids) for t in batch.rolled)
    # asynchronous: over the time its rounds generated (the learner waited for part of it only)
    rollout_s = metrics["time/rollout"] + metrics.get("async/round_s", 0.0)
    metrics["throughput/rollout_tokens_per_s"] = n_tokens / max(rollout_s, 1e-9)
    return metrics


def collect(run: Run, step: int, rollouts: AsyncRollouts | None) -> StepBatch:
    """This step's batch (after every filter), everything rolled out for it, and their metrics."""
    resynced = resync_stale_servers(run)  # a restarted server gets the current weights before use
    trajs, rolled, metrics = collect_batch(run, step, rollouts)
    metrics.update(resynced)
    metrics.update(run.backend.take_route_stats())  # SGLang: where its requests went
    metrics.update(global_means(run.learner, rollout_stats(rolled), len(rolled)))
    if rollouts is not None:
        metrics.update(rollouts.step_metrics(trajs))  # lag, idle seconds of both sides, queue
    return StepBatch(trajs, rolled, metrics)


def skip_empty_step(run: Run, step: int, batch: StepBatch, timer: PhaseTimer) -> dict:
    """No rank has a usable group: no update, and the run stops after too many such steps."""
    logger.warning(f"step {step}: no usable group in {len(batch.rolled)} trajectories; no update")
    metrics = batch.metrics
    metrics["update/skipped_empty"] = 1.0
    with timer("other"):
        check_empty_steps(run, step, batch.rolled, metrics)
    return metrics | timer.metrics()


def score(run: Run, batch: StepBatch) -> None:
    """Group advantages (after DAPO's overlong penalty, when on) and the per-trajectory penalties."""
    algo, learner = run.cfg.algo, run.learner
    batch.penalties = reward_penalties(batch.trajs, algo, run.cfg.rollout.max_total_tokens)
    batch.advantages, adv_metrics = group_advantages(batch.trajs, algo.advantage, batch.penalties)
    batch.metrics.update(adv_metrics)
    if algo.overlong_penalty.enabled:
        mean_penalty = {"reward/overlong_penalty": sum(batch.penalties) / max(len(batch.penalties), 1)}
        batch.metrics.update(global_means(learner, mean_penalty, len(batch.penalties)))


def recompute(run: Run, batch: StepBatch) -> None:
    """The learner's log-probs and entropies of the batch's tokens (a no-grad pass), and their
    metrics (`value_metrics`)."""
    batch.old_logprobs, batch.entropies = run.learner.compute_logprobs_entropy(batch.trajs)
    value_metrics(run, batch)


def value_metrics(run: Run, batch: StepBatch) -> None:
    """From the batch's learner log-probs and entropies (the recompute pass's, or the update
    forward's own where it is skipped): the batch entropy, its split by tool use and the
    rollout/learner log-prob mismatch, into the metrics."""
    trajs, metrics = batch.trajs, batch.metrics
    entropy = batch_entropy(run.learner, trajs, batch.entropies)
    metrics.update({"entropy/batch": entropy, "entropy/target": run.cfg.algo.stare.target_entropy})
    metrics.update(entropy_by_tool_use(run.learner, trajs, batch.entropies))
    metrics.update(logprob_mismatch(trajs, batch.old_logprobs))


def reads_values_first(algo: AlgoConfig) -> bool:
    """Whether shaping reads the learner's log-probs or entropies before the loss: a token method
    (selections; STARE's gate and EAPO read the batch entropy) or verl's aggregation (token_view)."""
    return bool(algo.token_methods) or algo.loss_agg == "verl"


@cache  # a fallback's reason is told once per process, not every step
def _say_once(message: str) -> None:
    logger.info(message)


def recompute_free(run: Run, batch: StepBatch, rollouts: AsyncRollouts | None, k: int) -> bool:
    """Whether this step takes its old log-probs and entropies from the update's own forward (one
    forward less) instead of the recompute pass: algo.recompute=auto and the two give the same
    inputs. Where they would not, the pass is kept and the reason logged once. Collective: every
    rank decides alike (its only data-dependent part is a max over ranks)."""
    algo, learner = run.cfg.algo, run.learner
    if algo.recompute == "always":
        return False
    reason = None
    if k != 1 or algo.ppo_epochs != 1:
        reason = "several updates per batch (the later ones compare with the stored old log-probs)"
    elif algo.off_policy.enabled:
        reason = "the off-policy correction needs the batch's old log-probs before the loss"
    elif not hasattr(learner, "train_step_on_policy"):  # a stand-in with the plain interface only
        reason = "the learner has no update that shapes from its own forward"
    elif not learner.forward_is_deterministic():
        reason = "the model has dropout (its training forward is not the old policy's)"
    elif reads_values_first(algo) and learner.update_micro_batches(batch.trajs) > 1:
        # STARE's batch-global top-p, its gate and the other selections need every entropy of the
        # batch before the first micro-batch's loss: one forward's graph is all that is kept.
        reason = "a selection over the batch needs all its entropies first, and it spans several update micro-batches"
    if reason is not None:
        _say_once(f"the recompute pass is kept where {reason} (algo.recompute=auto)")
        return False
    return True


def update_on_policy(
    run: Run, step: int, batch: StepBatch, rollouts: AsyncRollouts | None, timer: PhaseTimer
) -> tuple[int, bool]:
    """The one optimizer step of an on-policy batch without the recompute pass (`recompute_free`):
    old = the update's own log-probs, detached (ratio 1 in value, the gradient intact: verl's and
    TRL's on-policy form), and the metrics the recompute pass gave, from that forward's values.
    Where shaping reads those values, the learner shapes between its forward and its loss (the
    batch is one micro-batch per rank); else shaping comes first and the values after."""
    algo, learner, seed = run.cfg.algo, run.learner, step_seed(run, step)
    if reads_values_first(algo):

        def shape_from_forward(logps: list[torch.Tensor], ents: list[torch.Tensor]) -> dict:
            with timer("shape"):
                batch.old_logprobs, batch.entropies = logps, ents
                value_metrics(run, batch)
                observe(run, batch)
                inputs = shape(run, seed, batch, rollouts, on_policy=True)
            return {
                "trajs": inputs.trajs,
                "advantages": inputs.advantages,
                "token_weights": inputs.token_weights,
                "tis_cap": inputs.tis_cap,
                "terms": inputs.terms or None,
            }

        result, _, _ = learner.train_step_on_policy(batch.trajs, shape_from_forward, **loss_options(algo))
    else:  # nothing in shaping reads the values: no selection, TIS on the learner's own log-probs
        with timer("shape"):  # without the off-policy correction (recompute_free) only its metrics need them
            inputs = shape(run, seed, batch, None, on_policy=True)
        values: tuple[list, list] = ([None] * len(batch.trajs), [None] * len(batch.trajs))
        result = train_step(run, inputs, record=values)
        with timer("shape"):
            batch.old_logprobs, batch.entropies = values
            value_metrics(run, batch)  # no method to observe them (reads_values_first is False)
            if rollouts is not None:  # the mismatch per staleness of an asynchronous run
                _, off_metrics = off_policy_update(
                    learner, batch.trajs, batch.old_logprobs, inputs, algo.off_policy, rollouts.served, True
                )
                batch.metrics.update(off_metrics)
    batch.metrics.update({f"update/{k}": v for k, v in result.items()})
    skipped = bool(result["step_skipped"])
    return (0 if skipped else 1), skipped


def observe(run: Run, batch: StepBatch) -> None:
    """Once per step, before any selection: the run's token methods see the batch entropy (STARE's
    controller sets its gate, EAPO records the initial entropy)."""
    algo = run.cfg.algo
    run.methods.observe(algo.token_methods, algo.methods, batch.metrics["entropy/batch"])


def step_seed(run: Run, step: int) -> int:
    """The seed of this step's random selections (Clip-Cov's draw)."""
    return run.cfg.trainer.seed * 1_000_003 + step


def shape(
    run: Run,
    seed: int,
    batch: StepBatch,
    rollouts: AsyncRollouts | None,
    *,
    current: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
    verl_layout: list | None = None,
    on_policy: bool | None = None,
) -> UpdateInputs:
    """Every token-level change (the token methods, STARE among them, void-turn masking, verl's
    aggregation, the off-policy correction) as the learner's inputs for `batch` (a step's batch or
    one mini-batch of it); its metrics go to batch.metrics. current, verl_layout and on_policy as
    `prepare_update` takes them."""
    algo, learner = run.cfg.algo, run.learner
    methods = run.methods.resolve(algo.token_methods, algo.methods)
    inputs = prepare_update(
        learner, batch, algo, methods, seed, current=current, verl_layout=verl_layout, on_policy=on_policy
    )
    batch.metrics.update(inputs.metrics)
    if algo.off_policy.enabled or rollouts is not None:  # decoupled PPO's behaviour weight; mismatch per lag
        served = rollouts.served if rollouts is not None else [learner.steps_applied]
        inputs, off_metrics = off_policy_update(
            learner, batch.trajs, batch.old_logprobs, inputs, algo.off_policy, served, rollouts is not None
        )
        batch.metrics.update(off_metrics)
    return inputs


def loss_options(algo: AlgoConfig) -> dict:
    """The learner's loss settings of the configured algorithm (train_step's clip, loss_agg, loss_fn)."""
    return {
        "clip": Clip(algo.clip_low, algo.clip_high, algo.dual_clip_c),
        "loss_agg": "token-mean" if algo.loss_agg == "verl" else algo.loss_agg,  # verl: in the weights
        "loss_fn": POLICY_LOSSES.get(algo.policy_loss),
    }


def train_step(run: Run, inputs: UpdateInputs, record: tuple[list, list] | None = None) -> dict[str, float]:
    """One optimizer step of the configured loss on `inputs`; the learner's metrics. record: see
    `Learner.train_step`."""
    return run.learner.train_step(
        inputs.trajs,
        inputs.advantages,
        inputs.token_weights,
        inputs.old_logprobs,
        tis_cap=inputs.tis_cap,
        terms=inputs.terms or None,
        record=record,
        **loss_options(run.cfg.algo),
    )


def update(run: Run, inputs: UpdateInputs, metrics: dict) -> tuple[int, bool]:
    """algo.ppo_epochs optimizer steps on the batch (stopping at a skipped one). Returns the number
    of steps that changed the weights and whether the last was skipped (non-finite)."""
    applied, skipped = 0, False
    for _ in range(run.cfg.algo.ppo_epochs):
        result = train_step(run, inputs)
        metrics.update({f"update/{k}": v for k, v in result.items()})
        skipped = bool(result["step_skipped"])
        if skipped:
            break
        applied += 1
    return applied, skipped


def update_mini_batches(
    run: Run, step: int, batch: StepBatch, rollouts: AsyncRollouts | None, k: int
) -> tuple[int, bool]:
    """algo.ppo_epochs passes over k disjoint mini-batches (`trainer/mini_batches.py`), one optimizer
    step each, stopping at a skipped one. Each mini-batch is shaped on its own: the first (of the
    first epoch) on-policy, with the recompute pass's selections and old = the update's own
    log-probs, detached; every later one with old = the stored log-probs and its selections made
    again from a no-grad pass of the current policy (where some method is active: a token method or
    STARE's open gate), as verl selects inside the loss of each mini-batch. Shaping and update
    metrics are means over the mini-batches (maxima: the largest); update/mini_batches counts them."""
    algo, learner, metrics = run.cfg.algo, run.learner, batch.metrics
    members, layouts = mini_batch_plan(learner, batch.trajs, algo, k)
    # A mini-batch empty on every rank (a batch of fewer trajectories than k) is skipped by all alike.
    sizes = learner.all_reduce_sum(torch.tensor([float(len(m)) for m in members], dtype=torch.float64))
    order = [j for j in range(len(members)) if sizes[j] > 0]
    methods = run.methods.resolve(algo.token_methods, algo.methods)
    reselect = any(getattr(fn, "active", True) for _, fn, _ in methods)
    base_seed = step_seed(run, step)
    sums: dict[str, float] = {}
    peaks: dict[str, float] = {}
    applied, skipped, done = 0, False, 0
    for epoch in range(algo.ppo_epochs):
        for j in order:
            first = epoch == 0 and j == order[0]
            sub = batch.select(members[j])
            current = None if first or not reselect else learner.compute_logprobs_entropy(sub.trajs)
            inputs = shape(
                run,
                base_seed + 7_919 * (epoch * k + j),
                sub,
                rollouts,
                current=current,
                verl_layout=layouts[j] if layouts is not None else None,
                on_policy=first,
            )
            result = train_step(run, inputs)
            sub.metrics.update({f"update/{key}": v for key, v in result.items()})
            for key, v in sub.metrics.items():
                if isinstance(v, (int, float)):
                    if key.endswith("_max"):  # maxima stay maxima; the rest are averaged
                        peaks[key] = max(peaks.get(key, -math.inf), float(v))
                    sums[key] = sums.get(key, 0.0) + float(v)
            done += 1
            skipped = bool(result["step_skipped"])
            if skipped:
                break
            applied += 1
        if skipped:
            break
    metrics.update({key: v / done for key, v in sums.items() if key != "entropy/batch"})
    metrics.update(peaks)
    metrics["update/mini_batches"] = float(k)
    return applied, skipped


def count_nonfinite(run: Run, step: int, skipped: bool, metrics: dict) -> None:
    """Consecutive skipped (non-finite) steps; the run stops at trainer.max_nonfinite_steps."""
    if not skipped:
        run.nonfinite_in_row = 0
        return
    run.nonfinite_in_row += 1
    limit = run.cfg.trainer.max_nonfinite_steps
    metrics["update/nonfinite_in_row"] = float(run.nonfinite_in_row)
    logger.warning(
        f"step {step}: non-finite loss or gradient, update skipped ({run.nonfinite_in_row} in a row, limit {limit})"
    )
    if run.nonfinite_in_row >= limit:
        raise FloatingPointError(
            f"{run.nonfinite_in_row} consecutive steps had a non-finite loss or gradient; stopping. "
            "Lower learner.lr, raise learner.grad_clip, or check the data; the last good checkpoint "
            f"is under {run.run_dir / 'checkpoints'}"
        )


def check_empty_steps(run: Run, step: int, rolled: list[Trajectory], metrics: dict) -> None:
    """Stop after trainer.max_empty_steps consecutive steps without a usable group, naming why:
    a run that never updates the model must not end as if it had trained."""
    run.empty_in_row += 1
    limit = run.cfg.trainer.max_empty_steps
    if run.empty_in_row < limit:
        return
    d = {k.removeprefix("dropped/"): int(v) for k, v in metrics.items() if k.startswith("dropped/")}
    n = len(rolled)
    if n and d.get("rollout_error", 0) == n:
        cause = "all rollouts failed (the env or inference backend raised)"
    elif n and d.get("sandbox_error", 0) + d.get("rollout_error", 0) == n:
        cause = "all rollouts failed (sandbox or backend errors)"
    elif d.get("equal_reward_groups", 0):
        cause = "every remaining group had equal rewards (no learning signal)"
    else:
        cause = "every trajectory was dropped by the filters"
    example = next((t.info.get("error") for t in rolled if t.info.get("error")), None)
    raise RuntimeError(
        f"{run.empty_in_row} consecutive steps (up to step {step}) updated nothing "
        f"(trainer.max_empty_steps={limit}): {cause}. Last step on this rank: {n} trajectories, "
        + ", ".join(f"{k}={v}" for k, v in sorted(d.items()))
        + (f"; first error: {example}" if example else "")
    )
