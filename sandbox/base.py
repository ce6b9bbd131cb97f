"""Types shared by every backend: limits, results, errors, the Sandbox/Session protocols, the
backends' registry."""

from __future__ import annotations

import signal as _signal
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Any, AsyncContextManager, Protocol, runtime_checkable

from registry import Registry


@dataclass(frozen=True)
class Limits:
    """What one call (one cell) may use. Every backend enforces all of these or says which it cannot."""

    wall_time_s: float = 5.0  # per cell; a caller timeout may shorten it, never lengthen it
    memory_mb: int = 1024  # all processes of a session together (local: cgroup; docker: container)
    max_output_bytes: int = 65536  # per stream (stdout, stderr); exceeding it kills the cell
    disk_mb: int = 256  # size of the private writable directory (and the largest single file)
    max_processes: int = 64  # processes + threads alive at once in a session (fork bombs stop here)
    network: bool = False  # False: no network at all, loopback included. True: trusted code only
    # (local: the host's network namespace, loopback and abstract Unix sockets included)
    cpus: float = 1.0  # CPU quota of a session (local: cgroup cpu controller; docker: docker.cpus)

    def __post_init__(self) -> None:
        for name in ("wall_time_s", "memory_mb", "max_output_bytes", "disk_mb", "max_processes", "cpus"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name}={value!r}: must be > 0")

    def wall_time(self, timeout: float | None) -> float:
        """The effective wall-time limit: a caller timeout can only shorten the configured one."""
        if timeout is None or timeout <= 0:
            return self.wall_time_s
        return min(self.wall_time_s, float(timeout))


class ExecStatus(str, Enum):
    OK = "ok"  # the cell ran to the end (or exited with code 0)
    ERROR = "error"  # uncaught exception, syntax error or non-zero exit: the code's fault
    TIMEOUT = "timeout"  # killed at the wall-time limit
    OOM = "oom"  # killed by the memory limit (the kernel's OOM kill; e2b: its MemoryError report)
    KILLED = "killed"  # died from a signal it brought on itself (segfault, abort, ...)
    OUTPUT_LIMIT = "output_limit"  # killed for writing more than max_output_bytes
    SANDBOX_ERROR = "sandbox_error"  # the infrastructure failed; never the code's fault


@dataclass
class ExecResult:
    status: ExecStatus
    exit_code: int | None  # process-style: 0 ok, 1 uncaught exception, 128+N when killed by signal N
    signal: int | None  # the signal that ended the cell, if any
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    error: str = ""  # infrastructure detail (sandbox_error) or why we killed it; never the code's output

    @property
    def ok(self) -> bool:
        return self.status == ExecStatus.OK

    @classmethod
    def infra_failure(cls, error: str, duration_s: float = 0.0) -> ExecResult:
        return cls(ExecStatus.SANDBOX_ERROR, None, None, "", "", False, False, duration_s, error)

    @classmethod
    def cell_failure(cls, error: str, duration_s: float = 0.0) -> ExecResult:
        """The session's own code broke it (tampering, ending itself): failed code, never sandbox_error."""
        return cls(ExecStatus.ERROR, None, None, "", "", False, False, duration_s, error)


class SandboxError(Exception):
    """The infrastructure failed (worker, engine, transport). At the API boundary it becomes
    status=sandbox_error; it is never raised for anything the code under test did."""


def killed_status(sig: int, oom: bool) -> ExecStatus:
    """Status for a cell that ended by a signal we did not send."""
    if oom and sig == _signal.SIGKILL:
        return ExecStatus.OOM
    return ExecStatus.KILLED


class Session(Protocol):
    """One trajectory's interpreter: stateful (cells share `__main__`, like a notebook) or
    stateless (every cell in a fresh interpreter). Every failure comes back as a result."""

    async def run(self, code: str, timeout: float | None = None) -> ExecResult: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Session: ...

    async def __aexit__(self, *exc: object) -> None: ...


@runtime_checkable
class Sandbox(Protocol):
    """The contract every backend keeps, and every member its callers use (the trainer, the envs,
    the sync wrapper, preflight): nothing is probed with getattr.

    `info`: the effective isolation (what is enforced and, under "not_enforced", what is weaker
    than sandbox/README.md's table), known once started. `stats`: what the host discarded or
    killed over the sandbox's life (tampering, leftovers), so nothing is silent."""

    info: dict[str, Any]
    stats: dict[str, int]

    async def start(self) -> None: ...

    def session(self, stateless: bool = False) -> AsyncContextManager[Session]: ...

    async def run(self, code: str, timeout: float | None = None) -> ExecResult: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...


class SandboxBase(ABC):
    """The defaults a backend may keep: one-cell `run` in a fresh stateless session, `async with`
    as start/close, and empty `info`/`stats` until the backend fills them. Each backend writes
    `start`, `session` and `close` itself (abstract: a backend missing one cannot be built)."""

    def __init__(self) -> None:
        self.info: dict[str, Any] = {}  # filled by start(): the effective isolation
        self.stats: dict[str, int] = {}  # counters of what the host discarded or killed

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    def session(self, stateless: bool = False) -> AsyncContextManager[Session]: ...

    @abstractmethod
    async def close(self) -> None: ...

    async def run(self, code: str, timeout: float | None = None) -> ExecResult:
        """One cell in a fresh interpreter (a stateless session opened and closed around it)."""
        async with self.session(stateless=True) as s:
            return await s.run(code, timeout)

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# Backends by name: each registers its class where it is defined (`@SANDBOX_BACKENDS.register`);
# `sandbox.backend` is checked against it and `make_sandbox` looks it up. The defining modules are
# light to import: the Docker and e2b SDKs load only when such a sandbox starts.
SANDBOX_BACKENDS: Registry[type[SandboxBase]] = Registry(
    "sandbox backend", load=("sandbox.local", "sandbox.docker.backend", "sandbox.e2b")
)
