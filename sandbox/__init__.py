"""Isolated execution of model-written Python: local (default), Docker and e2b backends.

    async with make_sandbox(SandboxConfig()) as sb:
        async with sb.session() as s:          # stateful, like a notebook
            r = await s.run("x = 2")
            r = await s.run("print(x * 21)")   # r.status == "ok", r.stdout == "42\\n"

Backends register by name in SANDBOX_BACKENDS (sandbox/base.py); their modules load on the first
lookup and import their SDKs only when started, so `import sandbox` stays light (no numpy, docker
or e2b).
"""

from __future__ import annotations

from .base import SANDBOX_BACKENDS, ExecResult, ExecStatus, Limits, Sandbox, SandboxBase, SandboxError, Session
from .config import DockerConfig, E2BConfig, SandboxConfig
from .sync import SyncSandbox

__all__ = [
    "make_sandbox",
    "SANDBOX_BACKENDS",
    "SandboxBase",
    "SandboxConfig",
    "DockerConfig",
    "E2BConfig",
    "Limits",
    "ExecResult",
    "ExecStatus",
    "SandboxError",
    "SyncSandbox",
    "Sandbox",
    "Session",
]


def make_sandbox(cfg: SandboxConfig | None = None) -> Sandbox:
    """The backend named by cfg.backend (not started: use `async with`)."""
    cfg = cfg or SandboxConfig()
    return SANDBOX_BACKENDS.get(cfg.backend)(cfg)
