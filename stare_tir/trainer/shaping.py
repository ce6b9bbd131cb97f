"""From a step's batch (`StepBatch`) to the learner's inputs: selection groups, the token methods (STARE
among them), void-turn masking, verl's aggregation and the on-policy ratio.

Every rank sees every response token of the global batch (all-gathered in rank order, `TokenView`),
runs the same selections on it and keeps its own slice, so a selection never depends on how the
batch was split over ranks. Tokens leave the loss by narrowing a trajectory's loss mask (exact zero
gradient, and out of the token-mean's normaliser); everything else reaches the loss as per-token
advantages, weights and terms. With no method, no masking and token-mean aggregation, the learner
receives exactly what plain GRPO-ds would (no weights, the trajectories themselves).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from stare_tir.algos.policy_loss import truncated_is_weights
from stare_tir.algos.token_methods import TokenInputs, combine_effects
from stare_tir.algos.verl_partition import verl_micro_batches
from stare_tir.learner import Learner
from stare_tir.rollout.trajectory import Trajectory
from stare_tir.train_config import AlgoConfig


@dataclass
class TokenView:
    """Every response token of the global batch, flat, in rank order (all ranks hold the same)."""

    logprobs: Tensor  # [T] log pi of the sampled token, current policy (0 on tool-output tokens)
    entropy: Tensor  # [T]
    old_logprobs: Tensor | None  # [T] the stored log pi_old where it differs from logprobs (later mini-batches)
    advantages: Tensor  # [T] the trajectory's advantage on each of its tokens
    mask: Tensor  # [T] bool: loss tokens (void-turn masking applied)
    group: Tensor  # [T] long: selection group of each token
    verl_group: Tensor | None  # [T] long: verl micro-batch of each token (loss_agg=verl)
    rows_per_verl_group: dict[int, int]  # trajectories per verl micro-batch
    n_trajectories: int  # in the global batch
    mine: slice  # this rank's tokens

    def groups(self) -> list[Tensor]:
        """Positions of the loss tokens of each selection group (by group id), each in flat order."""
        ids = self.group[self.mask]
        pos = torch.nonzero(self.mask).squeeze(1)
        if ids.numel() == 0:
            return []
        order = torch.argsort(ids, stable=True)  # one sort, not a scan per group
        _, counts = torch.unique_consecutive(ids[order], return_counts=True)
        return list(torch.split(pos[order], counts.tolist()))


def void_masks(trajs: list[Trajectory], algo: AlgoConfig) -> tuple[list[Tensor], int]:
    """Loss masks after SimpleTIR's void-turn handling (algo.void_turns=mask: a trajectory with a void
    turn keeps its place in the group statistics but none of its tokens reaches the loss)."""
    masks, n_masked = [], 0
    for t in trajs:
        m = torch.tensor(t.loss_mask, dtype=torch.bool)
        if algo.void_turns == "mask" and t.void_turns > 0:
            m = torch.zeros_like(m)
            n_masked += 1
        masks.append(m)
    return masks, n_masked


def _seq_len(t: Trajectory) -> int:
    return len(t.prompt_ids) + len(t.response_ids)


def token_view(
    learner: Learner,
    trajs: list[Trajectory],
    advantages: list[float],
    old_logprobs: list[Tensor],
    entropies: list[Tensor],
    masks: list[Tensor],
    algo: AlgoConfig,
    stored_old: list[Tensor] | None = None,
    layout: list[list[list[int]]] | None = None,
) -> TokenView:
    """Gather the step's tokens from every rank and label each with its selection group (algo.scope).
    stored_old: the stored old log-probs when old_logprobs are the current policy's (a later
    mini-batch). layout: verl's micro-batches of these trajectories per rank, as indices in the
    gathered order (None: `verl_micro_batches` of their lengths, one mini-batch)."""
    sizes = [len(t.response_ids) for t in trajs]

    def flat(xs: list[Tensor]) -> Tensor:  # float32: log-probs and entropies are float32; ids < 2^24
        return torch.cat([x.reshape(-1).to(torch.float32) for x in xs]) if xs else torch.zeros(0)

    lp, mine = learner.all_gather_flat(flat(old_logprobs))
    ent, _ = learner.all_gather_flat(flat(entropies))
    adv, _ = learner.all_gather_flat(flat([torch.full((n,), float(a)) for n, a in zip(sizes, advantages)]))
    mask, _ = learner.all_gather_flat(flat([m.to(torch.float32) for m in masks]))
    old_all = learner.all_gather_flat(flat(stored_old))[0] if stored_old is not None else None

    need_verl = algo.scope == "verl" or algo.loss_agg == "verl"
    verl_traj_group: list[int] = []
    rows: dict[int, int] = {}
    n_global = int(learner.all_reduce_sum(torch.tensor([float(len(trajs))])).item())
    traj_slice = slice(0, len(trajs))
    if need_verl:
        lens, traj_slice = learner.all_gather_flat(torch.tensor([float(_seq_len(t)) for t in trajs]))
        per_rank = layout
        if per_rank is None:
            per_rank = verl_micro_batches(
                [int(x) for x in lens.tolist()], algo.verl_partition.ranks, algo.verl_partition.token_budget
            )
        verl_traj_group = [0] * len(lens)
        gid = 0
        for rank_mbs in per_rank:
            for mb in rank_mbs:
                rows[gid] = len(mb)
                for i in mb:
                    verl_traj_group[i] = gid
                gid += 1

    def per_token(group_of_traj: list[int]) -> Tensor:
        return flat([torch.full((n,), float(g)) for n, g in zip(sizes, group_of_traj)])

    if algo.scope == "batch":
        local_group = torch.zeros(sum(sizes))
    elif algo.scope == "micro_batch":  # this learner's update plan, labelled per rank
        of_traj = [0] * len(trajs)
        for k, idx in enumerate(learner.micro_batch_plan(trajs)):
            for i in idx:
                of_traj[i] = k * learner.world_size + learner.rank
        local_group = per_token(of_traj)
    else:
        local_group = per_token(verl_traj_group[traj_slice])
    group, _ = learner.all_gather_flat(local_group)
    verl_group = None
    if need_verl:
        verl_group, _ = learner.all_gather_flat(per_token(verl_traj_group[traj_slice]))
        verl_group = verl_group.long()
    return TokenView(
        logprobs=lp,
        entropy=ent,
        old_logprobs=old_all,
        advantages=adv,
        mask=mask > 0.5,
        group=group.long(),
        verl_group=verl_group,
        rows_per_verl_group=rows,
        n_trajectories=n_global,
        mine=mine,
    )


def apply_methods(
    view: TokenView | None, methods: list[tuple[str, Any, Any]], seed: int, batch_entropy: float | None
) -> tuple[dict[str, Tensor], dict[str, Tensor], dict]:
    """Apply the run's token methods ((name, callable, settings), algo.token_methods in order) inside
    each selection group, each seeing the advantages the ones before it shaped, and compose their
    effects with `combine_effects`. A method whose `active` is False (STARE with its gate off) selects
    nothing this step. Returns global [T] tensors (advantages, weights, keep, selected; only those
    some method produced), the named terms [T] (0 where a method gave none), and metrics: a method's
    own `step_metrics(effects)` where it has one, else algo/<name>/<key> (the largest over the groups)
    and algo/<name>/selected_frac. view: None when no method is active (nothing is gathered)."""
    out: dict[str, Tensor] = {}
    terms: dict[str, Tensor] = {}
    active = [(k, name, fn, cfg) for k, (name, fn, cfg) in enumerate(methods) if getattr(fn, "active", True)]
    assert view is not None or not active, "an active method needs the step's tokens"
    selected_by = {name: torch.zeros(view.mask.shape, dtype=torch.bool) for _, name, _, _ in active}
    effects_of: dict[str, list] = {name: [] for name, fn, _ in methods if hasattr(fn, "step_metrics")}
    method_values: dict[str, float] = {}
    for g, pos in enumerate(view.groups() if active else []):
        adv = view.advantages[pos]
        effects = []
        for k, name, fn, settings in active:
            gen = torch.Generator().manual_seed((seed * 1_000_003 + k) * 10_007 + g)
            old = view.old_logprobs[pos] if view.old_logprobs is not None else None
            t = TokenInputs(view.logprobs[pos], view.entropy[pos], adv, gen, old, batch_entropy=batch_entropy)
            effect = fn(t, settings)
            selected_by[name][pos] = effect.selected
            if name in effects_of:
                effects_of[name].append(effect)
            else:
                for key, val in effect.metrics.items():  # the largest over the selection groups
                    mkey = f"algo/{name}/{key}"
                    method_values[mkey] = max(method_values.get(mkey, -math.inf), float(val))
            if effect.advantages is not None:
                adv = effect.advantages.to(adv.dtype)
            effects.append(effect)
        combined = combine_effects(effects, view.advantages[pos])
        for key, neutral, dtype in (
            ("advantages", None, torch.float32),
            ("weights", 1.0, torch.float32),
            ("keep", True, torch.bool),
        ):
            value = getattr(combined, key)
            if value is None:
                continue
            if key not in out:
                out[key] = (
                    view.advantages.clone()
                    if key == "advantages"
                    else torch.full(view.mask.shape, neutral, dtype=dtype)
                )
            out[key][pos] = value.to(dtype)
        for name, value in (combined.terms or {}).items():
            if name not in terms:
                terms[name] = torch.zeros(view.mask.shape, dtype=torch.float32)
            terms[name][pos] = value.to(torch.float32)
    metrics: dict[str, float] = dict(method_values)
    n_loss = max(int(view.mask.sum()), 1) if view is not None else 1
    for name, selected in selected_by.items():
        out["selected"] = out.get("selected", torch.zeros_like(selected)) | selected
        if name not in effects_of:
            metrics[f"algo/{name}/selected_frac"] = float(selected.sum()) / n_loss
    for name, fn, _ in methods:
        if name in effects_of:
            metrics.update(fn.step_metrics(effects_of[name]))
    return out, terms, metrics


def verl_aggregation_weights(view: TokenView, mask: Tensor) -> Tensor:
    """Per-token factors that turn the learner's global token-mean into verl's aggregation: a token-mean
    inside each micro-batch g of the partition, scaled by rows_g / N (verl: loss * rows of the
    micro-batch / ppo_mini_batch_size per rank, then averaged over ranks), i.e. sum_t c_t l_t with
    c_t = rows_g / (N n_g), n_g the loss tokens of g. As a weight on the token-mean over all G loss
    tokens: w_t = c_t G. mask: the final loss tokens [T]."""
    assert view.verl_group is not None
    w = torch.ones(mask.shape, dtype=torch.float64)
    total = float(mask.sum())
    ids = view.verl_group
    n_tok = torch.zeros(int(ids.max()) + 1 if ids.numel() else 0, dtype=torch.float64)
    n_tok.index_add_(0, ids[mask], torch.ones(int(mask.sum()), dtype=torch.float64))
    rows = torch.tensor([float(view.rows_per_verl_group.get(g, 0)) for g in range(n_tok.numel())], dtype=torch.float64)
    per_group = rows / view.n_trajectories / n_tok.clamp(min=1.0) * total  # [n groups]
    w[mask] = per_group[ids[mask]]
    return w.to(torch.float32)


@dataclass
class StepBatch:
    """One step's batch as its phases fill it in (collect -> score -> recompute), or one mini-batch
    of it (`select`): this rank's trajectories and what each phase computed for them, per trajectory."""

    trajs: list[Trajectory]  # after every filter: what the update trains on
    rolled: list[Trajectory]  # everything rolled out for the step (the filters' input)
    metrics: dict  # the step's metrics row, as the phases write it
    advantages: list[float] = field(default_factory=list)  # score: group advantages
    penalties: list[float] = field(default_factory=list)  # score: DAPO's overlong penalty (0: none)
    old_logprobs: list[Tensor] = field(default_factory=list)  # recompute: log pi_old per token
    entropies: list[Tensor] = field(default_factory=list)  # recompute: entropy per token

    def select(self, idx: list[int]) -> StepBatch:
        """The trajectories `idx` (a mini-batch) with their values; metrics start from the batch entropy."""
        return StepBatch(
            trajs=[self.trajs[i] for i in idx],
            rolled=[],
            metrics={"entropy/batch": self.metrics["entropy/batch"]},
            advantages=[self.advantages[i] for i in idx],
            penalties=[self.penalties[i] for i in idx],
            old_logprobs=[self.old_logprobs[i] for i in idx],
            entropies=[self.entropies[i] for i in idx],
        )


