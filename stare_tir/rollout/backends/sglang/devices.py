"""Which GPUs a local SGLang server can open: checked before the first tensor push.

Tensor sync (`weight_sync=tensor`) hands every server CUDA IPC handles on the trainer's GPU, named
by its UUID. The server maps the UUID back to one of its own devices before it opens the handle
(sgl-project/sglang v0.5.23 python/sglang/srt/utils/patch_torch.py `_device_from_maybe_uuid`: it
raises "Invalid device_uuid=..." for a GPU outside its CUDA_VISIBLE_DEVICES), and that raise
happens in the scheduler's weight updater outside any try
(srt/managers/scheduler_components/weight_updater.py `update_weights_from_tensor`), so the
scheduler dies and takes the server down. A server launched with its own
`CUDA_VISIBLE_DEVICES=<other GPU>` (the README's per-server launch) hits it on the first push.

The check reads the server's environment: the server is on this node (tensor sync requires it),
so the process listening on its port is found in /proc (its socket's inode) and its
CUDA_VISIBLE_DEVICES read from /proc/<pid>/environ. Entries are GPU UUIDs ("GPU-...", also
"MIG-...") or indices of the physical enumeration, which `nvidia-smi` maps to UUIDs. Where the
process or the mapping cannot be read (another user's process, another container) nothing is
refused and a warning says the check did not run.

The same reading tells which GPU each TP rank of a server runs on (`server_gpus`), which the
colocated per-rank push (`relay.py`) maps to the trainer rank on that GPU.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Callable
from urllib.parse import urlsplit

from loguru import logger

if TYPE_CHECKING:
    from stare_tir.rollout.backends.sglang.layout import ServerLayout

PROC = Path("/proc")


def listening_pid(port: int, proc: Path = PROC) -> int | None:
    """The process that listens on TCP `port` (IPv4 or IPv6), from /proc; None when not found."""
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{inode}]")
    if not inodes:
        return None
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            for fd in (pid_dir / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(pid_dir.name)
        except OSError:  # another user's process, or it just ended
            continue
    return None


def visible_devices_of(pid: int, proc: Path = PROC) -> str | None:
    """The process's CUDA_VISIBLE_DEVICES ("" when unset: every GPU); None when unreadable."""
    try:
        env = (proc / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"CUDA_VISIBLE_DEVICES="):
            return item.split(b"=", 1)[1].decode()
    return ""


def physical_uuids() -> dict[str, str] | None:
    """Physical GPU index -> UUID (nvidia-smi); None without nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    pairs = (line.split(",") for line in out.splitlines() if "," in line)
    return {i.strip(): u.strip() for i, u in pairs}


def norm_uuid(uuid: str) -> str:
    """ "GPU-5d8f..." (nvidia-smi, CUDA_VISIBLE_DEVICES) and torch's "5d8f..." compare equal."""
    uuid = uuid.strip().lower()
    for prefix in ("gpu-", "mig-"):
        uuid = uuid.removeprefix(prefix)
    return uuid


def sees_device(visible: str, uuid: str, index_to_uuid: Callable[[], dict[str, str] | None]) -> bool | None:
    """Whether a process with CUDA_VISIBLE_DEVICES=`visible` can open a handle on GPU `uuid`
    (None: cannot tell, an index without a mapping)."""
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not visible.strip():
        return True  # unset: every GPU of the node
    want = norm_uuid(uuid)
    mapping = None
    for entry in entries:
        if entry.isdigit():
            mapping = mapping if mapping is not None else index_to_uuid()
            if mapping is None:
                return None
            entry = mapping.get(entry, "")
        if norm_uuid(entry) == want:
            return True
    return False


def device_uuid(tensor) -> str:
    """The UUID of the GPU holding `tensor`, as the IPC handle names it (`_weights.py`)."""
    import torch

    return str(torch.cuda.get_device_properties(tensor.device).uuid)


def check_servers_see_device(
    urls: list[str],
    uuid: str,
    *,
    proc: Path = PROC,
    index_to_uuid: Callable[[], dict[str, str] | None] = physical_uuids,
) -> None:
    """Refuse, with one line, a local server whose CUDA_VISIBLE_DEVICES hides GPU `uuid` (where
    the trainer's tensors live) before any handle is sent (see the module docstring)."""
    for url in urls:
        port = urlsplit(url).port or 80
        pid = listening_pid(port, proc)
        visible = visible_devices_of(pid, proc) if pid is not None else None
        seen = sees_device(visible, uuid, index_to_uuid) if visible is not None else None
        if seen is None:
            logger.warning(
                f"{url}: could not read which GPUs the server sees (its process or nvidia-smi is not "
                f"readable here); tensor sync assumes it sees the trainer's GPU {uuid}"
            )
        elif not seen:
            raise ValueError(
                f"rollout.sglang.weight_sync=tensor but {url} (pid {pid}, CUDA_VISIBLE_DEVICES={visible}) cannot "
                f"see the trainer's GPU {uuid}: the server would die opening its first CUDA IPC handle "
                "(patch_torch.py raises on an unknown device UUID). Launch it seeing that GPU too, or use "
                "rollout.sglang.weight_sync=distributed"
            )


def server_gpus(
    url: str,
    layout: ServerLayout,
    *,
    proc: Path = PROC,
    index_to_uuid: Callable[[], dict[str, str] | None] = physical_uuids,
) -> tuple[list[str] | None, str]:
    """The GPU (UUID) each TP rank of the local server at `url` runs on, in TP rank order; or
    (None, why) when that cannot be read here.

    TP rank r's scheduler process uses the server's visible device base_gpu_id + r * gpu_id_step
    (sglang v0.5.23 srt/entrypoints/engine.py `_launch_scheduler_processes`, for pp 1 on one
    node; `maybe_reindex_device_id` may renumber it inside the child, the physical GPU stays), both
    reported by /server_info. That index counts the GPUs of the server's CUDA_VISIBLE_DEVICES (all
    of the node when unset), whose entries are UUIDs or physical indices (nvidia-smi's numbering,
    as in `sees_device`)."""
    if layout.base_gpu_id is None:
        return None, f"{url} does not report base_gpu_id in /server_info"
    pid = listening_pid(urlsplit(url).port or 80, proc)
    visible = visible_devices_of(pid, proc) if pid is not None else None
    if visible is None:
        return None, f"the process serving {url} is not readable here (its CUDA_VISIBLE_DEVICES is unknown)"
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    mapping: dict[str, str] | None = None
    gpus = []
    for rank in range(layout.tp_size):
        index = layout.base_gpu_id + rank * layout.gpu_id_step
        if entries and index >= len(entries):
            return None, f"{url} TP rank {rank} uses visible GPU {index}, but its CUDA_VISIBLE_DEVICES={visible}"
        entry = entries[index] if entries else str(index)
        if entry.isdigit():
            mapping = mapping if mapping is not None else index_to_uuid()
            if mapping is None or entry not in mapping:
                return (
                    None,
                    f"GPU {entry} of {url} TP rank {rank} has no UUID here (nvidia-smi unavailable or no such GPU)",
                )
            entry = mapping[entry]
        gpus.append(entry)
    return gpus, ""
