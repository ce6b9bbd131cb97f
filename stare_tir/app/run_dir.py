"""A run directory belongs to one run: starting, resuming and overwriting it.

A new run refuses a directory that already holds one under way (a checkpoint, a finished RL step,
a final model; one where a start failed before its first step counts as free); `--resume` continues the run that is there, with that run's own config.yaml as the base
and any setting that would change shown and confirmed; `--overwrite` deletes the old run's outputs
once the new run's start-up checks have passed. Light on purpose: no torch import here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import yaml
from loguru import logger

from stare_tir.app.preflight import StartupError
from stare_tir.config import config_changes, resolve_config

# What marks a directory as holding a run (a failed start leaves none of these behind).
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoints", "final", "hf")
# What `--overwrite` deletes: every output a run writes. sft/ stays: its model is reused only when
# it was made from the same inputs (stare_tir.sft.stage), so keeping it never mixes two runs.
RUN_OUTPUTS = (*RUN_MARKERS, "train.log", "plots", "tb", "wandb", "wandb_run_id")


def run_markers(run_dir: Path) -> list[str]:
    """The names in `run_dir` that show it holds a run (empty: free for a new one)."""
    return [name for name in RUN_MARKERS if (run_dir / name).exists()]


def has_checkpoint(run_dir: Path) -> bool:
    """A complete RL checkpoint exists (the `latest` pointer is written only after a save ends)."""
    pointer = run_dir / "checkpoints" / "latest"
    return pointer.is_file() and (run_dir / "checkpoints" / pointer.read_text().strip()).is_dir()


def run_under_way(run_dir: Path) -> bool:
    """The run there got somewhere: a checkpoint, a finished RL step in metrics.jsonl, a final or
    intermediate model, a summary. A directory holding only what a start writes (config.yaml,
    logs, the evaluation before RL) counts as free: a start that failed there is retried."""
    if has_checkpoint(run_dir) or any((run_dir / name).exists() for name in ("summary.json", "final", "hf")):
        return True
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return False
    with open(metrics, encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line) if line.strip() else None
            except ValueError:
                return True  # unreadable: treat as a run, never delete it silently
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] >= 1:
                return True
    return False


def auto_resume(run_dir: Path) -> bool:
    """`--resume auto`: True to resume (a checkpoint is there), False to start (the directory is
    free); a run under way without a checkpoint is refused, as nothing could continue it."""
    if has_checkpoint(run_dir) and (run_dir / "config.yaml").is_file():
        return True
    if not run_under_way(run_dir):
        return False
    raise StartupError(
        f"--resume auto: trainer.run_dir={str(run_dir)!r} holds a run ({', '.join(run_markers(run_dir))}) but no "
        "checkpoint to continue from: replace it with --overwrite, or name a new directory with trainer.run_dir=..."
    )


def check_run_dir(
    run_dir: Path, *, resume: bool, overwrite: bool, prog: str = "stare-train", write_test: bool = True
) -> None:
    """Refuse to start a new run into a directory that holds one, or to resume where none is, or
    a directory that cannot be written (`check_run_dir_writable`; write_test=False skips it)."""
    if resume and overwrite:
        raise StartupError("--resume and --overwrite contradict each other: pass one of them")
    if resume:
        if not (run_dir / "config.yaml").is_file():
            raise StartupError(
                f"--resume: trainer.run_dir={str(run_dir)!r} holds no config.yaml, so no run to resume "
                "(check the directory name; drop --resume to start a new run there)"
            )
        if not has_checkpoint(run_dir):
            raise StartupError(
                f"--resume: trainer.run_dir={str(run_dir)!r} holds no checkpoint yet (the run stopped before "
                f"its first save, trainer.save_every): start it again with `{prog} --overwrite "
                f"trainer.run_dir={run_dir}`"
            )
        if write_test:
            check_run_dir_writable(run_dir)
        return
    found = run_markers(run_dir)
    if found and not overwrite and run_under_way(run_dir):
        raise StartupError(
            f"trainer.run_dir={str(run_dir)!r} already holds a run ({', '.join(found)}): continue it with "
            f"--resume, replace it with --overwrite, or name a new directory with trainer.run_dir=..."
        )
    if write_test:
        check_run_dir_writable(run_dir)


# Bytes the start-up check writes (and syncs) in the run directory: enough to need a data block.
PROBE_BYTES = 64 * 1024


def check_run_dir_writable(run_dir: Path, key: str = "trainer.run_dir") -> int:
    """The run directory can be written: a probe file is written, synced and removed there (or in
    its nearest existing parent, where it would be made: a failed start creates nothing). A full
    or read-only file system then ends the start in one line, before the first write of the run
    (config.yaml) would end it in a traceback. Logs and returns the free bytes there."""
    where = run_dir
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise StartupError(f"{key}={str(run_dir)!r}: {where} is a file, not a directory: name another directory")
    probe = where / f".stare-write-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as fh:
            fh.write(b"\0" * PROBE_BYTES)
            fh.flush()
            os.fsync(fh.fileno())  # a file system short of space may refuse only here
    except OSError as e:
        raise StartupError(
            f"{key}={str(run_dir)!r} cannot be written ({e.strerror or e}; {_free(where)} free in {where}): "
            f"free space there, or name another directory with {key}=..."
        ) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
    free = shutil.disk_usage(where).free
    logger.info(f"run directory {run_dir}: {_free(where)} free")
    return free


def _free(where: Path) -> str:
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return "unknown space"
    return f"{free / 2**30:.1f} GiB" if free >= 2**30 else f"{free / 2**20:.1f} MiB"


def clear_run_dir(run_dir: Path, world_size: int = 1) -> list[str]:
    """Delete the outputs of the run in `run_dir` (for --overwrite); returns what was deleted.

    Other ranks' logs (train.rank<N>.log) of this run are truncated by their own ranks, which may
    already have opened them; those of ranks beyond the new world size are deleted.
    """
    gone = []
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        gone.append(name)
    for log in run_dir.glob("train.rank*.log"):
        rank = log.name.removeprefix("train.rank").removesuffix(".log")
        if not rank.isdigit() or int(rank) >= world_size:
            log.unlink()
            gone.append(log.name)
    return gone


def read_saved_config(schema: type, run_dir: Path) -> tuple[dict, Any]:
    """The run's config.yaml as a dict and as a validated config of `schema`."""
    path = run_dir / "config.yaml"
    try:
        saved = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise StartupError(f"{path}: not valid YAML ({e}); restore it or start a new run") from None
    if not isinstance(saved, dict):
        raise StartupError(f"{path}: expected a mapping of config sections; restore it or start a new run")
    return saved, resolve_config(schema, saved)


