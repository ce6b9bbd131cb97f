"""What the HF backend resolves from "auto": its device and dtype (and a remote-code model loaded
on them), and the torch threads of its model work on CPU.

Threads: `torch.set_num_threads` called in the backend's worker thread sets that thread's OpenMP
and MKL thread counts only (both are per-thread settings); the trainer's main thread keeps its own
(scripts/bench/bench_hf_engine.py times a matmul in the main thread after the worker set 1). It
also sets torch's process default that threads started later pick up, so the backend puts that
default back right after (`apply_worker_threads`); nothing needs restoring after a rollout phase.
One catch: a thread takes the process default on its first parallel op, overwriting a count set
before it, so the worker makes one first (measured: without it the worker ran on 2 threads again).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# CPU flags of native bfloat16 arithmetic (AVX512-BF16 dot products, AMX tiles): without them
# torch converts bf16 through fp32 and bf16 runs slower than fp32 (see HFBackendConfig.dtype).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# Below this many cores per process, "auto" runs the model work on one thread: such a machine is
# shared (the 2-core test and CI machines run several jobs), and OpenMP workers then spin-wait for
# cores that other processes hold. Measured on SmolLM2-135M, 16 rows, 2 cores at load average 1-2
# (scripts/bench/bench_hf_engine.py): one thread decodes 1.05-1.35x faster than two; under heavier
# load a seeded rollout batch took 160 s on two threads, 45 s on one. With 4+ cores per process
# the rollout phase has the cores to itself (the learner waits for it): all of them are used.
MIN_CORES_FOR_THREADS = 4


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo is not readable: not Linux)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """The dtype for "auto": float32 on CPU, even with native bf16 (faster, but its log-probs are
    off-policy for an fp32 learner: HFBackendConfig.dtype), bfloat16 on an accelerator."""
    import torch

    if dtype != "auto":
        return getattr(torch, dtype)
    return torch.float32 if device.startswith("cpu") else torch.bfloat16


def load_remote_code_model(model_path: str, device: str, dtype: str) -> Any:
    """The policy with its repository's own code, on the device and dtype `HFBackend.__init__`
    resolves from the same settings."""
    from transformers import AutoModelForCausalLM

    device = resolve_device(device)
    return AutoModelForCausalLM.from_pretrained(
        model_path, dtype=resolve_dtype(dtype, device), trust_remote_code=True
    ).to(device)


def cores_per_process() -> int:
    """Cores this process may run on, shared among the ranks of this machine (LOCAL_WORLD_SIZE)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


def resolve_threads(threads: int | str, device: str) -> tuple[int | None, str]:
    """(intra-op threads for the model work or None to leave torch's setting, why)."""
    if threads != "auto":
        return int(threads), "rollout.hf.threads"
    if not device.startswith("cpu"):
        return None, "the model runs on an accelerator"
    cores = cores_per_process()
    if cores < MIN_CORES_FOR_THREADS:
        return 1, f"auto: {cores} core(s) per process, shared; one thread avoids OpenMP spin-waits"
    return cores, f"auto: {cores} cores per process"


def apply_worker_threads(executor: Any, n: int) -> None:
    """Run the model work of `executor` (one worker thread) on `n` intra-op threads, leaving the
    calling thread's count and the process default for new threads as they were."""
    import torch

    def set_here() -> None:
        # torch initialises a thread's count from the process default on the thread's first
        # parallel op (get_num_threads is one); a count set before that would be overwritten then.
        torch.get_num_threads()
        torch.set_num_threads(n)

    before = torch.get_num_threads()
    executor.submit(set_here).result()
    torch.set_num_threads(before)  # this thread's own count (unchanged) and the process default
