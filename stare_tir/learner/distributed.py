"""Process-group and RNG helpers for the learner (torch.distributed and DeepSpeed set-up)."""

from __future__ import annotations

import logging
import os
import random
from datetime import timedelta


def init_process_group(backend: str, timeout: timedelta) -> None:
    """Join the launcher's process group, or make a 1-process one when started without a launcher.

    timeout bounds every collective of the default group (NCCL's watchdog, gloo's waits). A group
    that already exists is kept (its timeout cannot change); a different timeout is logged.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        current = process_group_timeout()
        if current is not None and current != timeout:
            logging.getLogger(__name__).warning(
                f"process group exists with timeout {current}; requested {timeout} is not applied"
            )
        return
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # env:// from torchrun / the deepspeed launcher
        dist.init_process_group(backend=backend, timeout=timeout)
    else:
        # An in-process store: a 1-process group needs no address, port or file. DeepSpeed's
        # engine still insists on LOCAL_RANK, which a launcher would have set.
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        os.environ.setdefault("LOCAL_RANK", "0")


def process_group_timeout() -> timedelta | None:
    """The timeout the default group's backend really uses (None if it cannot be read).

    Read from the backend's options, not from our argument: this is what a test must see.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    pg = dist.distributed_c10d._get_default_group()
    device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
    try:
        return pg._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):  # private API: other torch versions may lack it
        return None


def skip_shm_comm_build() -> None:
    """Keep DeepSpeed from compiling its CPU shared-memory all-reduce op on first use.

    DeepSpeed builds it (~40-60 s of g++ on a cold cache) when its comm backend is created, but only
    `inference_all_reduce` (tensor-parallel inference) ever uses it; training collectives go
    through torch.distributed (gloo) either way. Marking it incompatible makes DeepSpeed skip it.
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def rng_state() -> dict:
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