@dataclass
class UpdateInputs:
    """What `Learner.train_step` receives for this step."""

    trajs: list[Trajectory]  # the batch; a trajectory whose loss mask a method narrowed is a copy
    advantages: list  # per trajectory a float, or a response-length tensor when shaped per token
    token_weights: list[Tensor] | None
    old_logprobs: list[Tensor] | None  # None: the update's own, detached (ratio exactly 1)
    tis_cap: float | None  # None when truncated IS is folded into token_weights
    terms: dict[str, list[Tensor]] = field(default_factory=dict)  # the methods' named terms, per trajectory
    metrics: dict = field(default_factory=dict)


def prepare_update(
    learner: Learner,
    batch: StepBatch,
    algo: AlgoConfig,
    methods: list[tuple[str, Any, Any]],
    seed: int,
    *,
    current: tuple[list[Tensor], list[Tensor]] | None = None,
    verl_layout: list[list[list[int]]] | None = None,
    on_policy: bool | None = None,
) -> UpdateInputs:
    """The learner's inputs for this step (or mini-batch). methods: the run's token methods of
    algo.token_methods, resolved ((name, callable, settings), `RunMethods.resolve`). seed: this step's
    seed (Clip-Cov's draw). Without a selection to make (no active method, token-mean aggregation)
    nothing is gathered over ranks.

    current: the current policy's log-probs and entropies, where they differ from the stored
    old_logprobs and entropies (a mini-batch after the first); selections use them, the loss's
    old log-probs stay the stored ones. verl_layout: see `token_view`. on_policy: old = the update's
    own log-probs (None: algo.ratio_one_on_policy)."""
    trajs, advantages, old_logprobs = batch.trajs, batch.advantages, batch.old_logprobs
    masks, n_void = void_masks(trajs, algo)
    sizes = [len(t.response_ids) for t in trajs]
    local_mask = torch.cat(masks) if trajs else torch.zeros(0, dtype=torch.bool)  # [this rank's tokens]
    local_sel = torch.zeros(local_mask.shape, dtype=torch.bool)  # selected or changed by the algorithm
    weights = adv_shaped = None
    terms: dict[str, Tensor] = {}
    final_mask = local_mask
    view = None
    if any(getattr(fn, "active", True) for _, fn, _ in methods) or algo.loss_agg == "verl":
        sel_lp, sel_ent = current if current is not None else (old_logprobs, batch.entropies)
        stored = old_logprobs if current is not None else None
        view = token_view(learner, trajs, advantages, sel_lp, sel_ent, masks, algo, stored, verl_layout)
    # No entropy/batch yet where the update's own forward will give it (no method reads it then).
    effects, global_terms, metrics = apply_methods(view, methods, seed, batch.metrics.get("entropy/batch"))
    if view is not None:
        selected = effects.get("selected", torch.zeros(view.mask.shape, dtype=torch.bool))
        global_final = view.mask & effects["keep"] if "keep" in effects else view.mask
        weights = effects.get("weights")
        if algo.loss_agg == "verl":
            agg = verl_aggregation_weights(view, global_final)
            weights = agg if weights is None else weights * agg
        local_sel = selected[view.mine] & view.mask[view.mine]
        final_mask = global_final[view.mine]
        weights = None if weights is None else weights[view.mine]
        adv_shaped = effects["advantages"][view.mine] if "advantages" in effects else None
        terms = {name: value[view.mine] for name, value in global_terms.items()}

    # algo/selected_frac: loss tokens any part of the algorithm selected or changed, over all ranks.
    orig = torch.cat([torch.tensor(t.loss_mask, dtype=torch.bool) for t in trajs]) if trajs else local_mask
    local_sel |= orig & ~local_mask  # void-masked
    penalized = [p < 0 for p in batch.penalties]
    if any(penalized) and trajs:  # DAPO's overlong penalty changed their reward
        local_sel |= torch.cat([torch.full((n,), bool(p)) for n, p in zip(sizes, penalized)]) & orig
    counts = learner.all_reduce_sum(
        torch.tensor([float(local_sel.sum()), float(orig.sum()), float(n_void)], dtype=torch.float64)
    )
    metrics["algo/selected_frac"] = float(counts[0] / counts[1].clamp(min=1.0))
    metrics["algo/void_masked"] = float(counts[2])

    def per_traj(flat: Tensor) -> list[Tensor]:
        return list(torch.split(flat, sizes))

    new_trajs = list(trajs)
    if not torch.equal(final_mask, orig):
        for i, (t, m) in enumerate(zip(trajs, per_traj(final_mask))):
            if not torch.equal(m, torch.tensor(t.loss_mask, dtype=torch.bool)):
                new_trajs[i] = dataclasses.replace(t, loss_mask=m.to(torch.long).tolist())
    adv_out: list = list(advantages) if adv_shaped is None else per_traj(adv_shaped.to(torch.float32))
    token_weights = None if weights is None else per_traj(weights.to(torch.float32))
    old: list[Tensor] | None = old_logprobs
    tis_cap = algo.tis_cap
    if algo.ratio_one_on_policy if on_policy is None else on_policy:
        old = None
        # TIS compares pi_old (recompute) with the sampler: folded into the weights. Without a
        # recompute pass (old_logprobs not filled yet) the learner applies it to its own log-probs.
        if tis_cap is not None and len(old_logprobs) == len(trajs):
            tis = [
                truncated_is_weights(lp, torch.tensor(t.rollout_logprobs), torch.tensor(t.loss_mask), tis_cap)
                for t, lp in zip(trajs, old_logprobs)
            ]
            token_weights = tis if token_weights is None else [a * b for a, b in zip(token_weights, tis)]
            tis_cap = None
    per_traj_terms = {name: per_traj(value) for name, value in terms.items()}
    return UpdateInputs(new_trajs, adv_out, token_weights, old, tis_cap, per_traj_terms, metrics)
