"""Rollout samples on disk: what the model wrote during RL, every N steps.

`write_samples` keeps a few trajectories of a step in `<run_dir>/samples/step_NNNNNN.jsonl`, one
JSON object per line: the prompt (chat template applied, as the model saw it), the response text
with its code and the interpreter's output, reward, grade (correct, predicted answer), finish
reason, the weight version(s) that sampled it, tool calls and turns, and the gold answer it was
graded against. The same rows go to W&B (a
Table) or TensorBoard (text) when those mirrors are on. Rank 0 writes the trajectories of its
own share (the other ranks' are not gathered: a sample is for reading, not for statistics).
The samples are taken round robin over the step's groups (one per prompt first), so a file shows
different problems before a second answer to the same one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from stare_tir.rollout.trajectory import Trajectory

if TYPE_CHECKING:
    from stare_tir.tracking import MetricsLog

COLUMNS = ["step", "problem_id", "reward", "correct", "pred", "answer", "finish_reason", "weight_version", "tool_calls", "prompt", "text"]  # fmt: skip


def samples_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "samples" / f"step_{step:06d}.jsonl"


def pick(trajectories: Sequence[Trajectory], n: int) -> list[Trajectory]:
    """Up to n trajectories, round robin over their groups (group_id), in rollout order."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t)
    out: list[Trajectory] = []
    depth = 0
    while len(out) < n and any(len(g) > depth for g in groups.values()):
        out += [g[depth] for g in groups.values() if len(g) > depth][: n - len(out)]
        depth += 1
    return out


def sample_row(step: int, traj: Trajectory, tokenizer: Any) -> dict[str, Any]:
    """One trajectory as a readable record (token ids decoded once, here, for reading only)."""
    versions = sorted({v for _, _, v in traj.weight_versions})
    return {
        "step": step,
        "problem_id": traj.problem_id,
        "reward": traj.reward,
        "correct": traj.info.get("correct"),
        "pred": traj.info.get("pred"),
        "answer": traj.info.get("gold"),  # what the grade compared with (the env's reward info)
        "finish_reason": traj.finish_reason,
        "weight_version": versions[0] if len(versions) == 1 else versions,
        "tool_calls": traj.tool_calls,
        "turns": traj.num_turns,
        "sandbox_error": traj.sandbox_error,
        "prompt": tokenizer.decode(traj.prompt_ids, skip_special_tokens=False),
        # the whole response as the model was conditioned on it: its turns and the observations
        "text": tokenizer.decode(traj.response_ids, skip_special_tokens=False),
    }


def write_samples(
    run_dir: str | Path,
    step: int,
    trajectories: Sequence[Trajectory],
    tokenizer: Any,
    *,
    every: int,
    n: int = 4,
    rank: int = 0,
    log: MetricsLog | None = None,
) -> Path | None:
    """Write step `step`'s samples at step 1 (the first a user reads) and when step % every == 0
    (every=0: never); rank 0 only. `log`: a MetricsLog whose W&B/TensorBoard mirrors also get the
    rows as a table. Returns the file."""
    if not every or (step % every and step != 1) or rank != 0 or not trajectories:
        return None
    rows = [sample_row(step, t, tokenizer) for t in pick(trajectories, n)]
    path = samples_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    tmp.replace(path)  # a resumed step writes it again, whole
    if log is not None:
        log.log_table(step, "samples", COLUMNS, [[r[c] for c in COLUMNS] for r in rows])
    return path


def write_run_samples(run: Any, step: int, trajectories: Sequence[Trajectory]) -> Path | None:
    """The RL loop's call: `write_run_samples(run, step, rolled)` after a step's rollouts. Samples
    are a reading aid: failing to write them (a full disk, say) is logged, never ends the run."""
    from loguru import logger

    every, n = run.cfg.trainer.samples_every, run.cfg.trainer.samples_per_step
    try:
        return write_samples(
            run.run_dir, step, trajectories, run.parts.tokenizer, every=every, n=n, rank=run.learner.rank, log=run.log
        )
    except Exception as e:  # noqa: BLE001 - see the docstring
        logger.warning(f"step {step}: rollout samples not written ({type(e).__name__}: {e})")
        return None