def resume_config(
    schema: type,
    run_dir: Path,
    overrides: list[str],
    requested: Any | None = None,
    *,
    accept_changes: bool = False,
    confirm: Callable[[list[str]], bool] | None = None,
) -> Any:
    """The config a `--resume` continues with: the run's own config.yaml plus the overrides.

    requested: the config an explicit --config file (plus overrides) would give; its differences
    from the saved run count as changes too. Changes (trainer.run_dir aside: it is where the run
    was found) are shown and must be accepted (`accept_changes`, or `confirm(changes)` answering
    yes); otherwise a StartupError lists them.
    """
    check_run_dir(run_dir, resume=True, overwrite=False, write_test=False)  # tested when the run starts
    saved_tree, saved = read_saved_config(schema, run_dir)
    new = requested if requested is not None else resolve_config(schema, saved_tree, overrides)
    new.trainer.run_dir = str(run_dir)
    changes = [c for c in config_changes(saved, new) if not c.startswith("trainer.run_dir:")]
    if changes and not accept_changes:
        if confirm is None or not confirm(changes):
            raise StartupError(
                f"--resume: these settings differ from {run_dir / 'config.yaml'}: {'; '.join(changes)}. "
                "Pass --accept-changes to continue the run with them, or drop them to resume as it was"
            )
    return new


def ask_on_terminal(changes: list[str]) -> bool:
    """Show the changed settings and ask; only on an interactive terminal of a one-process run."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or not (sys.stdin.isatty() and sys.stderr.isatty()):
        return False
    print("--resume: these settings differ from the run's config.yaml:", file=sys.stderr)
    for change in changes:
        print(f"  {change}", file=sys.stderr)
    answer = input("continue the run with them? [y/N] ")
    return answer.strip().lower() in ("y", "yes")
