"""Collecting one step's batch: rollouts, drops by reason, dynamic sampling over rounds, over-sampling."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from stare_tir.rollout.trajectory import Trajectory
from stare_tir.train_config import AlgoConfig
from stare_tir.trainer.run import Run, rollout_seed
from stare_tir.trainer.samples import write_run_samples
from stare_tir.trainer.staleness import ROUND_VERSION

if TYPE_CHECKING:  # async_rollouts imports this module
    from stare_tir.trainer.async_rollouts import AsyncRollouts


def drop_for_update(
    trajs: list[Trajectory], algo: AlgoConfig, is_stale: Callable[[Trajectory], bool] | None = None
) -> tuple[list[Trajectory], dict]:
    """Remove trajectories that must not reach the loss; every drop is counted by reason.

    sandbox_error: the infrastructure failed, the code did not; scoring it would bias advantages.
    rollout_error: the env or backend raised; the trajectory is incomplete, its reward meaningless.
    stale (asynchronous runs, `is_stale`): sampled by weights more than trainer.max_staleness
    versions old, or by weights the trainer never pushed.
    void turns (algo.void_turns=drop) / overlong (algo.filter_overlong): optional filters. With
    void_turns=mask the trajectory stays (its loss mask is zeroed later, `trainer.shaping`).
    """
    kept, counts = [], {"sandbox_error": 0, "rollout_error": 0, "void_turn": 0, "overlong": 0}
    if is_stale is not None:
        counts["stale"] = 0
    for t in trajs:
        if t.sandbox_error:
            counts["sandbox_error"] += 1
        elif t.finish_reason == "error":
            counts["rollout_error"] += 1
        elif is_stale is not None and is_stale(t):
            counts["stale"] += 1
        elif algo.void_turns == "drop" and t.void_turns > 0:
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


def collect_batch(
    run: Run, step: int, rollouts: AsyncRollouts | None = None
) -> tuple[list[Trajectory], list[Trajectory], dict]:
    """Roll out prompts until the batch holds `prompts_per_step` usable groups (dynamic sampling).

    Each round rolls out k = algo.oversample times the groups still missing and keeps the first
    informative ones, in prompt order, so with k large enough one round (one barrier on the slowest
    trajectory) fills the batch; the informative groups beyond it are counted and not used (DAPO's
    and the official STARE scripts' `batch[:traj_bsz]`). Every rank takes the same prompts from the
    sampler and keeps its own round-robin share, so the data position is identical on all ranks
    and in checkpoints, and a resumed run takes exactly the prompts an uninterrupted one would.
    algo.round_end=enough: groups are judged as they complete and a rank's round ends once it holds
    its share; what still generates is cancelled (counted, never trained on, not in `rolled`).
    rollouts (trainer.max_staleness >= 1): the first round was rolled out ahead, while earlier
    steps trained, and trajectories too stale to train on are dropped (`trainer/async_rollouts.py`).

    Returns (trajectories for the update, every trajectory rolled out, metrics).
    """
    cfg, algo = run.cfg, run.cfg.algo
    want = cfg.trainer.prompts_per_step
    share = -(-want // run.learner.world_size)  # ceil: at most this many groups per rank
    k = algo.oversample if algo.dynamic_sampling else 1
    enough = algo.round_end == "enough"
    if enough and rollouts is not None:
        raise ValueError("algo.round_end=enough needs trainer.max_staleness=0 (rounds rolled out ahead run in full)")
    groups: list[list[Trajectory]] = []
    rolled: list[Trajectory] = []
    drops = {"sandbox_error": 0, "rollout_error": 0, "void_turn": 0, "overlong": 0, "equal_reward_groups": 0}
    if rollouts is not None:
        drops["stale"] = 0
    aborted = {"trajectories": 0.0, "tokens": 0.0}
    rounds = algo.dynamic_sampling_rounds if algo.dynamic_sampling else 1
    barriers = prompts = 0

    def judge(trajs: list[Trajectory]) -> list[list[Trajectory]]:
        """The usable groups among `trajs` (whole groups of one round), every drop counted."""
        kept, counts = drop_for_update(trajs, algo, rollouts.is_stale if rollouts is not None else None)
        for key, v in counts.items():
            drops[key] += v
        if algo.dynamic_sampling:
            good = informative_groups(kept)
            drops["equal_reward_groups"] += len({t.group_id for t in kept}) - len(good)
            return good
        by_gid: dict[int, list[Trajectory]] = {}
        for t in kept:
            by_gid.setdefault(t.group_id, []).append(t)
        return list(by_gid.values())

    for rnd in range(rounds):
        need = want  # the first round asks for the whole batch (ranks share it round-robin)
        if rnd > 0:  # groups missing over all ranks: a rank with more than its share cannot lend them
            need = int(run.learner.all_reduce_sum(torch.tensor([float(max(share - len(groups), 0))])).item())
        if need <= 0:
            break
        prompts += k * need
        barriers += 1
        if rnd == 0 and rollouts is not None:  # taken and seeded alike when it was scheduled
            trajs = rollouts.first_round(step)
        else:
            problems = run.learner.shard(run.sampler.take(k * need))
            # Seeds derive from (step, round, rank): a resumed run samples exactly what an uninterrupted
            # one would, and no two ranks share the sampling streams of their k-th problem.
            with run.engine.configured(seed=rollout_seed(cfg.trainer.seed, step, rnd, run.learner.rank)):
                if enough:  # judged group by group as they complete (ids unique inside the round)
                    trajs = until_enough(run, problems, share, groups, judge, aborted)
                else:
                    trajs, _ = run.engine.run(problems, cfg.rollout.n_per_prompt)
            if rollouts is not None:  # a refill samples with the current weights: stamped like a round
                for t in trajs:
                    t.info[ROUND_VERSION] = run.learner.steps_applied
        for t in trajs:  # unique group ids across rounds and ranks
            t.group_id = (rnd * k * want + t.group_id) * run.learner.world_size + run.learner.rank
        rolled += trajs
        if not enough:
            groups += judge(trajs)
    batch = [t for g in groups[:share] for t in g]
    metrics = {f"dropped/{key}": v for key, v in drops.items()}
    metrics["batch/groups"] = float(len(groups[:share]))
    metrics["batch/trajectories"] = float(len(batch))
    # Barriers (rounds, each waiting for its slowest trajectory), prompts rolled out, and informative
    # groups generated beyond the batch (over-sampling's cost), summed over ranks.
    metrics["batch/sampling_rounds"] = float(barriers)
    metrics["batch/prompts"] = float(prompts)
    metrics.update(round_totals(run, max(len(groups) - share, 0), aborted, batch, rolled))
    write_run_samples(run, step, rolled)  # <run_dir>/samples/step_N.jsonl every trainer.samples_every steps
    return batch, rolled, metrics


def until_enough(
    run: Run,
    problems: list[dict],
    share: int,
    groups: list[list[Trajectory]],
    judge: Callable[[list[Trajectory]], list[list[Trajectory]]],
    aborted: dict[str, float],
) -> list[Trajectory]:
    """One round of algo.round_end=enough: each completed group is judged at once (appended to
    `groups` when usable) and the round stops as soon as this rank holds `share` groups; the
    trajectories still generating are cancelled and counted in `aborted`. Returns every completed
    trajectory of the round (also those of groups cut short: never judged, never trained on)."""
    if len(groups) >= share:  # this rank's share is in (later rounds fill other ranks): roll nothing
        return []

    def on_group(members: list[Trajectory]) -> bool:
        groups.extend(judge(members))
        return len(groups) >= share

    trajs, stats = run.engine.run_coroutine(
        run.engine.generate_groups(problems, on_group, run.cfg.rollout.n_per_prompt)
    )
    run.engine.last_stats = stats
    aborted["trajectories"] += stats["engine/aborted_trajectories"]
    aborted["tokens"] += stats["engine/aborted_tokens"]
    return trajs


def round_totals(
    run: Run, leftover: int, aborted: dict[str, float], batch: list[Trajectory], rolled: list[Trajectory]
) -> dict[str, float]:
    """The step's over-sampling costs, summed over ranks (one collective), and the mean response
    length (model tokens) of the batch and of everything completed: `round_end=enough` keeps the
    groups that finish first, which are shorter; the two means side by side show by how much."""
    kept_tok = sum(t.num_model_tokens for t in batch)
    all_tok = sum(t.num_model_tokens for t in rolled)
    local = [leftover, aborted["trajectories"], aborted["tokens"], kept_tok, len(batch), all_tok, len(rolled)]
    tot = run.learner.all_reduce_sum(torch.tensor([float(x) for x in local], dtype=torch.float64)).tolist()
    return {
        "batch/leftover_groups": tot[0],
        "batch/aborted_trajectories": tot[1],
        "batch/aborted_tokens": tot[2],
        "rollout/kept_mean_length": tot[3] / max(tot[4], 1.0),
        "rollout/all_mean_length": tot[5] / max(tot[6], 1.0),
    }
