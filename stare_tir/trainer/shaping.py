"""From a step's batch to the learner's inputs: selection groups, STARE's weights, the token methods,
void-turn masking, verl's aggregation and the on-policy ratio.

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

import torch
from torch import Tensor

from stare_tir.algos.policy_loss import truncated_is_weights
from stare_tir.algos.stare import StareController, stare_token_weights_scoped
from stare_tir.algos.token_methods import TOKEN_METHODS, TokenInputs, combine_effects
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


def stare_omega(view: TokenView, controller: StareController, top_p: float, variant: str) -> tuple[Tensor, dict]:
    """STARE's omega over the global batch [T], selecting inside each selection group."""
    groups = view.groups()
    omega = torch.ones(view.mask.shape, dtype=torch.float32)
    parts, metrics = stare_token_weights_scoped(
        [-view.logprobs[p] for p in groups],
        [view.advantages[p] for p in groups],
        scope="micro_batch",
        top_p=top_p,
        w=controller.w,
        m=controller.m,
        variant=variant,
    )
    for p, w in zip(groups, parts):
        omega[p] = w
    return omega, metrics


def token_methods(
    view: TokenView, algo: AlgoConfig, seed: int, entropy_state: tuple[float, float | None] | None = None
) -> tuple[dict[str, Tensor], dict]:
    """Apply algo.token_methods in order inside each selection group (each method sees the advantages
    the ones before it shaped) and compose their effects with `combine_effects`. Returns global [T]
    tensors (advantages, weights, keep, kl_coef, selected; only those some method produced) and metrics.
    entropy_state: (this step's batch entropy, the run's initial one) for entropy-driven methods."""
    h_t, h_0 = entropy_state if entropy_state is not None else (None, None)
    out: dict[str, Tensor] = {}
    methods = [(name, TOKEN_METHODS.get(name), algo.methods.get(name)) for name in algo.token_methods]
    selected_by = {name: torch.zeros(view.mask.shape, dtype=torch.bool) for name in algo.token_methods}
    method_values: dict[str, float] = {}
    for g, pos in enumerate(view.groups()):
        adv = view.advantages[pos]
        effects = []
        for k, (name, fn, settings) in enumerate(methods):
            gen = torch.Generator().manual_seed((seed * 1_000_003 + k) * 10_007 + g)
            old = view.old_logprobs[pos] if view.old_logprobs is not None else None
            effect = fn(TokenInputs(view.logprobs[pos], view.entropy[pos], adv, gen, old, h_t, h_0), settings)
            selected_by[name][pos] = effect.selected
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
            ("kl_coef", 0.0, torch.float32),
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
    metrics: dict[str, float] = dict(method_values)
    n_loss = max(int(view.mask.sum()), 1)
    for name, selected in selected_by.items():
        out["selected"] = out.get("selected", torch.zeros_like(selected)) | selected
        metrics[f"algo/{name}/selected_frac"] = float(selected.sum()) / n_loss
    return out, metrics


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
class UpdateInputs:
    """What `Learner.train_step` receives for this step."""

    trajs: list[Trajectory]  # the batch; a trajectory whose loss mask a method narrowed is a copy
    advantages: list  # per trajectory a float, or a response-length tensor when shaped per token
    token_weights: list[Tensor] | None
    old_logprobs: list[Tensor] | None  # None: the update's own, detached (ratio exactly 1)
    tis_cap: float | None  # None when truncated IS is folded into token_weights
    kl_coef: list[Tensor] | None = None  # KL-Cov's per-token coefficients, per trajectory
    metrics: dict = field(default_factory=dict)


