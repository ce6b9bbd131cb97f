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


# ------------------------------------------------------------------ one process per TP rank
# `--rank-processes`: each TP rank opens its payload in its own process, as SGLang's TP workers
# do (managers/tp_worker.py `deserialize_own_rank` runs in the rank's scheduler process; a CUDA
# IPC handle opened in the process that made it would be a plain pointer, proving nothing). The
# rank keeps the weights it received on its own GPU (copied into tensors it allocated at the first
# push, as the model runner copies into its parameters: model_runner_components/weight_updater.py
# `update_weights_from_tensor` -> load_weights), drops the opened handles, and reports a digest of
# each tensor, so a sender can check the bytes arrived bit-exact. Used by scripts/gpu_check.py.


def digest(t: Any) -> list[int]:
    """Integer sums of the tensor's raw bits (16-bit and 32-bit words, and every 7th 16-bit word):
    equal digests on both sides mean the same bytes but for a coincidence no copy error makes."""
    import torch

    flat = t.detach().contiguous().view(-1)
    words = flat.view(torch.int16) if flat.element_size() == 2 else flat.view(torch.uint8)
    out = [int(words.sum()), int(words[::7].sum()), int(words.numel())]  # integer sums: int64, exact
    if words.numel() % 2 == 0 and words.element_size() == 2:
        out.append(int(words.view(torch.int32).sum()))
    return out


def payload_devices(blob: bytes) -> list[str]:
    """The storage devices the payload's CUDA handles name (UUIDs), or "cpu" for tensors passed
    by value, read without opening anything: which GPU each TP rank's payload points at."""
    import torch  # noqa: F401  (its reductions must be importable to read the pickle's calls)

    names: list[str] = []

    class Peek(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if name == "rebuild_cuda_tensor":
                return lambda *args: names.append(str(args[DEVICE_ARG])) or None
            return super().find_class(module, name)

    Peek(__import__("io").BytesIO(blob)).load()
    return names or ["cpu"]


def rank_main(rank: int, conn: Any, safe: bool) -> None:
    """A TP rank's process: open each payload under SGLang's rules, keep the weights, report."""
    import io

    import torch
    from sglang_standin_quirks import AllowListUnpickler

    own = rank % torch.cuda.device_count() if torch.cuda.is_available() else None
    if own is not None:
        torch.cuda.set_device(own)  # SGLang: gpu_id = base_gpu_id + tp_rank * gpu_id_step
    kept: dict[str, Any] = {}
    load = (lambda b: AllowListUnpickler(io.BytesIO(b)).load()) if safe else pickle.loads
    while True:
        try:
            blob = conn.recv()
        except EOFError:  # the server process ended
            return
        if blob is None:
            return
        fatal: list[str] = []
        try:
            named = open_payload(blob, load, fatal.append)
        except InvalidDeviceUUID:
            conn.send({"fatal": fatal[0]})
            return  # the scheduler process dies with it
        except Exception as exc:  # noqa: BLE001 - answered as the server's 400
            conn.send({"error": repr(exc)})
            continue
        digests = {}
        opened = sorted({str(t.device) for _, t in named})
        for name, t in named:
            if name not in kept:
                kept[name] = torch.empty_like(t, device=f"cuda:{own}" if own is not None else "cpu")
            kept[name].copy_(t)
            digests[name] = digest(kept[name])
        del named  # the handles close here: the sender's memory is its own again
        t = None
        mem = 0
        if own is not None:
            torch.cuda.synchronize()
            mem = torch.cuda.memory_allocated(own)
        conn.send({"rank": rank, "opened_on": opened, "own_device": own, "digests": digests, "allocated": mem})


class RankProcesses:
    """`tp_size` rank processes (spawned: CUDA cannot be used in a forked child)."""

    def __init__(self, tp_size: int, safe: bool) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(tp_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=rank_main, args=(rank, child, safe), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def update(self, blobs: list[bytes]) -> list[dict]:
        """Every rank opens its own payload (in parallel); their reports, by rank."""
        for conn, blob in zip(self.conns, blobs):
            conn.send(blob)
        return [conn.recv() for conn in self.conns]

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs):
            try:
                conn.send(None)
            except OSError:
                pass
            proc.join(timeout=10)
