"""Process-group and RNG helpers for the learner (torch.distributed and DeepSpeed set-up)."""

from __future__ import annotations

import os
import random


def init_process_group(backend: str) -> None:
    """Join the launcher's process group, or make a 1-process one when started without a launcher."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend)  # env:// from torchrun / the deepspeed launcher
    else:
        # An in-process store: a 1-process group needs no address, port or file. DeepSpeed's
        # engine still insists on LOCAL_RANK, which a launcher would have set.
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
        os.environ.setdefault("LOCAL_RANK", "0")


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