def prepare_update(
    learner: Learner,
    trajs: list[Trajectory],
    advantages: list[float],
    old_logprobs: list[Tensor],
    entropies: list[Tensor],
    algo: AlgoConfig,
    controller: StareController | None,
    seed: int,
    penalized: list[bool] | None = None,
    *,
    current: tuple[list[Tensor], list[Tensor]] | None = None,
    entropy_state: tuple[float, float | None] | None = None,
    verl_layout: list[list[list[int]]] | None = None,
    on_policy: bool | None = None,
) -> tuple[UpdateInputs, list[Tensor] | None]:
    """The learner's inputs for this step (or mini-batch), and STARE's omega per trajectory (None while
    its gate is off or STARE is not used). seed: this step's seed (Clip-Cov's draw). penalized:
    trajectories whose reward DAPO's overlong penalty changed (for algo/selected_frac). Without a
    selection to make (no open STARE gate, no token method, token-mean aggregation) nothing is
    gathered over ranks.

    current: the current policy's log-probs and entropies, where they differ from the stored
    old_logprobs and entropies (a mini-batch after the first); selections use them, the loss's
    old log-probs stay the stored ones. entropy_state: (batch entropy, initial entropy) for the
    token methods. verl_layout: see `token_view`. on_policy: old = the update's own log-probs
    (None: algo.ratio_one_on_policy)."""
    masks, n_void = void_masks(trajs, algo)
    metrics: dict[str, float] = {}
    if controller is not None and not controller.gate_on:
        metrics.update({"stare/reweighted_frac": 0.0, "stare/mean_weight": 1.0})
    sizes = [len(t.response_ids) for t in trajs]
    local_mask = torch.cat(masks) if trajs else torch.zeros(0, dtype=torch.bool)  # [this rank's tokens]
    local_sel = torch.zeros(local_mask.shape, dtype=torch.bool)  # selected or changed by the algorithm
    weights = adv_shaped = kl_coef = omega = None
    final_mask = local_mask
    if (controller is not None and controller.gate_on) or algo.token_methods or algo.loss_agg == "verl":
        sel_lp, sel_ent = current if current is not None else (old_logprobs, entropies)
        stored = old_logprobs if current is not None else None
        view = token_view(learner, trajs, advantages, sel_lp, sel_ent, masks, algo, stored, verl_layout)
        selected = torch.zeros(view.mask.shape, dtype=torch.bool)
        if controller is not None and controller.gate_on:
            omega, stare_metrics = stare_omega(view, controller, algo.stare.top_p, algo.stare.variant)
            metrics.update(stare_metrics)
            selected |= omega != 1.0
        effects, method_metrics = token_methods(view, algo, seed, entropy_state)
        metrics.update(method_metrics)
        selected |= effects.get("selected", selected)
        global_final = view.mask & effects["keep"] if "keep" in effects else view.mask
        for w in (omega, effects.get("weights")):
            if w is not None:
                weights = w.clone() if weights is None else weights * w
        if algo.loss_agg == "verl":
            agg = verl_aggregation_weights(view, global_final)
            weights = agg if weights is None else weights * agg
        local_sel = selected[view.mine] & view.mask[view.mine]
        final_mask = global_final[view.mine]
        weights = None if weights is None else weights[view.mine]
        omega = None if omega is None else omega[view.mine]
        adv_shaped = effects["advantages"][view.mine] if "advantages" in effects else None
        kl_coef = effects["kl_coef"][view.mine] if "kl_coef" in effects else None

    # algo/selected_frac: loss tokens any part of the algorithm selected or changed, over all ranks.
    orig = torch.cat([torch.tensor(t.loss_mask, dtype=torch.bool) for t in trajs]) if trajs else local_mask
    local_sel |= orig & ~local_mask  # void-masked
    if penalized and trajs:  # DAPO's overlong penalty changed their reward
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
    kl_per_traj = None if kl_coef is None else per_traj(kl_coef)
    old: list[Tensor] | None = old_logprobs
    tis_cap = algo.tis_cap
    if algo.ratio_one_on_policy if on_policy is None else on_policy:
        old = None
        if tis_cap is not None:  # TIS compares pi_old (recompute) with the sampler: fold it into the weights
            tis = [
                truncated_is_weights(lp, torch.tensor(t.rollout_logprobs), torch.tensor(t.loss_mask), tis_cap)
                for t, lp in zip(trajs, old_logprobs)
            ]
            token_weights = tis if token_weights is None else [a * b for a, b in zip(token_weights, tis)]
            tis_cap = None
    omegas = None if omega is None else per_traj(omega)
    inputs = UpdateInputs(new_trajs, adv_out, token_weights, old, tis_cap, kl_per_traj, metrics)
    return inputs, omegas
