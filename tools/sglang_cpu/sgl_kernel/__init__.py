"""Stand-in for `sgl_kernel`, SGLang's compiled kernel package, on CPU-only test machines.

Why it exists: SGLang imports `sgl_kernel` at module level in many places, but its CPU build is
not published on PyPI and the PyPI wheels are CUDA-only. On a CPU without AMX, SGLang's CPU
engine (`SGLANG_USE_CPU_ENGINE=1`, `--attention-backend torch_native`) computes with native torch
ops and never calls a kernel, so the import only has to succeed.

Every attribute is a function that raises `NotImplementedError` naming the kernel when called:
if a code path ever needs a real kernel, the server fails at that call with a clear message
instead of computing something wrong. `scalar_type` holds the constants SGLang's quantization
code reads at import time.
"""

from __future__ import annotations

from typing import Any, Callable

__version__ = "0.0.0+cpu-test-standin"


def _missing(name: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but this sgl_kernel is the CPU test stand-in from "
            "tools/sglang_cpu (no compiled kernels). Run SGLang on a CUDA machine with the real "
            "sgl-kernel wheel, or keep to the CPU engine flags in the README."
        )

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def __getattr__(name: str) -> Any:
    # Dunder and private lookups (import machinery, pickling, introspection) must see a plain
    # module, not a fake kernel.
    if name.startswith("_"):
        raise AttributeError(name)
    return _missing(name)
