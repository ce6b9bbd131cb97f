"""How the SGLang stand-in opens a tensor payload: under the rules of sglang v0.5.23's receiving side.

Before a TP rank unpickles its payload it patches torch's CUDA rebuild so that a storage device
named by UUID is mapped to one of the GPUs this process sees (python/sglang/srt/utils/patch_torch.py
`monkey_patch_torch_reductions`, `_device_from_maybe_uuid`: "Invalid device_uuid=..." when none
matches), called from managers/tp_worker.py `deserialize_own_rank` inside the scheduler's weight
updater (managers/scheduler_components/weight_updater.py `update_weights_from_tensor`) outside any
try: the exception ends the scheduler and the server. `open_payload` applies the same patch (torch's
own reductions, no sglang import) and reports that raise as fatal, so a payload naming a GPU the
server cannot see takes the stand-in down as it takes the real server down. CPU tensors travel by
value and are untouched by the patch. On a machine without CUDA every UUID is unknown.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable

DEVICE_ARG = 6  # position of the device in `rebuild_cuda_tensor`'s arguments (patch_torch.py's constant)


class InvalidDeviceUUID(Exception):
    """patch_torch.py raises a bare Exception; a subclass here so the stand-in can tell it apart."""


def device_from_maybe_uuid(device: int | str) -> int:
    """SGLang's mapping: an index stays, a UUID becomes the index of the visible GPU that has it."""
    import torch

    if isinstance(device, int):
        return device
    if isinstance(device, str):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        for index in range(count):
            if str(torch.cuda.get_device_properties(index).uuid) == device:
                return index
        raise InvalidDeviceUUID("Invalid device_uuid=" + device)
    raise InvalidDeviceUUID(f"Unknown type: {device=}")


def patch_cuda_rebuild() -> None:
    """torch's `rebuild_cuda_tensor` maps a UUID device first, as SGLang's patch does (once)."""
    from torch.multiprocessing import reductions

    if hasattr(reductions, "_standin_rebuild_original"):
        return
    original = reductions.rebuild_cuda_tensor
    reductions._standin_rebuild_original = original

    def rebuild(*args: Any) -> Any:
        args = (*args[:DEVICE_ARG], device_from_maybe_uuid(args[DEVICE_ARG]), *args[DEVICE_ARG + 1 :])
        return original(*args)

    # found by name when a pickle names it (an in-process sender and this receiver share the module)
    rebuild.__module__, rebuild.__name__, rebuild.__qualname__ = (
        reductions.__name__,
        "rebuild_cuda_tensor",
        "rebuild_cuda_tensor",
    )
    reductions.rebuild_cuda_tensor = rebuild
    reductions.init_reductions()


def open_payload(blob: bytes, load: Callable[[bytes], Any] = pickle.loads, die: Callable[[str], None] = print) -> Any:
    """Unpickle one TP rank's payload; an unknown device UUID is fatal (`die`), as in the server."""
    patch_cuda_rebuild()
    try:
        return load(blob)
    except InvalidDeviceUUID as exc:
        die(f"{exc} (patch_torch.py, raised in the scheduler's weight updater)")
        raise
