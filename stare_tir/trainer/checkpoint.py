"""Checkpoints of the RL loop: save (atomic `latest` pointer), find the newest, resume."""

from __future__ import annotations

import shutil
from pathlib import Path

from loguru import logger

from stare_tir.trainer.run import Run
from stare_tir.trainer.weight_sync import sync_weights


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (the `latest` pointer is written only after a save ends)."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if path.is_dir() else None


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def save_checkpoint(run: Run, step: int) -> Path:
    ckpt_root = run.run_dir / "checkpoints"
    path = checkpoint_dir(run.run_dir, step)
    client_state = {
        "step": step,
        "sampler": run.sampler.state_dict(),
        "methods": run.methods.state_dict(),
        "nonfinite_in_row": run.nonfinite_in_row,
        "empty_in_row": run.empty_in_row,
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


def method_states(state: dict) -> dict[str, dict]:
    """The token methods' states of a checkpoint's client state. Checkpoints written before methods
    kept their own state hold one `controller` (STARE's gate, W, M, and EAPO's initial entropy)."""
    if "methods" in state:
        return state["methods"]
    old = dict(state.get("controller") or {})
    if not old:
        return {}
    return {"stare": old, "eapo": {"initial_entropy": old.pop("initial_entropy", None)}}


def resume_from(run: Run, path: Path) -> None:
    state = run.learner.load_checkpoint(path)
    run.step = int(state["step"])
    run.sampler.load_state_dict(state["sampler"])
    run.methods.load_state_dict(method_states(state))
    run.nonfinite_in_row = int(state.get("nonfinite_in_row", 0))
    run.empty_in_row = int(state.get("empty_in_row", 0))
    run.dropped_total = dict(state.get("dropped_total", {}))
    run.log.truncate_after(run.step)  # rows of the interrupted step are written again
    sync_weights(run)  # the servers may hold anything (a restarted trainer's, or start-up weights)
    logger.info(f"resumed from {path} at step {run.step}")
