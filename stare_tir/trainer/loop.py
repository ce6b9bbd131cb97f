"""The RL stage: `train_rl` builds a run, evaluates, loops over `rl_step`, saves, evaluates.

It reads top to bottom: one step is `rl_step` (`trainer/step.py`); everything it calls is a
small function or a component built once in `build_run` (`trainer/run.py`). The config
dataclasses live in `stare_tir.train_config`. With trainer.max_staleness >= 1 the next steps'
rollouts generate while a step trains (`trainer/async_rollouts.py`); at 0 nothing of it runs.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import torch
from loguru import logger

from stare_tir.eval.evaluate import evaluate_problems
from stare_tir.learner.parts import begin_rl_step
from stare_tir.tracking import progress
from stare_tir.train_config import TrainConfig
from stare_tir.trainer.async_rollouts import AsyncRollouts
from stare_tir.trainer.checkpoint import checkpoint_dir, latest_checkpoint, resume_from, save_checkpoint
from stare_tir.trainer.run import Run, build_run, close_run
from stare_tir.trainer.step import global_means, rl_step
from stare_tir.trainer.weight_sync import restore_release_state, sync_weights


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run, with where it stopped: `step` is the last finished RL step,
    `checkpoint_step` the step a `--resume` restarts from (None: no checkpoint yet)."""

    def __init__(self, step: int, checkpoint_step: int | None, stage: str = "rl") -> None:
        super().__init__(f"interrupted at step {step} ({stage})")
        self.step, self.checkpoint_step, self.stage = step, checkpoint_step, stage


class StopRequest:
    """The first Ctrl-C asks the loop to stop after the current step (which is then saved); a
    second one stops at once. Installed only around the RL loop, in the main thread."""

    def __init__(self) -> None:
        self.requested = False

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "\nCtrl-C: stopping after this step, which is then saved (Ctrl-C again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequest]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGINT, self._handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    def agreed(self, run: Run) -> bool:
        """Whether any rank was asked to stop (all ranks stop at the same step)."""
        if run.learner.world_size == 1:
            return self.requested
        return run.learner.all_reduce_sum(torch.tensor([float(self.requested)])).item() > 0


def evaluate_heldout(run: Run, tag: str) -> dict[str, float]:
    """Accuracy and tool use on the held-out problems with the live rollout backend."""
    problems = run.learner.shard(run.eval_problems)
    n = run.cfg.trainer.eval_n
    with run.engine.configured(seed=run.cfg.trainer.seed + 7, progress=False):
        metrics, _ = evaluate_problems(
            run.engine, problems, n, dataset="heldout", pass_ks=[1], stop_on_infra_failure=False
        )
    out = {
        "eval/acc": metrics[f"avg@{n}"],
        "eval/tool_calls": metrics["mean_tool_calls"],
        "eval/response_len": metrics["mean_generated_tokens"],
        "eval/answer_rate": metrics["answer_rate"],
    }
    if problems and metrics["samples"] == 0:  # every sample failed (backend or sandbox): no number
        failed = metrics["sandbox_error_samples"] + metrics["rollout_error_samples"]
        logger.warning(f"eval ({tag}): none of {failed} samples could be graded (backend or sandbox failures)")
        out = dict.fromkeys(out, float("nan"))  # written as null: never a 0.0 that looks measured
    out = global_means(run.learner, out, len(problems))  # weighted by each rank's share of problems
    logger.info(f"eval ({tag}): acc={out['eval/acc']:.3f} tool_calls={out['eval/tool_calls']:.2f}")
    return out


def train_rl(cfg: TrainConfig, model_path: str, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """The RL stage: returns {"eval_before", "eval_after", "steps"}."""
    run = build_run(cfg, model_path, run_dir, resume=resume)
    saved_step: int | None = None  # the step of the checkpoint a --resume would restart from
    try:
        if run.learner.rank == 0 or not run.backend.shared_by_ranks:
            run.backend.claim_servers()  # SGLang: a pause a killed trainer left would hold every request
        restore_release_state(run)  # colocated servers a previous trainer left released
        ckpt = latest_checkpoint(run_dir) if resume else None
        if ckpt is not None:
            resume_from(run, ckpt)
            saved_step = run.step
        elif run.backend.shared_by_ranks:
            sync_weights(run)  # servers start from whatever they loaded: serve the learner's weights
        rollouts = None
        if cfg.trainer.max_staleness > 0:
            rollouts = AsyncRollouts(run, cfg.trainer.max_staleness)
            if ckpt is not None:
                rollouts.load(ckpt)  # the rounds the interrupted run had generated ahead
        eval_before = None
        if run.step == 0:
            eval_before = evaluate_heldout(run, "before RL")
            run.log.log(0, eval_before)
        bar = progress(cfg.trainer.steps, "RL", "step", initial=run.step, enabled=run.learner.rank == 0)
        stop = StopRequest()
        with stop.installed(), bar:  # the bar is closed before any message below it
            while run.step < cfg.trainer.steps:
                step = run.step + 1
                learner = run.learner  # the lr of this step, under learner.schedule_unit rl_step (verl's count)
                begin_rl_step(learner.scheduler, learner.lr_clock, step - 1, cfg.learner.schedule_unit)
                metrics = rl_step(run, step, rollouts)
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
                stopping = stop.agreed(run)
                if step % cfg.trainer.save_every == 0 or step == cfg.trainer.steps or stopping:
                    if rollouts is not None:  # the rounds generated ahead go into the checkpoint too
                        rollouts.save(checkpoint_dir(run_dir, step))
                    save_checkpoint(run, step)
                    saved_step = step
                if cfg.trainer.save_hf_every and step % cfg.trainer.save_hf_every == 0 and step < cfg.trainer.steps:
                    run.learner.save_hf(run_dir / "hf" / f"step_{step:06d}")  # collective under ZeRO-3
                if stopping:
                    raise Interrupted(step=step, checkpoint_step=saved_step)
        eval_after = evaluate_heldout(run, "after RL")
        run.log.log(run.step, eval_after)
        run.learner.save_hf(run_dir / "final")
        result = {
            "eval_before": eval_before,
            "eval_after": eval_after,
            "steps": run.step,
            "dropped": dict(run.dropped_total),
        }
    except KeyboardInterrupt as e:
        stopped = e if isinstance(e, Interrupted) else Interrupted(step=run.step, checkpoint_step=saved_step)
        try:
            close_run(run)
        except KeyboardInterrupt:
            # A second Ctrl-C stopped the loop inside a rollout: its leftover tasks re-raise it
            # while the engine closes. Stopping at once was asked for; the checkpoint is intact.
            pass
        raise stopped from None
    except BaseException:
        close_run(run)
        raise
    close_run(run)
    return result


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
