"""Isolated execution of model-written Python: local (default), Docker and e2b backends.

    async with make_sandbox(SandboxConfig()) as sb:
        async with sb.session() as s:          # stateful, like a notebook
            r = await s.run("x = 2")
            r = await s.run("print(x * 21)")   # r.status == "ok", r.stdout == "42\\n"

Backends are imported lazily, so `import sandbox` stays light (no numpy, docker or e2b).
"""

from __future__ import annotations

from .base import ExecResult, ExecStatus, Limits, Sandbox, SandboxError, Session
from .config import DockerConfig, E2BConfig, SandboxConfig
from .sync import SyncSandbox

__all__ = [
    "make_sandbox",
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
    if cfg.backend == "local":
        from .local import LocalSandbox

        return LocalSandbox(cfg)
    if cfg.backend == "docker":
        from .docker_backend import DockerSandbox

        return DockerSandbox(cfg)
    if cfg.backend == "e2b":
        from .e2b import E2BSandbox

        return E2BSandbox(cfg)
    raise ValueError(f"backend={cfg.backend!r}: must be one of 'local', 'docker', 'e2b'")
