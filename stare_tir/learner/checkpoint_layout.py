"""How a learner checkpoint is laid out (ranks, ZeRO stage), and resuming it on another number of ranks.

A ZeRO-1/2/3 checkpoint holds one optimizer-state file per data-parallel rank
(`zero_pp_rank_<r>_mp_rank_00_optim_states.pt`), each with that rank's partition of the fp32
master weights and Adam moments, so DeepSpeed refuses to load it with another number of ranks
(`ZeRORuntimeException`). DeepSpeed's universal checkpoint (deepspeed/checkpoint/ds_to_universal.py)
rewrites it per parameter, independent of the rank count, and an engine loads that with
`checkpoint.load_universal`. `universal_checkpoint` does the conversion once, on rank 0, next to the
original (`<checkpoint>/universal`), and the learner then loads it: same weights, optimizer state,
schedule and client state. Stage 0 keeps full replicas and loads on any number of ranks as it is.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from torch import Tensor

LAYOUT_FILE = "learner_layout.json"
UNIVERSAL_TAG = "universal"  # <checkpoint>/universal: the converted copy, loaded with this tag


def save_layout(directory: Path, world_size: int, zero_stage: int, deepspeed_version: str) -> None:
    """Record the layout next to the DeepSpeed files (rank 0 only)."""
    layout = {"world_size": world_size, "zero_stage": zero_stage, "deepspeed": deepspeed_version}
    (directory / LAYOUT_FILE).write_text(json.dumps(layout) + "\n")


def load_layout(directory: Path, tag: str = "deepspeed") -> dict:
    """The saved layout; for a checkpoint without the file, read from DeepSpeed's file names
    (zero_stage is then None when it is 1 or 2: the names do not tell them apart)."""
    path = directory / LAYOUT_FILE
    if path.is_file():
        return json.loads(path.read_text())
    files = [p.name for p in (directory / tag).glob("zero_pp_rank_*_mp_rank_00_optim_states.pt")]
    if not files:
        return {"world_size": None, "zero_stage": 0}
    stage3 = any((directory / tag).glob("zero_pp_rank_*_mp_rank_00_model_states.pt"))
    return {"world_size": len(files), "zero_stage": 3 if stage3 else None}


def needs_universal(layout: dict, world_size: int, zero_stage: int) -> bool:
    """Whether resuming needs the universal copy; raises ValueError for a change it cannot bridge."""
    saved_stage = layout.get("zero_stage")
    if saved_stage is not None and saved_stage != zero_stage:
        raise ValueError(
            f"checkpoint saved with ZeRO stage {saved_stage}, this run has learner.zero_stage={zero_stage}: "
            f"resume with learner.zero_stage={saved_stage} (changing the stage on resume is not tested)"
        )
    saved_world = layout.get("world_size")
    return zero_stage > 0 and saved_world is not None and saved_world != world_size


def conversion_command(directory: Path, tag: str = "deepspeed") -> list[str]:
    """The command that writes <directory>/universal from <directory>/<tag>."""
    return [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(directory / tag),
        "--output_folder",
        str(directory / UNIVERSAL_TAG),
        # the learner's engine does not add universal_checkpoint_info (Megatron-DeepSpeed does)
        "--inject_missing_state",
    ]


def universal_checkpoint(
    directory: Path, rank: int, saved_world: int, world_size: int, all_reduce_sum: Callable[[Tensor], Tensor]
) -> None:
    """Make <directory>/universal exist on every rank: rank 0 converts (once), the others wait in
    `all_reduce_sum` (the learner's, any device), which also carries rank 0's failure to all.

    Collective. A failure on rank 0 stops every rank with the command to run by hand.
    """
    import torch

    log = logging.getLogger(__name__)
    target = directory / UNIVERSAL_TAG
    cmd = conversion_command(directory)
    failed = 0.0
    if rank == 0 and not (target / "zero").is_dir():
        log.warning(
            f"checkpoint {directory} was saved by {saved_world} ranks, this run has {world_size}: "
            f"converting it to DeepSpeed's universal checkpoint ({' '.join(cmd)})"
        )
        shutil.rmtree(target, ignore_errors=True)  # a conversion cut short earlier
        res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if res.returncode != 0 or not (target / "zero").is_dir():
            log.error(f"universal checkpoint conversion failed:\n{(res.stdout + res.stderr)[-4000:]}")
            shutil.rmtree(target, ignore_errors=True)
            failed = 1.0
    if float(all_reduce_sum(torch.tensor([failed]))[0]) > 0:
        raise RuntimeError(
            f"checkpoint {directory} was saved by {saved_world} ranks, this run has {world_size}, and the "
            f"conversion to a universal checkpoint failed (see rank 0's log); run it by hand: {' '.join(cmd)}"
        )
