"""Weight-update plumbing of the SGLang backend: payload serialization, buckets, the custom
process group SGLang servers join, and POSTs that run while this process broadcasts; and the
tensors of an HF checkpoint directory (the HF backend's update from disk).

Upstream references: python/sglang/srt/utils/common.py (`init_custom_process_group`,
`MultiprocessingSerializer`, `SafeUnpickler`), python/sglang/srt/managers/io_struct.py (request
fields), python/sglang/srt/model_executor/model_runner_components/weight_updater.py (the server
side of the broadcast).
"""

from __future__ import annotations

import base64
import io
import pickle
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from stare_tir.rollout.backends._http import request_sync

if TYPE_CHECKING:
    import torch


def serialize_named_tensors(named: list[tuple[str, torch.Tensor]]) -> str:
    """Base64 pickle of [(name, tensor)] as SGLang's update_weights_from_tensor reads it.

    Call it once per TP rank and server: each payload is opened exactly once by the rank it is
    for (managers/tp_worker.py `deserialize_own_rank`), which is what SGLang's own engine does
    (entrypoints/engine.py `_serialize_tensors_per_rank`: CUDA-IPC refcounts drop per payload).

    CUDA tensors travel as IPC handles whose device is the GPU's UUID, not this process's index
    of it (the server's CUDA_VISIBLE_DEVICES may number GPUs differently): the sender half of
    SGLang's reduction patch (utils/patch_torch.py; the server applies the receiving half before
    it unpickles). CPU tensors: a plain pickle, by value (what SGLang's SafeUnpickler allows;
    torch's reductions would pass CPU storage as file handles, which crashed the real 0.5.23
    server).
    """
    if any(t.is_cuda for _, t in named):
        from multiprocessing.reduction import ForkingPickler

        import torch
        import torch.multiprocessing  # noqa: F401  (registers torch's reductions)

        buf = io.BytesIO()
        pickler = ForkingPickler(buf)
        for cls in (torch.Tensor, torch.nn.Parameter):
            pickler.dispatch_table[cls] = _reduce_with_device_uuid
        pickler.dump(named)
        return base64.b64encode(buf.getvalue()).decode()
    return base64.b64encode(pickle.dumps([(n, t.detach().contiguous()) for n, t in named])).decode()


# Position of the storage device in the arguments of torch's `rebuild_cuda_tensor` (its signature
# has not changed for years; SGLang's patch relies on the same index).
CUDA_DEVICE_ARG = 6


def with_device_uuid(args: tuple, uuid_of) -> tuple:
    """`reduce_tensor`'s rebuild arguments with the device index replaced by `uuid_of(index)`."""
    return args[:CUDA_DEVICE_ARG] + (uuid_of(args[CUDA_DEVICE_ARG]),) + args[CUDA_DEVICE_ARG + 1 :]


def _reduce_with_device_uuid(tensor):
    import torch
    from torch.multiprocessing import reductions

    rebuild, args = reductions.reduce_tensor(tensor)
    if tensor.is_cuda:
        args = with_device_uuid(args, lambda i: str(torch.cuda.get_device_properties(i).uuid))
    return rebuild, args


def buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], max_bytes: int
) -> Iterator[tuple[list[tuple[str, torch.Tensor]], bool]]:
    """Group (name, tensor) pairs into buckets of at most max_bytes; yields (bucket, is_last)."""
    bucket: list = []
    size = 0
    pending: list | None = None
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > max_bytes:
            if pending is not None:
                yield pending, False
            pending, bucket, size = bucket, [], 0
        bucket.append((name, t))
        size += nbytes
    if pending is not None:
        yield pending, not bucket
    if bucket:
        yield bucket, True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_weight_update_group(
    backend: str, init_method: str, world_size: int, rank: int, group_name: str, timeout_s: float = 600.0
):
    """A torch.distributed group outside the default one, built as SGLang's servers build theirs
    (`init_custom_process_group`, python/sglang/srt/utils/common.py): a TCP store at
    `init_method` (tcp://host:port) that rank 0 serves, prefixed with the group name, and a
    process group registered under `group_name`, next to any default group (e.g. DeepSpeed's).

    The store is created directly, not through `rendezvous` (which SGLang's helper uses): under
    torchrun, TORCHELASTIC_USE_AGENT_STORE makes `rendezvous` connect as a client to a store
    nobody serves on this port, and the servers then time out waiting for rank 0.
    """
    import inspect
    from datetime import timedelta
    from urllib.parse import urlsplit

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    timeout = timedelta(seconds=timeout_s)
    where = urlsplit(init_method)
    if where.scheme != "tcp" or where.port is None:
        raise ValueError(f"init_method={init_method!r}: expected tcp://host:port")
    store = dist.TCPStore(
        where.hostname, where.port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False
    )
    opts = (
        "backend_options"
        if "backend_options" in inspect.signature(c10d._new_process_group_helper).parameters
        else "pg_options"
    )
    pg, _ = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        c10d.Backend(backend),
        c10d.PrefixStore(group_name, store),
        group_name=group_name,
        timeout=timeout,
        **{opts: None},
    )
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def broadcast_from_rank0(group, tensor: torch.Tensor):
    """Start a broadcast of `tensor` from the group's rank 0 (in place on the others); returns
    the work handle. Called on the ProcessGroup object itself: no default group needed."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    return group.broadcast([tensor], opts)


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


class Posts:
    """One POST per server in background threads: weight-update calls block server-side until
    the broadcast that feeds them has run, so they must be in flight while this process
    broadcasts, and a refusal must be seen while it does."""

    def __init__(self, urls: list[str], path: str, payloads: list[Any], timeout_s: float) -> None:
        self.urls, self.path = urls, path
        self.results: list[Any] = [None] * len(urls)
        self.threads = [
            threading.Thread(target=self._call, args=(i, payloads[i], timeout_s), daemon=True) for i in range(len(urls))
        ]
        for t in self.threads:
            t.start()

    def _call(self, i: int, payload: Any, timeout_s: float) -> None:
        try:
            self.results[i] = request_sync("POST", self.urls[i] + self.path, payload, timeout_s)
        except BaseException as exc:  # collected and re-raised by check()/join()
            self.results[i] = exc

    def failure(self) -> str | None:
        """The first finished call that failed, as a message (None: none so far)."""
        for url, t, r in zip(self.urls, self.threads, self.results):
            if t.is_alive():
                continue
            if isinstance(r, BaseException):
                return f"{url}{self.path}: {r}"
            if isinstance(r, dict) and r.get("success") is False:
                return f"{url}{self.path}: {r.get('message', 'failed')}"
        return None

    def failures(self) -> list[str]:
        """Every failed call once all have finished (for best-effort calls: nothing is raised)."""
        for t in self.threads:
            t.join()
        return [
            f"{url}{self.path}: {r if isinstance(r, BaseException) else r.get('message', 'failed')}"
            for url, r in zip(self.urls, self.results)
            if isinstance(r, BaseException) or (isinstance(r, dict) and r.get("success") is False)
        ]

    def join(self) -> list[Any]:
        for t in self.threads:
            t.join()
        err = self.failure()
        if err is not None:
            raise RuntimeError(f"weight update failed: {err}")
        return self.results

    def wait_for(self, work, what: str, timeout_s: float) -> None:
        """Poll `work` (a collective or a thread) until done; raise at once if a server refused."""
        deadline = time.monotonic() + timeout_s
        done = work.is_completed if hasattr(work, "is_completed") else (lambda: not work.is_alive())
        while not done():
            err = self.failure()
            if err is not None:
                raise RuntimeError(f"weight update refused while {what}; stopped instead of blocking: {err}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not done after {timeout_s}s (rollout.sglang.timeout_s)")
            time.sleep(0.005)


def iter_checkpoint_tensors(path: str) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of an HF checkpoint directory (safetensors preferred, else .bin)."""
    import torch

    root = Path(path)
    files = sorted(root.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        for f in files:
            yield from load_file(str(f)).items()
        return
    files = sorted(root.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors or pytorch_model*.bin weights")
    for f in files:
        yield from torch.load(str(f), map_location="cpu", weights_only=True).items()
