"""The RL loop: rollouts -> rewards -> filters -> advantages -> recompute -> STARE -> update -> sync.

`train_rl(cfg, ...)` reads top to bottom. One step is `rl_step`; everything it calls is a small
function or a component built once in `build_run`. The config dataclasses live in
`stare_tir.train_config`.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from loguru import logger
from tqdm import tqdm

from stare_tir.algos.advantage import get_advantage_estimator
from stare_tir.algos.policy_loss import get_policy_loss
from stare_tir.algos.stare import StareConfig, StareController, stare_token_weights, stare_token_weights_scoped
from stare_tir.components import Components, build_components, load_tokenizer
from stare_tir.config import to_dict
from stare_tir.data import PromptSampler, load_split
from stare_tir.evaluate import evaluate_problems
from stare_tir.learner import Learner
from stare_tir.rollout.engine import RolloutEngine, rollout_stats
from stare_tir.rollout.trajectory import Trajectory
from stare_tir.tracking import MetricsLog, wandb_run_id
from stare_tir.train_config import AlgoConfig, TrainConfig

# ---------------------------------------------------------------------------------------------
# Building blocks of one step (small functions; the loop below reads top to bottom)


def drop_for_update(trajs: list[Trajectory], algo: AlgoConfig) -> tuple[list[Trajectory], dict]:
    """Remove trajectories that must not reach the loss; every drop is counted by reason.

    sandbox_error: the infrastructure failed, the code did not; scoring it would bias advantages.
    rollout_error: the env or backend raised; the trajectory is incomplete, its reward meaningless.
    void turns / overlong: optional DAPO-style filters.
    """
    kept, counts = [], {"sandbox_error": 0, "rollout_error": 0, "void_turn": 0, "overlong": 0}
    for t in trajs:
        if t.sandbox_error:
            counts["sandbox_error"] += 1
        elif t.finish_reason == "error":
            counts["rollout_error"] += 1
        elif algo.filter_void_turns and t.void_turns > 0:
            counts["void_turn"] += 1
        elif algo.filter_overlong and t.finish_reason == "max_tokens":
            counts["overlong"] += 1
        else:
            kept.append(t)
    return kept, counts


def informative_groups(trajs: list[Trajectory]) -> list[list[Trajectory]]:
    """Groups (same group_id) with at least two members and non-equal rewards."""
    groups: dict[Any, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    return [g for g in groups.values() if len(g) >= 2 and len({t.reward for t in g}) > 1]


def group_advantages(trajs: list[Trajectory], estimator: str) -> tuple[list[float], dict]:
    """Group advantages by the registered estimator `estimator` (algo.advantage), one scalar per
    trajectory: grpo normalises rewards inside each group by its std, drgrpo only centres them."""
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)  # [N]
    group_ids = torch.tensor([t.group_id for t in trajs], dtype=torch.long)  # [N]
    adv, metrics = get_advantage_estimator(estimator)(rewards, group_ids)
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


def lplus_entropy_raising_frac(
    learner: Learner,
    trajs: list[Trajectory],
    advantages: list[float],
    omegas: list[torch.Tensor],
    old_logprobs: list[torch.Tensor],
    entropies: list[torch.Tensor],
    w: float,
) -> float | None:
    """Share of L+ tokens (weight w, A > 0) whose surprisal exceeds their position's entropy.

    Reinforcing a token raises its position's entropy only if -log p > H there
    (dH/dz_a = p_a (-log p_a - H)). Near 0, STARE's W on L+ sharpens instead of exploring: the
    "surprising" correct tokens are still the modal choice. None when w == 1 (L+ not marked).
    """
    if w == 1.0:
        return None
    counts = torch.zeros(2, dtype=torch.float64)  # [raising, |L+|]
    for t, a, om, lp, ent in zip(trajs, advantages, omegas, old_logprobs, entropies):
        if a <= 0:
            continue
        sel = (om == w) & torch.tensor(t.loss_mask, dtype=torch.bool)
        counts[0] += float(((-lp > ent) & sel).sum())
        counts[1] += float(sel.sum())
    counts = learner.all_reduce_sum(counts)
    return float(counts[0] / counts[1]) if counts[1] > 0 else None


def stare_weights(
    learner: Learner,
    trajs: list[Trajectory],
    advantages: list[float],
    old_logprobs: list[torch.Tensor],
    controller: StareController,
    cfg: StareConfig,
) -> tuple[list[torch.Tensor] | None, dict]:
    """omega per trajectory (None while the gate is off: the update is then exactly GRPO's).

    Surprisal is -log pi from this step's recompute pass; selection runs over every model token of
    the global batch (all micro-batches, all ranks) or, with scope=micro_batch, inside each
    micro-batch of the update plan, as in the reference implementation.
    """
    if not controller.gate_on:
        return None, {"stare/reweighted_frac": 0.0, "stare/mean_weight": 1.0}
    masks = [torch.tensor(t.loss_mask, dtype=torch.bool) for t in trajs]
    surprisal = [-lp for lp in old_logprobs]
    adv_tok = [torch.full_like(lp, a) for lp, a in zip(old_logprobs, advantages)]
    kw = dict(top_p=cfg.top_p, w=controller.w, m=controller.m, variant=cfg.variant)
    if cfg.scope == "batch":
        flat = lambda xs: torch.cat([x.reshape(-1) for x in xs]) if xs else torch.zeros(0)  # noqa: E731
        s_all, mine = learner.all_gather_flat(flat(surprisal))
        a_all, _ = learner.all_gather_flat(flat(adv_tok))
        m_all, _ = learner.all_gather_flat(flat(masks).float())
        omega_all, metrics = stare_token_weights(s_all, a_all, mask=m_all > 0.5, **kw)
        omega_flat = omega_all[mine]
        return list(torch.split(omega_flat, [len(t.response_ids) for t in trajs])), metrics
    plan = learner.micro_batch_plan(trajs)
    omegas: list[torch.Tensor | None] = [None] * len(trajs)
    parts, metrics = stare_token_weights_scoped(
        [torch.cat([surprisal[i] for i in idx]) for idx in plan],
        [torch.cat([adv_tok[i] for i in idx]) for idx in plan],
        masks=[torch.cat([masks[i] for i in idx]) for idx in plan],
        scope="micro_batch",
        **kw,
    )
    for idx, part in zip(plan, parts):
        for i, w in zip(idx, torch.split(part, [len(trajs[i].response_ids) for i in idx])):
            omegas[i] = w
    return omegas, metrics  # type: ignore[return-value]


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


# ---------------------------------------------------------------------------------------------
# The run: components built once, then the loop


@dataclass
class Run:
    """Everything one training run holds; built by `build_run`, used by `rl_step`."""

    cfg: TrainConfig
    run_dir: Path
    parts: Components  # tokenizer, rollout backend, engine (which owns the sandbox)
    learner: Learner
    controller: StareController
    sampler: PromptSampler
    eval_problems: list[dict]
    log: MetricsLog
    step: int = 0
    nonfinite_in_row: int = 0
    empty_in_row: int = 0  # consecutive steps without a usable group (trainer.max_empty_steps)
    dropped_total: dict = field(default_factory=dict)

    @property
    def engine(self) -> RolloutEngine:
        return self.parts.engine

    @property
    def backend(self) -> Any:
        return self.parts.backend


def rollout_seed(seed: int, step: int, rnd: int, rank: int) -> int:
    """The engine's base seed for one sampling round of one rank (it derives per-turn seeds)."""
    return ((seed * 100_003 + step) * 1_009 + rnd) * 65_537 + rank


def collect_batch(run: Run, step: int) -> tuple[list[Trajectory], list[Trajectory], dict]:
    """Roll out prompts until the batch holds `prompts_per_step` usable groups (dynamic sampling).

    Returns (trajectories for the update, every trajectory rolled out, metrics). Every rank takes
    the same prompts from the sampler and keeps its own round-robin share, so the data position
    is identical on all ranks and in checkpoints.
    """
    cfg, algo = run.cfg, run.cfg.algo
    want = cfg.trainer.prompts_per_step
    groups: list[list[Trajectory]] = []
    rolled: list[Trajectory] = []
    drops = {"sandbox_error": 0, "rollout_error": 0, "void_turn": 0, "overlong": 0, "equal_reward_groups": 0}
    rounds = algo.dynamic_sampling_rounds if algo.dynamic_sampling else 1
    for rnd in range(rounds):
        need = want - int(run.learner.all_reduce_sum(torch.tensor([float(len(groups))])).item())
        if need <= 0:
            break
        problems = run.learner.shard(run.sampler.take(need))
        # Seeds derive from (step, round, rank): a resumed run samples exactly what an uninterrupted
        # one would, and no two ranks share the sampling streams of their k-th problem.
        with run.engine.configured(seed=rollout_seed(cfg.trainer.seed, step, rnd, run.learner.rank)):
            trajs, _ = run.engine.run(problems, cfg.rollout.n_per_prompt)
        for t in trajs:  # unique group ids across rounds and ranks
            t.group_id = (rnd * want + t.group_id) * run.learner.world_size + run.learner.rank
        rolled += trajs
        kept, counts = drop_for_update(trajs, algo)
        for k, v in counts.items():
            drops[k] += v
        if algo.dynamic_sampling:
            good = informative_groups(kept)
            drops["equal_reward_groups"] += len({t.group_id for t in kept}) - len(good)
            groups += good
        else:
            by_gid: dict[int, list[Trajectory]] = {}
            for t in kept:
                by_gid.setdefault(t.group_id, []).append(t)
            groups += list(by_gid.values())
    share = -(-want // run.learner.world_size)  # ceil: at most this many groups per rank
    batch = [t for g in groups[:share] for t in g]
    metrics = {f"dropped/{k}": v for k, v in drops.items()}
    metrics["batch/groups"] = float(len(groups[:share]))
    metrics["batch/trajectories"] = float(len(batch))
    metrics["batch/sampling_rounds"] = float(rnd + 1)
    return batch, rolled, metrics


def rl_step(run: Run, step: int) -> dict:
    """One RL step; returns its metrics row."""
    cfg, algo, learner = run.cfg, run.cfg.algo, run.learner
    t0 = time.perf_counter()
    batch, rolled, metrics = collect_batch(run, step)
    metrics.update(global_means(learner, rollout_stats(rolled), len(rolled)))
    t_rollout = time.perf_counter() - t0

    # Decided over all ranks: a rank with an empty share still joins every collective below.
    if learner.all_reduce_sum(torch.tensor([float(len(batch))])).item() == 0:
        logger.warning(f"step {step}: no usable group in {len(rolled)} trajectories; no update")
        metrics.update({"time/rollout": t_rollout, "update/skipped_empty": 1.0})
        check_empty_steps(run, step, rolled, metrics)
        return metrics
    run.empty_in_row = 0
    release_rollout_memory(run)  # colocated servers free their GPU memory for the learner

    advantages, adv_metrics = group_advantages(batch, algo.advantage)
    metrics.update(adv_metrics)

    t1 = time.perf_counter()
    old_logprobs, entropies = learner.compute_logprobs_entropy(batch)
    entropy = batch_entropy(learner, batch, entropies)
    metrics.update({"entropy/batch": entropy, "entropy/target": algo.stare.target_entropy})
    metrics.update(logprob_mismatch(batch, old_logprobs))
    t_recompute = time.perf_counter() - t1

    omega = None
    if algo.use_stare:
        run.controller.update(entropy)
        omega, stare_metrics = stare_weights(learner, batch, advantages, old_logprobs, run.controller, algo.stare)
        metrics.update(run.controller.metrics())
        metrics.update(stare_metrics)
        metrics["stare/gate_on"] = float(run.controller.gate_on)
        if omega is not None:
            metrics["stare/lplus_s_gt_h_frac"] = lplus_entropy_raising_frac(
                learner, batch, advantages, omega, old_logprobs, entropies, run.controller.w
            )

    t2 = time.perf_counter()
    applied = 0  # optimizer steps that changed the weights (a skipped one leaves them bit-identical)
    for _ in range(algo.ppo_epochs):
        update = learner.train_step(
            batch,
            advantages,
            omega,
            old_logprobs,
            clip_low=algo.clip_low,
            clip_high=algo.effective_clip_high,
            dual_clip_c=algo.dual_clip_c,
            loss_agg=algo.loss_agg,
            tis_cap=algo.tis_cap,
            loss_fn=get_policy_loss(algo.policy_loss),
        )
        metrics.update({f"update/{k}": v for k, v in update.items()})
        if update["step_skipped"]:
            break
        applied += 1
    t_update = time.perf_counter() - t2

    if update["step_skipped"]:
        run.nonfinite_in_row += 1
        metrics["update/nonfinite_in_row"] = float(run.nonfinite_in_row)
        logger.warning(
            f"step {step}: non-finite loss or gradient, update skipped "
            f"({run.nonfinite_in_row} in a row, limit {cfg.trainer.max_nonfinite_steps})"
        )
        if run.nonfinite_in_row >= cfg.trainer.max_nonfinite_steps:
            raise FloatingPointError(
                f"{run.nonfinite_in_row} consecutive steps had a non-finite loss or gradient; stopping. "
                "Lower learner.lr, raise learner.grad_clip, or check the data; the last good checkpoint "
                f"is under {run.run_dir / 'checkpoints'}"
            )
    else:
        run.nonfinite_in_row = 0

    t3 = time.perf_counter()
    if applied:  # unchanged weights are not pushed again (a collective skip: every rank agrees)
        sync_weights(run)
    resume_rollout_memory(run)
    metrics["update/synced"] = float(applied > 0)
    t_sync = time.perf_counter() - t3

    n_tokens = sum(len(t.response_ids) for t in rolled)
    metrics.update(
        {
            "time/rollout": t_rollout,
            "time/recompute": t_recompute,
            "time/update": t_update,
            "time/sync": t_sync,
            "time/step": time.perf_counter() - t0,
            "throughput/rollout_tokens_per_s": n_tokens / max(t_rollout, 1e-9),
        }
    )
    return metrics


def sync_weights(run: Run) -> None:
    """Push the learner's weights to the rollout backend, with exactly one pusher per server.

    Every rank iterates `export_weights` (a collective under ZeRO-3). A backend of its own (HF,
    in process) is updated by each rank; servers shared by all ranks (SGLang) are updated by
    rank 0 alone while the others wait in the all-reduce below, which also carries rank 0's
    failure to every rank (no rank is left waiting on a push that died). No generation runs
    during a sync by construction: every rank has finished its rollouts of this step (they end
    inside `collect_batch`) before any rank reaches the update.
    """
    learner, backend = run.learner, run.backend
    pusher = backend is not None and (learner.rank == 0 or not getattr(backend, "shared_by_ranks", False))
    colocated = pusher and getattr(getattr(backend, "cfg", None), "colocate", False)
    error = None
    try:
        if colocated:
            backend.resume_memory_occupation(["weights"])  # KV cache stays free until after the push
        weights = learner.export_weights()
        if pusher:
            backend.update_weights(weights)
        else:
            for _ in weights:  # other ranks still take part in the gathers
                pass
    except Exception as exc:  # re-raised on this rank below, after telling the others
        error = exc
    failed = learner.all_reduce_sum(torch.tensor([float(error is not None)])).item()
    if error is not None:
        raise error
    if failed:
        raise RuntimeError("weight sync failed on rank 0 (see its log); stopping every rank")


def _on_pusher(run: Run, method: str) -> None:
    """Call `backend.<method>()` on the one rank that controls shared servers; others wait."""
    backend = run.backend
    if backend is None or not getattr(getattr(backend, "cfg", None), "colocate", False):
        return
    if run.learner.rank == 0:
        getattr(backend, method)()
    run.learner.all_reduce_sum(torch.zeros(1))  # the barrier: no rank runs ahead of the servers


def release_rollout_memory(run: Run) -> None:
    """Colocated layout (rollout.sglang.colocate): SGLang frees weights and KV cache on the
    shared GPUs before the learner recomputes and updates."""
    _on_pusher(run, "release_memory_occupation")


def resume_rollout_memory(run: Run) -> None:
    """Colocated layout: restore whatever is still released (the KV cache after a push; all of
    it when the step pushed nothing), before the next rollouts."""
    _on_pusher(run, "resume_memory_occupation")


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


# ---------------------------------------------------------------------------------------------
# Checkpoints


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (the `latest` pointer is written only after a save ends)."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if path.is_dir() else None


def save_checkpoint(run: Run, step: int) -> Path:
    ckpt_root = run.run_dir / "checkpoints"
    path = ckpt_root / f"step_{step:06d}"
    client_state = {
        "step": step,
        "sampler": run.sampler.state_dict(),
        "controller": run.controller.state_dict(),
        "nonfinite_in_row": run.nonfinite_in_row,
        "dropped_total": run.dropped_total,
    }
    run.learner.save_checkpoint(path, client_state)
    if run.learner.rank == 0:
        tmp = ckpt_root / "latest.tmp"
        tmp.write_text(path.name)
        tmp.replace(ckpt_root / "latest")  # atomic: a kill mid-save leaves the previous pointer
        old = sorted(p for p in ckpt_root.glob("step_*") if p.is_dir())
        for stale in old[: -run.cfg.trainer.keep_checkpoints]:
            shutil.rmtree(stale, ignore_errors=True)
    logger.info(f"checkpoint: {path}")
    return path


def resume_from(run: Run, path: Path) -> None:
    state = run.learner.load_checkpoint(path)
    run.step = int(state["step"])
    run.sampler.load_state_dict(state["sampler"])
    run.controller.load_state_dict(state["controller"])
    run.nonfinite_in_row = int(state.get("nonfinite_in_row", 0))
    run.dropped_total = dict(state.get("dropped_total", {}))
    run.log.truncate_after(run.step)  # rows of the interrupted step are written again
    sync_weights(run)
    logger.info(f"resumed from {path} at step {run.step}")


# ---------------------------------------------------------------------------------------------
# Evaluation on held-out problems (the same code path as scripts/eval_aime.py)


def evaluate_heldout(run: Run, tag: str) -> dict[str, float]:
    """Accuracy and tool use on the held-out problems with the live rollout backend."""
    problems = run.learner.shard(run.eval_problems)
    n = run.cfg.trainer.eval_n
    with run.engine.configured(seed=run.cfg.trainer.seed + 7, progress=False):
        metrics, _ = evaluate_problems(run.engine, problems, n, dataset="heldout", pass_ks=[1])
    out = {
        "eval/acc": metrics[f"avg@{n}"],
        "eval/tool_calls": metrics["mean_tool_calls"],
        "eval/response_len": metrics["mean_generated_tokens"],
        "eval/answer_rate": metrics["answer_rate"],
    }
    out = global_means(run.learner, out, len(problems))  # weighted by each rank's share of problems
    logger.info(f"eval ({tag}): acc={out['eval/acc']:.3f} tool_calls={out['eval/tool_calls']:.2f}")
    return out


# ---------------------------------------------------------------------------------------------
# Building a run, and the loop


def build_run(cfg: TrainConfig, model_path: str, run_dir: Path, resume: bool = False) -> Run:
    """Learner, rollout components, controller, data and metrics log of one RL run.

    model_path: the resolved starting checkpoint (`components.resolve_model_path`, or the SFT
    stage's output). resume: a W&B mirror continues the run directory's stored W&B run.
    Data is loaded first: a bad source fails before the model is.
    """
    train_problems, eval_problems = load_split(cfg.data, "train"), load_split(cfg.data, "eval")
    tokenizer = load_tokenizer(cfg.model, model_path)
    learner_cfg = dataclasses.replace(cfg.learner, total_steps=cfg.learner.total_steps or cfg.trainer.steps)
    if cfg.trainer.backend == "sglang":
        from stare_tir.rollout.backends.sglang import prepare_trainer_env

        if cfg.rollout.sglang.weight_sync == "disk" and not cfg.rollout.sglang.sync_dir:
            raise ValueError(
                "rollout.sglang.weight_sync=disk needs rollout.sglang.sync_dir: a directory the "
                "trainer writes and every SGLang server reads (shared storage across nodes)"
            )
        prepare_trainer_env(cfg.rollout.sglang)  # NCCL settings must precede the learner's NCCL
    learner = Learner(model_path, learner_cfg, tokenizer, trust_remote_code=cfg.model.trust_remote_code)
    parts = build_components(
        cfg.model, cfg.trainer.backend, cfg.rollout, cfg.env, cfg.sandbox, model_path=model_path, tokenizer=tokenizer
    )
    logger.info("sandbox isolation: {}", getattr(parts.engine.sandbox, "info", {}))  # not_enforced: what is weaker
    return Run(
        cfg=cfg,
        run_dir=run_dir,
        parts=parts,
        learner=learner,
        controller=StareController.from_config(cfg.algo.stare),
        sampler=PromptSampler(train_problems, seed=cfg.data.seed),
        eval_problems=eval_problems,
        log=MetricsLog(
            run_dir,
            tensorboard=cfg.trainer.tensorboard,
            wandb_project=cfg.trainer.wandb_project,
            run_name=run_dir.name,
            config=to_dict(cfg),
            wandb_id=wandb_run_id(run_dir, resume) if cfg.trainer.wandb_project else None,
        )
        if learner.rank == 0
        else _NullLog(),
    )


class _NullLog:
    """Metrics sink of ranks other than 0."""

    def log(self, step: int, metrics: dict) -> None: ...
    def truncate_after(self, step: int) -> None: ...
    def close(self) -> None: ...


def close_run(run: Run) -> None:
    try:
        run.parts.close()
    finally:
        run.log.close()


def train_rl(cfg: TrainConfig, model_path: str, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """The RL stage: returns {"eval_before", "eval_after", "steps"}."""
    run = build_run(cfg, model_path, run_dir, resume=resume)
    try:
        ckpt = latest_checkpoint(run_dir) if resume else None
        if ckpt is not None:
            resume_from(run, ckpt)
        elif getattr(run.backend, "shared_by_ranks", False):
            sync_weights(run)  # servers start from whatever they loaded: serve the learner's weights
        eval_before = None
        if run.step == 0:
            eval_before = evaluate_heldout(run, "before RL")
            run.log.log(0, eval_before)
        bar = tqdm(total=cfg.trainer.steps, initial=run.step, desc="RL", unit="step", disable=run.learner.rank != 0)
        while run.step < cfg.trainer.steps:
            step = run.step + 1
            metrics = rl_step(run, step)
            if cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0 and step < cfg.trainer.steps:
                metrics.update(evaluate_heldout(run, f"step {step}"))
            run.step = step
            for k, v in metrics.items():
                if k.startswith("dropped/"):
                    run.dropped_total[k] = run.dropped_total.get(k, 0) + v
            run.log.log(step, metrics)
            bar.update(1)
            bar.set_postfix(
                reward=f"{metrics.get('reward/mean', float('nan')):.2f}",
                H=f"{metrics.get('entropy/batch', float('nan')):.3f}",
                gate=int(metrics.get("stare/gate_on", 0)),
            )
            if run.learner.rank == 0:
                logger.info(_step_line(step, metrics))
            if step % cfg.trainer.save_every == 0 or step == cfg.trainer.steps:
                save_checkpoint(run, step)
            if cfg.trainer.save_hf_every and step % cfg.trainer.save_hf_every == 0 and step < cfg.trainer.steps:
                run.learner.save_hf(run_dir / "hf" / f"step_{step:06d}")  # collective under ZeRO-3
        bar.close()
        eval_after = evaluate_heldout(run, "after RL")
        run.log.log(run.step, eval_after)
        run.learner.save_hf(run_dir / "final")
        return {
            "eval_before": eval_before,
            "eval_after": eval_after,
            "steps": run.step,
            "dropped": dict(run.dropped_total),
        }
    finally:
        close_run(run)


def _step_line(step: int, m: dict) -> str:
    g = lambda k: m.get(k, float("nan"))  # noqa: E731
    gate = int(m.get("stare/gate_on", 0.0))
    return (
        f"step {step}: reward {g('reward/mean'):+.3f} acc {g('acc/train'):.3f} "
        f"H {g('entropy/batch'):.3f} gate {gate} "
        f"tools {g('rollout/tool_calls'):.2f} len {g('rollout/response_len'):.0f} "
        f"groups {int(m.get('batch/groups', 0))} loss {g('update/loss'):+.4f} "
        f"t {g('time/step'):.1f}s"
    )
